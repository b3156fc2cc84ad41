package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
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
}

type simReport struct {
	FirstSeed uint64             `json:"first_seed"`
	Variants  []simVariantResult `json:"variants"`
}

func init() { register(newSimCommand) }

func newSimCommand() *cobra.Command {
	var (
		seeds    int
		from     uint64
		variants []string
		asJSON   bool
		replay   uint64
		stopAt   bool
	)
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
			vs, err := parseVariants(variants)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if replay != 0 {
				if len(vs) != 1 {
					return fmt.Errorf("invalid argument: --replay needs exactly one --variant")
				}
				r := sim.Run(sim.Config{Seed: replay, Variant: vs[0], Trace: true, TraceLen: 200})
				fmt.Fprintf(out, "seed %d, variant %s: %d steps, profile %+v\n", replay, vs[0].Name(), r.Steps, r.Profile)
				if r.Violation == nil {
					fmt.Fprintln(out, "no violation")
					return nil
				}
				fmt.Fprintln(out, r.Violation)
				return nil
			}
			if seeds <= 0 {
				return fmt.Errorf("invalid argument: --seeds must be positive, got %d", seeds)
			}
			rep := simReport{FirstSeed: from}
			for _, v := range vs {
				start := time.Now()
				s := sim.Sweep(v, from, seeds, stopAt && !v.IsSafe())
				r := simVariantResult{Name: s.Variant, Seeds: s.Seeds, Steps: s.Steps, Violations: s.Violations,
					Handoffs: s.Handoffs, ReleasedDrained: s.Released[0], ReleasedFenced: s.Released[1],
					ReleasedTimeout: s.Released[2], ReleasedCompleted: s.Released[3],
					LateWritesHeld: s.LateWrites, FencedWrites: s.Fenced, Seconds: time.Since(start).Seconds()}
				if s.First != nil {
					r.FirstViolatingSeed = s.First.Seed
					r.FirstViolation = s.First.Invariant + ": " + s.First.What
				}
				rep.Variants = append(rep.Variants, r)
			}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			printSimTable(out, rep)
			for _, r := range rep.Variants {
				if r.Name == "safe" && r.Violations > 0 {
					return fmt.Errorf("the real core violated an invariant: replay with --replay %d --variant safe", r.FirstViolatingSeed)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&seeds, "seeds", 2000, "seeds per variant")
	f.Uint64Var(&from, "from", 1, "first seed")
	f.StringSliceVar(&variants, "variant", nil, "variants to run (default: safe and every unsafe variant): "+strings.Join(variantNames(), ", "))
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	f.Uint64Var(&replay, "replay", 0, "replay one seed with its trace (needs one --variant)")
	f.BoolVar(&stopAt, "stop-at-first", false, "stop an unsafe variant's sweep at its first violation")
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

func printSimTable(w io.Writer, rep simReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "variant\tseeds\tsteps\tviolations\tfirst violating seed\tdrained\tfenced\ttimeout\tlate writes held\tfirst violation")
	for _, r := range rep.Variants {
		first := "-"
		if r.FirstViolatingSeed != 0 {
			first = fmt.Sprint(r.FirstViolatingSeed)
		}
		what := r.FirstViolation
		if len(what) > 90 {
			what = what[:90] + "…"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%s\n", r.Name, r.Seeds, r.Steps, r.Violations, first,
			r.ReleasedDrained, r.ReleasedFenced, r.ReleasedTimeout, r.LateWritesHeld, what)
	}
	tw.Flush()
}
