package sim

import (
	"fmt"
	"strings"
)

// Violation is one broken invariant, with the seed that replays it.
type Violation struct {
	Seed      uint64
	Invariant string // "I1".."I7"
	At        int64  // virtual time, ns
	What      string
	Trace     []string // the events before it (only when tracing)
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %s violated at t=%dus: %s", v.Seed, v.Invariant, v.At/1000, v.What)
	if len(v.Trace) > 0 {
		b.WriteString("\ntrace (replay with the same seed):\n")
		for _, l := range v.Trace {
			b.WriteString("  " + l + "\n")
		}
	}
	return b.String()
}

// Result is what one seed's run did.
type Result struct {
	Seed      uint64
	Profile   Profile
	Steps     int
	Violation *Violation

	Requests, Handoffs, Aborts int
	Released                   [5]int // by core.ReleasePath
	FencedWrites               int    // writes dropped by a revoked key
	LateWrites                 int    // writes that landed after their tag stopped (held memory)
	RogueWrites                int    // a lying rank's writes after its DrainAck that landed (in held memory)
	MaxHoldNs                  int64
	TargetRestarts             int // restart fence: target instances restarted
	RestartFailed              int // live exposures those restarts failed (blast radius)
}
