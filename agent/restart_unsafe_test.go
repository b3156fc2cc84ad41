//go:build kvfenceunsafe

package agent

import (
	"testing"
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

// The control arm of TestRestartFenceEndsHoldOfKilledUnboundedWriter and
// TestRestartFenceVendorFakes: the known-unsafe core releases the
// instance's holds when the restart is asked for, before the reap. The
// writer's bytes still reach the old instance in between and land in the
// freed slot, and the content check sees them
// (go test -tags kvfenceunsafe ./agent -run ControlReleaseBeforeReap).
func TestRestartFenceControlReleaseBeforeReap(t *testing.T) {
	if err := knownunsafe.SelectForAgents(knownunsafe.ReleaseBeforeReap.Name()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = knownunsafe.SelectForAgents("safe") })
	for _, backend := range []func(*testing.T) restartBackend{
		func(*testing.T) restartBackend { return maskedTCP(200 * time.Millisecond) },
		func(t *testing.T) restartBackend { return mooncakeFake.backend(t, 200*time.Millisecond) },
		func(t *testing.T) restartBackend { return nixlFake.backend(t, 200*time.Millisecond) },
	} {
		be := backend(t)
		t.Run(be.name, func(t *testing.T) {
			run := runRestartScenario(t, 1, be)
			s := run.stats
			t.Logf("release-before-reap over %s: released %v, writes into free memory %d, corrupt pages %d", be.name, s.Released, s.FreeWrites, s.CorruptPages)
			if s.Released["unsafe"] < 1 {
				t.Fatalf("the unsafe variant did not release early: %v", s.Released)
			}
			if s.FreeWrites == 0 {
				t.Fatalf("no write landed in the slot released before the reap: the test cannot tell the unsafe variant apart")
			}
		})
	}
}
