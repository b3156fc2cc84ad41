//go:build kvfenceunsafe

package agent

import (
	"testing"

	"github.com/kvfence/kvfence/internal/knownunsafe"
)

// The control arm of TestRestartFenceEndsHoldOfKilledUnboundedWriter: the
// known-unsafe core releases the instance's holds when the restart is asked
// for, before the reap. The writer's bytes still reach the old instance in
// between and land in the freed slot, and the content check sees them
// (go test -tags kvfenceunsafe ./agent -run ControlReleaseBeforeReap).
func TestRestartFenceControlReleaseBeforeReap(t *testing.T) {
	if err := knownunsafe.SelectForAgents(knownunsafe.ReleaseBeforeReap.Name()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = knownunsafe.SelectForAgents("safe") })
	run := runRestartScenario(t, 1)
	s := run.stats
	t.Logf("release-before-reap: released %v, writes into free memory %d, corrupt pages %d", s.Released, s.FreeWrites, s.CorruptPages)
	if s.Released["unsafe"] < 1 {
		t.Fatalf("the unsafe variant did not release early: %v", s.Released)
	}
	if s.FreeWrites == 0 {
		t.Fatalf("no write landed in the slot released before the reap: the test cannot tell the unsafe variant apart")
	}
}
