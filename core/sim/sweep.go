package sim

import "github.com/kvfence/kvfence/core/knownunsafe"

// Summary is a sweep of one variant over many seeds.
type Summary struct {
	Variant    string
	Seeds      int
	Steps      int
	Violations int
	First      *Violation // the first violating seed, with its trace
	Handoffs   int
	Released   [5]int
	Fenced     int
	LateWrites int
	Rogue      int // a lying rank's writes after its DrainAck, landed in held memory

	TargetRestarts, RestartFailed int // restart fence: restarts, live exposures they failed
}

// Sweep runs seeds [from, from+n) of one variant. With stopAtFirst it stops
// at the first violation (enough to show that the checker catches it).
func Sweep(v knownunsafe.Variant, from uint64, n int, stopAtFirst bool) Summary {
	return SweepTweaked(v, from, n, stopAtFirst, nil)
}

// SweepTweaked is Sweep with every drawn profile changed by tweak first.
func SweepTweaked(v knownunsafe.Variant, from uint64, n int, stopAtFirst bool, tweak func(*Profile)) Summary {
	s := Summary{Variant: v.Name()}
	for i := 0; i < n; i++ {
		r := Run(Config{Seed: from + uint64(i), Variant: v, Tweak: tweak})
		s.Seeds++
		s.Steps += r.Steps
		s.Handoffs += r.Handoffs
		s.Fenced += r.FencedWrites
		s.LateWrites += r.LateWrites
		s.Rogue += r.RogueWrites
		s.TargetRestarts += r.TargetRestarts
		s.RestartFailed += r.RestartFailed
		for p := range r.Released {
			s.Released[p] += r.Released[p]
		}
		if r.Violation != nil {
			s.Violations++
			if s.First == nil {
				s.First = r.Violation
			}
			if stopAtFirst {
				break
			}
		}
	}
	return s
}
