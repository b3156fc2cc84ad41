package sim

import (
	"flag"
	"reflect"
	"testing"

	"github.com/kvfence/kvfence/internal/knownunsafe"
)

var (
	seeds      = flag.Int("sim.seeds", 300, "seeds of the real core to simulate (make test uses 10000)")
	firstSeed  = flag.Uint64("sim.from", 1, "first seed")
	maxToCatch = flag.Int("sim.catch", 3000, "seeds within which every unsafe variant must be caught")
)

// TestSimSafe: the real core shows no violation of I1–I7 on any seed.
func TestSimSafe(t *testing.T) {
	s := Sweep(knownunsafe.Safe, *firstSeed, *seeds, false)
	t.Logf("safe: %d seeds, %d steps, %d handoffs, releases drained/fenced/timeout/completed %v, %d late writes held, %d fenced writes",
		s.Seeds, s.Steps, s.Handoffs, s.Released[:4], s.LateWrites, s.Fenced)
	if s.Violations > 0 {
		t.Fatalf("%d of %d seeds violate an invariant; first:\n%s", s.Violations, s.Seeds, s.First)
	}
	if s.LateWrites == 0 || s.Released[0] == 0 || s.Released[1] == 0 || s.Released[2] == 0 {
		t.Fatalf("the sweep never exercised late writes or every release path: %+v", s)
	}
}

// TestSimCatchesEveryUnsafeVariant: a checker that cannot fail proves
// nothing, so each known-unsafe variant must be caught within the bound.
func TestSimCatchesEveryUnsafeVariant(t *testing.T) {
	for _, v := range knownunsafe.All {
		v := v
		t.Run(v.Name(), func(t *testing.T) {
			s := Sweep(v, 1, *maxToCatch, true)
			if s.First == nil {
				t.Fatalf("no violation within %d seeds", s.Seeds)
			}
			t.Logf("caught at seed %d (%s): %s", s.First.Seed, s.First.Invariant, s.First.What)
		})
	}
}

// TestSimReplaysExactly: the same seed gives the same run, event for event,
// so a printed seed reproduces a violation.
func TestSimReplaysExactly(t *testing.T) {
	for _, v := range []knownunsafe.Variant{knownunsafe.Safe, knownunsafe.ReleaseOnAbort} {
		for seed := uint64(1); seed <= 20; seed++ {
			a := Run(Config{Seed: seed, Variant: v, Trace: true, TraceLen: 1 << 20})
			b := Run(Config{Seed: seed, Variant: v, Trace: true, TraceLen: 1 << 20})
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("%s seed %d: two runs differ", v.Name(), seed)
			}
		}
	}
}

// TestViolationCarriesTrace: a violation names its seed and the events
// before it.
func TestViolationCarriesTrace(t *testing.T) {
	s := Sweep(knownunsafe.ReleaseOnAbort, 1, 100, true)
	if s.First == nil || len(s.First.Trace) == 0 || s.First.Seed == 0 {
		t.Fatalf("violation without seed or trace: %+v", s.First)
	}
	r := Run(Config{Seed: s.First.Seed, Variant: knownunsafe.ReleaseOnAbort})
	if r.Violation == nil || r.Violation.What != s.First.What {
		t.Fatalf("seed %d did not replay its violation", s.First.Seed)
	}
}
