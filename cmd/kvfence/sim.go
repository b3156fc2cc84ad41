package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/core/sim"
)

type simVariantResult struct {
	Name               string  `json:"name"`
	Seeds              int     `json:"seeds"`
	Steps              int     `json:"steps"`
	Violations         int     `json:"violations"`
	FirstViolatingSeed uint64  `json:"first_violating_seed,omitempty"`
	FirstViolation     string  `json:"first_violation,omitempty"`
	Handoffs           int     `json:"handoffs"`
	ReleasedDrained    int     `json:"released_drained"`
	ReleasedFenced     int     `json:"released_fenced"`
	ReleasedTimeout    int     `json:"released_timeout"`
	ReleasedCompleted  int     `json:"released_completed"`
	LateWritesHeld     int     `json:"late_writes_held"`
	FencedWrites       int     `json:"fenced_writes"`
	Seconds            float64 `json:"seconds"`
	// Uncaught: a known-unsafe variant that showed no violation in the
	// seeds given (the checker did not catch it there).
	Uncaught bool `json:"uncaught,omitempty"`
}

type simReport struct {
	FirstSeed uint64             `json:"first_seed"`
	Variants  []simVariantResult `json:"variants"`
}

func init() { register(newSimCommand) }

func newSimCommand() *cobra.Command {
	var sf simFlags
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run an abort storm in deterministic simulation for the real core and every known-unsafe variant",
		Long: `sim simulates whole clusters (router, prefill ranks, decode ranks, lossy control
network, a transport whose writes outlive their errors, crashes, restarts, reused
room ids, tiny pools) over many seeds, checking invariants I1-I7 on every step.
The real core ("safe") must show no violation; every known-unsafe variant must.
A violation prints its seed: --replay SEED --variant NAME shows its trace.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSim(cmd.OutOrStdout(), sf)
		},
	}
	f := cmd.Flags()
	f.IntVar(&sf.seeds, "seeds", 2000, "seeds per variant")
	f.Uint64Var(&sf.from, "from", 1, "first seed")
	f.StringSliceVar(&sf.variants, "variant", nil, "variants to run (default: safe and every unsafe variant): "+strings.Join(variantNames(), ", "))
	f.BoolVar(&sf.asJSON, "json", false, "print one JSON object instead of a table")
	f.Uint64Var(&sf.replay, "replay", 0, "replay one seed with its trace (needs one --variant)")
	f.BoolVar(&sf.stopAt, "stop-at-first", false, "stop an unsafe variant's sweep at its first violation")
	return cmd
}

func variantNames() []string {
	names := []string{"safe"}
	for _, v := range knownunsafe.All {
		names = append(names, v.Name())
	}
	return names
}

func parseVariants(names []string) ([]knownunsafe.Variant, error) {
	if len(names) == 0 {
		return append([]knownunsafe.Variant{knownunsafe.Safe}, knownunsafe.All...), nil
	}
	var vs []knownunsafe.Variant
	for _, n := range names {
		v, ok := knownunsafe.Parse(n)
		if !ok {
			return nil, fmt.Errorf("invalid argument: unknown variant %q (known: %s)", n, strings.Join(variantNames(), ", "))
		}
		vs = append(vs, v)
	}
	return vs, nil
}

// sweepOne is sweepVariant; the streaming test watches it.
var sweepOne = sweepVariant

// sweepVariant runs one variant's seeds (an unsafe one stops at its first
// violation with stopAt).
func sweepVariant(v knownunsafe.Variant, from uint64, seeds int, stopAt bool) simVariantResult {
	start := time.Now()
	s := sim.Sweep(v, from, seeds, stopAt && !v.IsSafe())
	r := simVariantResult{Name: s.Variant, Seeds: s.Seeds, Steps: s.Steps, Violations: s.Violations,
		Handoffs: s.Handoffs, ReleasedDrained: s.Released[0], ReleasedFenced: s.Released[1],
		ReleasedTimeout: s.Released[2], ReleasedCompleted: s.Released[3],
		LateWritesHeld: s.LateWrites, FencedWrites: s.Fenced, Seconds: time.Since(start).Seconds(),
		Uncaught: !v.IsSafe() && s.Violations == 0}
	if s.First != nil {
		r.FirstViolatingSeed = s.First.Seed
		r.FirstViolation = s.First.Invariant + ": " + s.First.What
	}
	return r
}

// simTable prints the sweep's rows as they come, in columns fixed up
// front (a tabwriter would hold every row until the end).
type simTable struct {
	w    io.Writer
	name int // width of the variant column
}

const simRowFormat = "%-*s  %6s  %8s  %10s  %20s  %7s  %6s  %7s  %16s  %s\n"

func newSimTable(w io.Writer, vs []knownunsafe.Variant) *simTable {
	t := &simTable{w: w, name: len("variant")}
	for _, v := range vs {
		t.name = max(t.name, len(v.Name()))
	}
	fmt.Fprintf(w, simRowFormat, t.name, "variant", "seeds", "steps", "violations", "first violating seed",
		"drained", "fenced", "timeout", "late writes held", "first violation")
	return t
}

func (t *simTable) row(r simVariantResult) {
	first := "-"
	if r.FirstViolatingSeed != 0 {
		first = fmt.Sprint(r.FirstViolatingSeed)
	}
	what := r.FirstViolation
	if len(what) > 90 {
		what = what[:90] + "…"
	}
	n := fmt.Sprint
	fmt.Fprintf(t.w, simRowFormat, t.name, r.Name, n(r.Seeds), n(r.Steps), n(r.Violations), first,
		n(r.ReleasedDrained), n(r.ReleasedFenced), n(r.ReleasedTimeout), n(r.LateWritesHeld), what)
}

// printUncaught says plainly which known-unsafe variants the seeds given
// did not catch: a 0 in the table is easy to read as "fine".
func printUncaught(w io.Writer, rep simReport) {
	for _, r := range rep.Variants {
		if r.Uncaught {
			fmt.Fprintf(w, "UNCAUGHT: known-unsafe variant %s showed no violation in %d seeds from %d; run more seeds (--seeds) or another range (--from)\n",
				r.Name, r.Seeds, rep.FirstSeed)
		}
	}
}

// simFlags are kvfence sim's flags.
type simFlags struct {
	seeds    int
	from     uint64
	variants []string
	asJSON   bool
	replay   uint64
	stopAt   bool
}

// runSim is kvfence sim: one seed replayed with its trace (--replay), or
// a sweep of every variant asked for; it fails if the real core violated
// an invariant.
func runSim(out io.Writer, f simFlags) error {
	vs, err := parseVariants(f.variants)
	if err != nil {
		return usageError{err}
	}
	if f.replay != 0 {
		return replaySim(out, f.replay, vs)
	}
	if f.seeds <= 0 {
		return usagef("invalid argument: --seeds must be positive, got %d", f.seeds)
	}
	rep := simReport{FirstSeed: f.from}
	var table *simTable
	if !f.asJSON {
		table = newSimTable(out, vs)
	}
	for _, v := range vs {
		r := sweepOne(v, f.from, f.seeds, f.stopAt)
		rep.Variants = append(rep.Variants, r)
		if table != nil {
			table.row(r) // as each sweep ends: a long run shows progress
		}
	}
	if f.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printUncaught(out, rep)
	for _, r := range rep.Variants {
		if r.Name == "safe" && r.Violations > 0 {
			return fmt.Errorf("the real core violated an invariant: replay with --replay %d --variant safe", r.FirstViolatingSeed)
		}
	}
	return nil
}

// replaySim runs one seed of one variant with its trace.
func replaySim(out io.Writer, seed uint64, vs []knownunsafe.Variant) error {
	if len(vs) != 1 {
		return usagef("invalid argument: --replay needs exactly one --variant")
	}
	r := sim.Run(sim.Config{Seed: seed, Variant: vs[0], Trace: true, TraceLen: 200})
	fmt.Fprintf(out, "seed %d, variant %s: %d steps, profile %+v\n", seed, vs[0].Name(), r.Steps, r.Profile)
	if r.Violation == nil {
		fmt.Fprintln(out, "no violation")
		return nil
	}
	fmt.Fprintln(out, r.Violation)
	return nil
}
