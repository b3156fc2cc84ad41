package conformance_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/conformance"
)

// Issue 23 item 2, with a real plugin process: the decoy-indoubt variant
// of the TCP plugin keeps an idle decoy connection through the in-path
// proxy while its data goes straight to the target's data port, and
// reports the suite's fault writes InDoubt (Quiesce covering them), and
// refuses the Quiesce asked at once under a stall. Before the reached
// guard covered InDoubt, four proxy link checks passed, and before it
// covered a refused Quiesce, link-stalled-quiesce-at-once passed; each
// must now be NOT RUN (the run partial, no certificate), never a pass.
func TestDecoyInDoubtPassesNoLinkFault(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	direct := ln.Addr().String()
	_ = ln.Close() // the target plugin listens there (the probe process first, then the session's)
	cfg := testConfig(unsafeBin, "KVFENCE_TCP_UNSAFE=decoy-indoubt",
		// the decoy never handshakes: the target must not close it
		"KVFENCE_TCP_HANDSHAKE_TIMEOUT=10m", "KVFENCE_TCP_FIRST_WRITE_TIMEOUT=10m")
	cfg.TargetEnv = []string{"KVFENCE_TCP_LISTEN=" + direct}
	cfg.InitiatorEnv = []string{"KVFENCE_TCP_UNSAFE_DIRECT=" + direct}
	// Only the honesty group: it uses the one session pair. (Its
	// target-killed check restarts the target on the fixed port and may
	// fail to bind; that failure is the fixed port's, and not asserted.)
	cfg.Groups = []string{"failure-honesty"}
	r := conformance.Certify(context.Background(), cfg)
	for _, f := range r.Failures() {
		t.Log(f)
	}
	if r.Certified {
		t.Fatal("the decoy variant was certified")
	}
	checked := 0
	for _, g := range r.Groups {
		for _, c := range g.Results {
			if !strings.HasPrefix(c.Check, "link-") {
				continue
			}
			checked++
			t.Logf("%s/%s: %s %s %v", g.Name, c.Check, c.Outcome, c.Reason, c.Notes)
			if c.Outcome == conformance.Pass {
				t.Errorf("%s/%s passed, but the fault never met the decoy variant's data: %v", g.Name, c.Check, c.Notes)
			}
			if c.Outcome == conformance.Skip && !strings.Contains(c.Reason, "proxy") {
				t.Errorf("%s/%s NOT RUN for another reason: %s", g.Name, c.Check, c.Reason)
			}
		}
	}
	if checked == 0 {
		t.Fatalf("no link check ran:\n%s", r.Markdown())
	}
}
