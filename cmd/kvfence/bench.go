package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/internal/knownunsafe"
)

func init() { register(newBenchCommand) }

// kvfence bench: normal-path throughput of the safe core vs the unsafe
// release-on-abort arm (repetitions interleaved, so drift hits both arms
// alike), reported as a delta with a 95% confidence interval; then an abort
// storm, reporting held slot-seconds per aborted request by release path.
func newBenchCommand() *cobra.Command {
	o := demoOptions{}
	var reps int
	var keep bool
	// failures lists what the safe arms broke (corrupt pages, held
	// exposures, failed requests): the command then exits 1.
	var failures []string
	// run is one repetition in a run directory of its own, removed unless
	// --keep or the run failed.
	run := func(ctx context.Context, r demoOptions, safe bool) (*demoSummary, error) {
		cleanup, err := runDir(&r, "kvfence-bench-", keep)
		if err != nil {
			return nil, err
		}
		s, err := runDemo(ctx, r)
		failure := ""
		if err == nil && safe {
			if failure = safeArmFailed(s, false); failure != "" {
				failures = append(failures, fmt.Sprintf("%s (logs in %s)", failure, r.Dir))
			}
		}
		cleanup(err != nil || failure != "")
		return s, err
	}
	var asJSON, checksumArm bool
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "throughput safe vs unsafe release-on-abort (interleaved, 95% CI), and held slot-seconds under an abort storm",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if reps < 1 || reps > 1000 {
				return usagef("--reps must be between 1 and 1000, got %d", reps)
			}
			if err := o.validate(); err != nil {
				return err
			}
			if !knownunsafe.Compiled {
				return usagef("kvfence bench compares the safe core with the known-unsafe release-on-abort core, which this build leaves out; run it from a build with -tags kvfenceunsafe (go run -tags kvfenceunsafe ./cmd/kvfence bench)")
			}
			type arm struct {
				name      string
				unsafe    string
				checksums bool
				rates     []float64 // steady-state req/s (concurrency / mean latency)
				wall      []float64 // requests / wall time
			}
			arms := []*arm{{name: "safe"}, {name: "release-on-abort", unsafe: "release-on-abort"}}
			if checksumArm {
				arms = append(arms, &arm{name: "safe+checksums", checksums: true})
			}
			for i := 0; i < reps; i++ {
				for j := range arms {
					a := arms[(i+j)%len(arms)] // rotate which arm goes first
					r := o
					r.AbortShare = 0
					r.Unsafe = a.unsafe
					r.Checksums = a.checksums
					// The arms differ only in the core: the same data path
					// (no per-exposure keys) for both, so the delta is the
					// cost of holding, not of fencing.
					r.Fence = false
					r.Seed = uint64(i + 1)
					s, err := run(cmd.Context(), r, a.unsafe == "")
					if err != nil {
						return err
					}
					a.rates = append(a.rates, s.SteadyRequestsPerSec)
					a.wall = append(a.wall, s.RequestsPerSec)
					fmt.Fprintf(os.Stderr, "rep %d %-17s %.1f req/s steady (mean latency %.1f ms), %.1f req/s wall\n",
						i+1, a.name, s.SteadyRequestsPerSec, s.MeanLatencyMs, s.RequestsPerSec)
				}
			}
			delta, lo, hi := pairedDelta(arms[0].rates, arms[1].rates)
			wdelta, wlo, whi := pairedDelta(arms[0].wall, arms[1].wall)
			storm := o
			storm.AbortShare = 1
			storm.Fence = true
			ss, err := run(cmd.Context(), storm, true)
			if err != nil {
				return err
			}
			perAbort := map[string]float64{}
			for p, v := range ss.HoldSlotSec {
				perAbort[p] = v / math.Max(1, float64(ss.Aborts))
			}
			res := map[string]any{
				"requests": o.Requests, "concurrency": o.Concurrency, "reps": reps,
				"safe_req_per_s": arms[0].rates, "unsafe_req_per_s": arms[1].rates,
				"delta_pct": delta, "ci95_low_pct": lo, "ci95_high_pct": hi,
				"safe_wall_req_per_s": arms[0].wall, "unsafe_wall_req_per_s": arms[1].wall,
				"wall_delta_pct": wdelta, "wall_ci95_low_pct": wlo, "wall_ci95_high_pct": whi,
				"storm_aborts": ss.Aborts, "storm_held_slot_seconds_per_abort": perAbort,
				"storm_hold_p50_ms": ss.HoldP50Ms, "storm_hold_p99_ms": ss.HoldP99Ms, "storm_corrupt_pages": ss.CorruptPages,
			}
			var cdelta, clo, chi float64
			if checksumArm {
				// checksums on vs off, both safe: >0 would mean checksums are faster
				cdelta, clo, chi = pairedDelta(arms[2].rates, arms[0].rates)
				res["checksums_req_per_s"] = arms[2].rates
				res["checksums_delta_pct"], res["checksums_ci95_low_pct"], res["checksums_ci95_high_pct"] = cdelta, clo, chi
			}
			res["safe_arm_failures"] = failures
			if asJSON {
				b, _ := json.Marshal(res)
				fmt.Println(string(b))
				return benchVerdict(failures)
			}
			fmt.Printf("normal path, %d requests at concurrency %d, %d interleaved reps per arm\n", o.Requests, o.Concurrency, reps)
			fmt.Printf("  safe              %s req/s\n  release-on-abort  %s req/s\n", fmtRates(arms[0].rates), fmtRates(arms[1].rates))
			fmt.Printf("  delta (safe vs unsafe) %+.2f%%  95%% CI [%+.2f%%, %+.2f%%]  (steady state: concurrency / mean latency)\n", delta, lo, hi)
			fmt.Printf("  wall-clock req/s: safe %s, unsafe %s; delta %+.2f%% 95%% CI [%+.2f%%, %+.2f%%]\n",
				fmtRates(arms[0].wall), fmtRates(arms[1].wall), wdelta, wlo, whi)
			if checksumArm {
				fmt.Printf("  safe+checksums    %s req/s; delta vs safe %+.2f%%  95%% CI [%+.2f%%, %+.2f%%]\n", fmtRates(arms[2].rates), cdelta, clo, chi)
			}
			fmt.Printf("abort storm (every request cancelled mid-transfer): %d aborts\n", ss.Aborts)
			for p, v := range perAbort {
				fmt.Printf("  held slot-seconds per aborted request, %s: %.3f (p50 hold %.1f ms, p99 %.1f ms)\n", p, v, ss.HoldP50Ms[p], ss.HoldP99Ms[p])
			}
			fmt.Printf("  corrupt pages %d\n", ss.CorruptPages)
			return benchVerdict(failures)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&reps, "reps", 7, "repetitions per arm")
	fl.IntVar(&o.Requests, "requests", 1024, "requests per run")
	fl.IntVar(&o.Concurrency, "concurrency", 256, "requests in flight")
	fl.IntVar(&o.MinPages, "min-pages", 4, "fewest pages per request")
	fl.IntVar(&o.MaxPages, "max-pages", 16, "most pages per request")
	fl.DurationVar(&o.PageEvery, "page-every", 8*time.Millisecond, "simulated prefill compute per page")
	fl.DurationVar(&o.DecodeFor, "decode-for", time.Second, "decode loop time per request (as the demo)")
	fl.DurationSliceVar(&o.Delays, "data-delay", []time.Duration{600 * time.Millisecond, time.Millisecond}, "delaying proxy delays")
	fl.BoolVar(&o.TLS, "tls", true, "mutual TLS on the control plane")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object")
	fl.BoolVar(&checksumArm, "checksums", false, "add a third arm: safe with checksums at commit")
	fl.BoolVar(&keep, "keep", false, "keep every repetition's run directory (logs, throwaway certificates)")
	cmd.AddCommand(newBenchBoundaryCommand())
	return cmd
}

// benchVerdict fails the command when a safe arm broke its promise.
func benchVerdict(failures []string) error {
	if len(failures) == 0 {
		return nil
	}
	return fmt.Errorf("a safe arm broke its promise in %d runs: %s", len(failures), strings.Join(failures, "; "))
}

// pairedDelta is the mean relative difference (safe/unsafe - 1, in %) over
// paired repetitions, with a 95% t-interval.
func pairedDelta(safe, unsafe []float64) (mean, lo, hi float64) {
	n := min(len(safe), len(unsafe))
	if n == 0 {
		return 0, 0, 0
	}
	d := make([]float64, n)
	for i := range d {
		d[i] = (safe[i]/unsafe[i] - 1) * 100
		mean += d[i]
	}
	mean /= float64(n)
	if n < 2 {
		return mean, mean, mean
	}
	var ss float64
	for _, x := range d {
		ss += (x - mean) * (x - mean)
	}
	se := math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	t := tQuantile975(n - 1)
	return mean, mean - t*se, mean + t*se
}

func tQuantile975(df int) float64 {
	table := []float64{0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131}
	if df < len(table) {
		return table[df]
	}
	return 1.96
}

func fmtRates(r []float64) string {
	s := ""
	for i, x := range r {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.1f", x)
	}
	return s
}
