package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/core/knownunsafe"
)

func init() { register(newBenchCommand) }

// benchOptions are kvfence bench's own flags (the run's sizes are the
// demo's options).
type benchOptions struct {
	reps        int
	fence       string
	scarce      bool
	checksumArm bool
	asJSON      bool
	keep        bool
	report      string
}

// kvfence bench: the cost of safety. Arms that differ only in the decode
// core (the real one vs the known-unsafe release-on-abort, which frees an
// aborted request's slots at once), each run as real processes with the
// same share of requests aborted mid-transfer; rep i runs every arm on seed
// i, in an order rotated each rep, so drift on a shared machine hits the
// arms alike and the comparison is paired.
func newBenchCommand() *cobra.Command {
	o := demoOptions{}
	b := benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "the cost of safety: throughput, held slot-seconds per abort and corrupt pages, safe core vs known-unsafe release-on-abort, with aborts",
		Long: `kvfence bench runs the demo's cluster (real rank and plugin processes, the
delaying proxy on the data path) once per arm and repetition. The arms differ
only in the decode core: "safe" holds an aborted request's slots until its
writes drained, were fenced or timed out; "release-on-abort" frees them at
once (what engines do today, and why late writes land in other requests'
pages). --abort-share of the requests are cancelled mid-transfer in every arm.
Rep i runs every arm on seed i, in an order rotated each rep.

It reports, per arm: throughput (higher is better) with a 95% CI, the paired
delta safe vs release-on-abort with its 95% CI and whether the CI spans 0,
held slot-seconds per abort, hold p50/p99 by release path, and corrupt pages
(the safe arm must show 0: it fails the command otherwise). --scarce shrinks
the decode pool to half the slots the concurrency asks for, where holds cost
admissions and so throughput.

The comparison arm is a known-unsafe core, which only a build with
-tags kvfenceunsafe contains; a default build refuses the command:

  go run -tags kvfenceunsafe ./cmd/kvfence bench --reps 5

Numbers from a shared or small machine are noisy: compare the ratios, and
read the CI.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := b.validate(&o, cmd.Flags().Changed("slots")); err != nil {
				return err
			}
			if err := o.validate(); err != nil {
				return err
			}
			if !knownunsafe.Compiled {
				return usagef("kvfence bench compares the safe core with the known-unsafe release-on-abort core, which this build leaves out; run it from a build with -tags kvfenceunsafe (go run -tags kvfenceunsafe ./cmd/kvfence bench)")
			}
			if err := o.choosePlugin(); err != nil { // plugin_flag.go
				return err
			}
			return runBench(cmd.Context(), o, b)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&b.reps, "reps", 5, "repetitions per arm (paired: rep i runs every arm on seed i)")
	fl.IntVar(&o.Requests, "requests", 512, "requests per run")
	fl.IntVar(&o.Concurrency, "concurrency", 128, "requests in flight")
	fl.IntVar(&o.MinPages, "min-pages", 4, "fewest pages per request")
	fl.IntVar(&o.MaxPages, "max-pages", 16, "most pages per request")
	fl.Float64Var(&o.AbortShare, "abort-share", 0.25, "share of requests cancelled mid-transfer, in every arm")
	fl.IntVar(&o.Slots, "slots", demoSlots, "decode KV slots")
	fl.BoolVar(&b.scarce, "scarce", false, "scarce slots: a decode pool half the size the concurrency asks for (concurrency × mean pages / 2), so held slots delay admissions")
	fl.StringVar(&b.fence, "fence", "off", "per-exposure keys with revocation in both arms: off (the cores alone) or on")
	fl.DurationVar(&o.PageEvery, "page-every", 8*time.Millisecond, "simulated prefill compute per page")
	fl.DurationVar(&o.DecodeFor, "decode-for", time.Second, "decode loop time per request (as the demo)")
	fl.DurationSliceVar(&o.Delays, "data-delay", []time.Duration{600 * time.Millisecond, time.Millisecond}, "delaying proxy delays")
	fl.Uint64Var(&o.Seed, "seed", 1, "seed of rep 1 (rep i uses seed+i-1 in every arm)")
	fl.BoolVar(&o.TLS, "tls", true, "mutual TLS on the control plane")
	fl.StringVar(&o.Plugin, "plugin", "", pluginFlagHelp+"; every rank of every arm loads it. Other than tcp: no delaying proxy")
	restartFenceFlags(fl, &o)
	fl.BoolVar(&b.asJSON, "json", false, "print one JSON object")
	fl.BoolVar(&b.checksumArm, "checksums", false, "add a third arm: safe with checksums at commit")
	fl.StringVar(&b.report, "report", "", "write an HTML report (charts) to this path")
	fl.BoolVar(&b.keep, "keep", false, "keep every repetition's run directory (logs, throwaway certificates)")
	cmd.AddCommand(newBenchBoundaryCommand())
	return cmd
}

// validate refuses nonsense in bench's own flags and applies --scarce.
func (b *benchOptions) validate(o *demoOptions, slotsSet bool) error {
	switch {
	case b.reps < 2 || b.reps > 1000:
		return usagef("--reps must be between 2 and 1000 (a CI needs two), got %d", b.reps)
	case b.fence != "on" && b.fence != "off":
		return usagef("--fence must be on or off, not %q", b.fence)
	case o.Slots < 1 || o.Slots > maxSlots:
		return usagef("--slots must be between 1 and %d, got %d", maxSlots, o.Slots)
	case b.scarce && slotsSet:
		return usagef("--scarce sizes the pool itself: give --scarce or --slots, not both")
	}
	if b.report != "" {
		if err := checkWritableFile(b.report); err != nil {
			return usagef("--report: %v", err)
		}
	}
	o.Fence = b.fence == "on"
	if b.scarce {
		o.Slots = max(o.MaxPages, o.Concurrency*(o.MinPages+o.MaxPages)/4)
	}
	return nil
}

// benchResult is what kvfence bench --json prints.
type benchResult struct {
	Reps        int     `json:"reps"`
	Requests    int     `json:"requests"`
	Concurrency int     `json:"concurrency"`
	AbortShare  float64 `json:"abort_share"`
	Fence       bool    `json:"fence"`
	Slots       int     `json:"slots"`
	Scarce      bool    `json:"scarce"`
	// Better says how to read each figure.
	Better   map[string]string `json:"better"`
	Arms     []*benchArm       `json:"arms"`
	Delta    benchDelta        `json:"delta_safe_vs_release_on_abort"`
	Checksum *benchDelta       `json:"delta_checksums_vs_safe,omitempty"`
	// SafeArmFailures lists what the safe arms broke (corrupt pages, held
	// exposures, failed requests): the command then exits 1.
	SafeArmFailures []string `json:"safe_arm_failures"`
	Report          string   `json:"report,omitempty"`
}

func runBench(ctx context.Context, o demoOptions, b benchOptions) error {
	arms := []*benchArm{{Name: "safe"}, {Name: "release-on-abort", unsafe: "release-on-abort"}}
	if b.checksumArm {
		arms = append(arms, &benchArm{Name: "safe+checksums"})
	}
	res := benchResult{Reps: b.reps, Requests: o.Requests, Concurrency: o.Concurrency, AbortShare: o.AbortShare,
		Fence: o.Fence, Slots: o.Slots, Scarce: b.scarce, Arms: arms, SafeArmFailures: []string{},
		Better: map[string]string{
			"req_per_s": "higher", "delta_pct": "higher (negative: safety costs throughput)",
			"held_slot_seconds_per_abort": "lower", "corrupt_pages": "lower (the safe arm must show 0)",
		}}
	fmt.Fprintf(os.Stderr, "kvfence bench: %d reps × %d arms, %d requests at concurrency %d, %.0f%% aborted, fence %s, %d decode slots\n",
		b.reps, len(arms), o.Requests, o.Concurrency, o.AbortShare*100, b.fence, o.Slots)
	for i := range b.reps {
		for j := range arms {
			a := arms[(i+j)%len(arms)] // rotate which arm goes first
			r := o
			r.Unsafe = a.unsafe
			r.Checksums = a.Name == "safe+checksums"
			r.Seed = o.Seed + uint64(i)
			s, failure, err := benchRep(ctx, r, b.keep)
			if err != nil {
				return err
			}
			if failure != "" {
				res.SafeArmFailures = append(res.SafeArmFailures, failure)
			}
			a.add(s, r.Seed)
			fmt.Fprintf(os.Stderr, "rep %d %-17s %7.1f req/s steady, %7.1f wall, %4d aborts, %5.1f held slot-s, %d corrupt pages\n",
				i+1, a.Name, s.SteadyRequestsPerSec, s.RequestsPerSec, s.Aborts, sumValues(s.HoldSlotSec), s.CorruptPages)
		}
	}
	for _, a := range arms {
		a.finish()
	}
	res.Delta = newBenchDelta(arms[0], arms[1])
	if b.checksumArm {
		d := newBenchDelta(arms[2], arms[0])
		res.Checksum = &d
	}
	if b.report != "" {
		if err := writeBenchReport(b.report, &res); err != nil {
			return err
		}
		res.Report = b.report
	}
	if b.asJSON {
		out, _ := json.Marshal(res)
		fmt.Println(string(out))
	} else {
		printBench(os.Stdout, &res)
	}
	if len(res.SafeArmFailures) > 0 {
		return fmt.Errorf("a safe arm broke its promise in %d runs: %s", len(res.SafeArmFailures), strings.Join(res.SafeArmFailures, "; "))
	}
	return nil
}

// benchRep runs one repetition in a run directory of its own, removed
// unless keep or a safe arm failed; failure says what a safe arm broke.
func benchRep(ctx context.Context, r demoOptions, keep bool) (*demoSummary, string, error) {
	cleanup, err := runDir(&r, "kvfence-bench-", keep)
	if err != nil {
		return nil, "", err
	}
	s, err := runDemo(ctx, r)
	failure := ""
	if err == nil && r.Unsafe == "" {
		if failure = safeArmFailed(s, false); failure != "" {
			failure = fmt.Sprintf("seed %d: %s (logs in %s)", r.Seed, failure, r.Dir)
		}
	}
	cleanup(err != nil || failure != "")
	return s, failure, err
}

func sumValues(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}
