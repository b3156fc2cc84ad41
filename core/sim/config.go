package sim

import (
	"math/rand/v2"
	"time"

	"github.com/kvfence/kvfence/core/knownunsafe"
	// The simulation runs every known-unsafe variant in every build (it
	// moves no real memory): it links their policies.
	_ "github.com/kvfence/kvfence/internal/unsafecore"
)

// Timing of the simulated cluster, in nanoseconds of virtual time.
const (
	maxTail     = int64(300 * time.Microsecond) // decode's own transport
	maxRankTail = 4 * maxTail                   // the longest a prefill rank's transport declares
	lease       = int64(1 * time.Millisecond)
	maxHold     = int64(8 * time.Millisecond)
	maxSkew     = int64(40 * time.Microsecond)
	tickEvery   = int64(100 * time.Microsecond)
	heartbeat   = int64(250 * time.Microsecond)
	deadAfter   = int64(1 * time.Millisecond) // failure detector delay
	runLimit    = int64(400 * time.Millisecond)
	retryAdmit  = int64(200 * time.Microsecond)
	maxAttempts = 40
)

// Profile is one seed's cluster and fault mix, drawn from the seed so that
// thousands of seeds cover many combinations.
type Profile struct {
	Prefill, Decode int // ranks
	Slots           int // per decode rank (tiny: freed slots are reused at once)
	Rooms           int // room id space (small: ids are reused)
	Requests        int
	MaxPages        int
	FanOutAll       float64 // share of requests sent to every decode rank (MLA)

	Loss, Dup, Slow float64 // control messages
	Partition       bool    // a window where one decode↔prefill control link drops everything

	Definite, Timeout, Resend float64 // per batch: FailedDefinite, InDoubt early, InDoubt then resend

	Abort, Truncate, RejectP, SlowPrefill float64 // per request
	Storms                                int
	CrashRank, RestartDecode              bool
	CanRevoke, EagerRevoke                bool
	MaxInflight, MaxBatch                 int
	// Tails is each prefill rank's transport tail (ns), declared to decode
	// (RankTail): a write's tail is the writer's, and may exceed decode's.
	Tails []int64
	// Liar is the index of a prefill rank that lies (-1: none): its
	// DrainAcks are sent as the honest core says, but it keeps writing
	// under the tag for up to LieFor ns afterwards (a buggy or hostile
	// rank). Only drawn with a fence: without one no receiver can stop it
	// (docs/failure-paths.md).
	Liar   int
	LieFor int64

	// The restart fence (restart.go), drawn only without a revoking
	// transport: Targets target instances per decode rank (0: no restart
	// fence), restarted after a hold of RestartAfter ns, reaped ReapDelay
	// ns after the request. Unbounded is a prefill rank (-1: none) whose
	// transport declares an unbounded tail and really lands that late.
	Targets                 int
	RestartAfter, ReapDelay int64
	Unbounded               int

	// Unisolated marks the prefill ranks (drawn only with EagerRevoke)
	// that declare their refused writes may fail their neighbours
	// (RankRefusals): their exposures are revoked after the drain, the
	// others' at the abort, in one run.
	Unisolated []bool
}

func drawProfile(rng *rand.Rand) Profile {
	p := Profile{
		Prefill:     1 + rng.IntN(2),
		Decode:      1 + rng.IntN(2),
		Slots:       3 + rng.IntN(6),
		Rooms:       2 + rng.IntN(5),
		Requests:    12 + rng.IntN(20),
		MaxPages:    1 + rng.IntN(4),
		FanOutAll:   rng.Float64(),
		Loss:        pick(rng, 0, 0.02, 0.1, 0.25),
		Dup:         pick(rng, 0, 0.05, 0.2),
		Slow:        pick(rng, 0, 0.05, 0.2),
		Partition:   rng.IntN(2) == 0,
		Definite:    pick(rng, 0, 0.03, 0.1),
		Timeout:     pick(rng, 0, 0.05, 0.2),
		Resend:      pick(rng, 0, 0.03, 0.1),
		Abort:       pick(rng, 0.05, 0.2, 0.5),
		Truncate:    pick(rng, 0, 0.1, 0.3),
		RejectP:     pick(rng, 0, 0.05, 0.2),
		SlowPrefill: pick(rng, 0.1, 0.3, 0.6),
		Storms:      rng.IntN(3),
		CrashRank:   rng.IntN(5) == 0,
		CanRevoke:   rng.IntN(2) == 0,
		EagerRevoke: rng.IntN(2) == 0,
		MaxInflight: 1 + rng.IntN(4),
		MaxBatch:    1 + rng.IntN(2),
	}
	p.RestartDecode = rng.IntN(4) == 0
	for i := 0; i < p.Prefill; i++ {
		p.Tails = append(p.Tails, int64(pick(rng, 0.5, 1, 2, 4)*float64(maxTail)))
	}
	p.Liar = -1
	if p.CanRevoke && rng.IntN(3) == 0 {
		p.Liar = rng.IntN(p.Prefill)
		p.LieFor = int64(pick(rng, 0.5, 2, 4) * float64(lease))
	}
	return p
}

func pick(rng *rand.Rand, xs ...float64) float64 { return xs[rng.IntN(len(xs))] }

// Config selects one run.
type Config struct {
	Seed    uint64
	Variant knownunsafe.Variant
	Trace   bool // keep a trace of the run (used to replay a violation)
	// TraceLen is how many trailing events a trace keeps (default 60).
	TraceLen int
	// Tweak, if set, changes the drawn profile before the run (tests that
	// force one fault, such as a lying rank without a fence).
	Tweak func(*Profile)
}

func tdur(ns int64) time.Duration { return time.Duration(ns) }
