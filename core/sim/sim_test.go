package sim

import (
	"flag"
	"reflect"
	"testing"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

var (
	seeds      = flag.Int("sim.seeds", 300, "seeds of the real core to simulate (make test uses 10000)")
	firstSeed  = flag.Uint64("sim.from", 1, "first seed")
	maxToCatch = flag.Int("sim.catch", 3000, "seeds within which every unsafe variant must be caught")
)

// TestSimSafe: the real core shows no violation of I1–I7 on any seed.
func TestSimSafe(t *testing.T) {
	s := Sweep(knownunsafe.Safe, *firstSeed, *seeds, false)
	t.Logf("safe: %d seeds, %d steps, %d handoffs, releases drained/fenced/timeout/completed %v, %d late writes held, %d fenced writes, %d lying-rank writes held, %d target restarts",
		s.Seeds, s.Steps, s.Handoffs, s.Released[:4], s.LateWrites, s.Fenced, s.Rogue, s.TargetRestarts)
	if s.Violations > 0 {
		t.Fatalf("%d of %d seeds violate an invariant; first:\n%s", s.Violations, s.Seeds, s.First)
	}
	if s.LateWrites == 0 || s.Rogue == 0 || s.Released[0] == 0 || s.Released[1] == 0 || s.Released[2] == 0 {
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

// liar makes prefill rank 0 lie on every seed: it keeps writing for two
// leases after each DrainAck.
func liar(fence bool) func(*Profile) {
	return func(p *Profile) {
		p.CanRevoke, p.Liar, p.LieFor = fence, 0, 2*lease
	}
}

// TestSimLyingRankFenced: with a fence, a rank that acks its drain and keeps
// writing never writes into released memory (finding 2 of issue 15), and
// the release-on-drain-ack variant (slots back on the acks, before the
// revoke) is caught.
func TestSimLyingRankFenced(t *testing.T) {
	n := min(*seeds, 1000)
	s := SweepTweaked(knownunsafe.Safe, *firstSeed, n, false, liar(true))
	t.Logf("safe with a lying rank: %d seeds, %d of its writes held, %d fenced, releases drained/fenced/timeout/completed %v",
		s.Seeds, s.Rogue, s.Fenced, s.Released[:4])
	if s.Violations > 0 {
		t.Fatalf("%d of %d seeds violate an invariant; first:\n%s", s.Violations, s.Seeds, s.First)
	}
	if s.Rogue == 0 || s.Fenced == 0 {
		t.Fatalf("the lying rank never wrote after its ack, or no write was fenced: %+v", s)
	}
	u := SweepTweaked(knownunsafe.ReleaseOnDrainAck, 1, 200, true, liar(true))
	if u.First == nil || u.First.Invariant != "I1" {
		t.Fatalf("release-on-drain-ack not caught as I1 within %d seeds: %+v", u.Seeds, u.First)
	}
	t.Logf("release-on-drain-ack caught at seed %d: %s", u.First.Seed, u.First.What)
}

// TestSimLyingRankWithoutFence documents the limit: without a fence the
// receiver has only the ranks' word, and a lying rank writes into memory
// that was released on its ack (docs/failure-paths.md says so).
func TestSimLyingRankWithoutFence(t *testing.T) {
	s := SweepTweaked(knownunsafe.Safe, 1, 200, true, liar(false))
	if s.First == nil || s.First.Invariant != "I1" {
		t.Fatalf("a lying rank without a fence was never caught writing into released memory in %d seeds: the sim's liar is too weak", s.Seeds)
	}
	t.Logf("without a fence, a lying rank breaks I1 at seed %d: %s", s.First.Seed, s.First.What)
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

// restartFenced forces the restart fence on every seed: no revoking
// transport, several target instances, and prefill rank 0 declaring an
// unbounded tail (its bytes really land up to eight leases late).
func restartFenced(targets int) func(*Profile) {
	return func(p *Profile) {
		p.CanRevoke, p.Liar, p.RestartDecode = false, -1, false
		p.Targets, p.RestartAfter, p.ReapDelay = targets, lease, lease/5
		p.Unbounded = 0
		p.Tails[0] = unboundedSpread
	}
}

// TestSimRestartFence: with a transport that cannot revoke and a writer
// whose tail is unbounded, holds end by restarting the target instance and
// the safe core shows no violation; releasing before the reap is caught.
func TestSimRestartFence(t *testing.T) {
	n := min(*seeds, 1000)
	s := SweepTweaked(knownunsafe.Safe, *firstSeed, n, false, restartFenced(2))
	t.Logf("safe with the restart fence: %d seeds, %d restarts failing %d live exposures, %d writes dropped by a reap, %d late writes held, releases drained/fenced/timeout/completed %v",
		s.Seeds, s.TargetRestarts, s.RestartFailed, s.Fenced, s.LateWrites, s.Released[:4])
	if s.Violations > 0 {
		t.Fatalf("%d of %d seeds violate an invariant; first:\n%s", s.Violations, s.Seeds, s.First)
	}
	if s.TargetRestarts == 0 || s.Released[1] == 0 || s.Fenced == 0 {
		t.Fatalf("no restart, fenced release or write dropped by a reap: %+v", s)
	}
	u := SweepTweaked(knownunsafe.ReleaseBeforeReap, 1, 300, true, restartFenced(2))
	if u.First == nil || u.First.Invariant != "I1" {
		t.Fatalf("release-before-reap not caught as I1 within %d seeds: %+v", u.Seeds, u.First)
	}
	t.Logf("release-before-reap caught at seed %d: %s", u.First.Seed, u.First.What)
}

// TestSimRestartBlastRadius: more target instances per decode rank make one
// restart fail fewer live exposures (the same seeds, 1 to 4 instances).
func TestSimRestartBlastRadius(t *testing.T) {
	n := min(*seeds, 300)
	per := func(s Summary) float64 { return float64(s.RestartFailed) / float64(max(s.TargetRestarts, 1)) }
	var runs []Summary
	for targets := 1; targets <= 4; targets++ {
		s := SweepTweaked(knownunsafe.Safe, *firstSeed, n, false, restartFenced(targets))
		if s.Violations > 0 {
			t.Fatalf("%d instances: %d violations; first:\n%s", targets, s.Violations, s.First)
		}
		t.Logf("%d instance(s): %d restarts failed %d live exposures (%.2f per restart), %d handoffs over %d seeds",
			targets, s.TargetRestarts, s.RestartFailed, per(s), s.Handoffs, s.Seeds)
		runs = append(runs, s)
	}
	if runs[0].RestartFailed == 0 || per(runs[3]) >= per(runs[0]) {
		t.Fatalf("four instances did not shrink the blast radius: %+v vs %+v", runs[0], runs[3])
	}
}
