package conformance

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Issue 23 item 2, found certifying real Mooncake under --netns: a check
// whose batch stays in doubt (Quiesce gave no evidence) leaves bytes that
// may land during the next check on the same memory, and were judged as
// that check's ("Quiesce returned evidence, but bytes kept landing", the
// bytes of a batch two checks earlier). The next check must run on a fresh
// pair with memory of its own. Here the target is stopped while the TCP
// plugin is asked to Quiesce (no evidence: the receiver does not answer);
// on the old code the next check ran on the same pair.
func TestInDoubtLeftoversGetAFreshPair(t *testing.T) {
	ctx := context.Background()
	s := tcpSuite(t, 3*time.Second)
	old := s.main
	stop := stopFault(old.tgt)
	stop.underFault = true // Quiesce is asked while the target is stopped
	var first Result
	if err := old.honest(ctx, &first, stop, 256<<10, nil); err != nil {
		t.Fatalf("a stopped target: %v (%v)", err, first.Notes)
	}
	if !old.unsettled {
		t.Skipf("Quiesce obtained evidence from a stopped target (%v): nothing left in doubt to test with", first.Notes)
	}
	var ran *session
	next := check{name: "next", run: func(_ context.Context, s *suite, _ *Result) error { ran = s.main; return nil }}
	r := s.runCheck(ctx, group{name: "g"}, next)
	if r.Outcome != Pass || ran == nil {
		t.Fatalf("the next check: %s %s", r.Outcome, r.Reason)
	}
	if ran == old {
		t.Fatal("the next check ran on the pair whose batch is still in doubt")
	}
	if !strings.Contains(strings.Join(r.Notes, " "), "fresh plugin pair") {
		t.Errorf("the next check's notes do not say it ran on a fresh pair: %v", r.Notes)
	}
}
