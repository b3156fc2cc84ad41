package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvfence/kvfence/sdk/sdktest"
)

// Issue 23 item 2, the wiring: honest() must ask the fault's reached guard
// after a non-Succeeded outcome. The "fault" here is the target SIGSTOPped
// (so the TCP plugin reports InDoubt) whose reached guard says it touched
// nothing, as a proxy fault behind a decoy connection would: the check
// must come out NOT RUN (a skip), never a pass. Before the guard covered
// InDoubt, honest() returned nil here.
func TestHonestAsksReachedAfterInDoubt(t *testing.T) {
	ctx := context.Background()
	s := tcpSuite(t, 10*time.Second)
	se := s.main
	stop := stopFault(se.tgt)
	f := fault{name: "decoy", apply: stop.apply, release: stop.release,
		reached: func(uint64) error { return errSkip("the fault reached none of the write's bytes") }}
	var r Result
	err := se.honest(ctx, &r, f, 256<<10, nil)
	var sk skipError
	if !errors.As(err, &sk) {
		t.Fatalf("a non-Succeeded outcome (%v) under a fault that reached nothing: %v, want a skip (NOT RUN)", r.Notes, err)
	}
	t.Logf("%v -> %v", r.Notes, err)
}

// tcpSuite is a suite set up over loopback without the proxy for the
// reference TCP plugin with short windows, closed when t ends.
func tcpSuite(t *testing.T, completion time.Duration) *suite {
	t.Helper()
	bin, err := sdktest.BuildPlugin(t.TempDir(), "github.com/kvfence/kvfence/plugins/tcp/cmd/kvfence-plugin-tcp")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Plugin: bin, Env: []string{"KVFENCE_TCP_WRITE_TTL=1500ms", "KVFENCE_TCP_ACK_TIMEOUT=600ms"},
		MaxWriteSize: 1 << 20, GuardWindow: 400 * time.Millisecond, GuardFloor: 400 * time.Millisecond,
		CompletionTimeout: completion, Repeat: 1, PerfBytes: 1 << 20, Proxy: "off"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := setup(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s
}
