package knownunsafe_test

import (
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/errdefs"
)

// This test binary links the core but not internal/unsafecore, as a
// default build of the runtime does: a variant names a behaviour but
// carries none, and the core refuses to run it as the safe core under an
// unsafe name.
func TestUnlinkedVariantIsRefused(t *testing.T) {
	for _, v := range knownunsafe.All {
		if v.Policy() != nil {
			t.Fatalf("%s has a policy without internal/unsafecore", v.Name())
		}
	}
	cfg := core.SenderConfig{Session: 1, MaxInflight: 1, MaxBatchPages: 1, Heartbeat: time.Millisecond,
		RequestTombstone: time.Millisecond, BootstrapTimeout: time.Millisecond}
	if _, err := core.NewSender(cfg); err != nil {
		t.Fatalf("safe sender: %v", err)
	}
	cfg.Unsafe = knownunsafe.NoTombstones
	if _, err := core.NewSender(cfg); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("unlinked no-tombstones: %v, want FailedPrecondition", err)
	}
}
