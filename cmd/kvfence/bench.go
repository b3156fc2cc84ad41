package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/core/knownunsafe"
	"github.com/kvfence/kvfence/internal/demo"
)

func init() { register(newBenchCommand) }

// benchOptions are kvfence bench's own flags (the run's sizes are the
// demo's options).
type benchOptions struct {
	reps        int
	fence       string
	scarce      bool
	checksumArm bool
	fenceOffArm bool
	drainArm    bool
	asJSON      bool
	keep        bool
	report      string
	abortShares []float64
}

// kvfence bench: the cost of safety. The shipped default (the real core,
// per-exposure fence on) against the known-unsafe release-on-abort core
// (frees an aborted request's slots at once, no fence), and against a
// second, identical default arm whose difference is the run's noise floor;
// each run as real processes with the same share of requests aborted
// mid-transfer; rep i runs every arm on seed i, in an order balanced over
// reps (armOrder), so drift on a shared machine hits the arms alike and the comparison
// is paired.
func newBenchCommand() *cobra.Command {
	o := demo.Options{}
	b := benchOptions{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "the cost of safety: throughput, held slot-seconds per abort and corrupt pages, safe core vs known-unsafe release-on-abort, with aborts",
		Long: `kvfence bench runs the demo's cluster (real rank and plugin processes, the
delaying proxy on the data path) once per arm and repetition. The arms differ
in the decode core and its fence: "safe" is the shipped default (the real core,
per-exposure keys revoked on abort: --fence on); it holds an aborted request's
slots until its writes drained, were fenced or timed out. "release-on-abort"
frees them at once and fences nothing (what engines do today, and why late
writes land in other requests' pages). "safe-twin" is "safe" again: the
paired difference between the two identical arms is the run's noise floor,
printed beside every result. --abort-share of the requests are cancelled
mid-transfer in every arm; a list (--abort-share 0,0.25,0.5) runs each share
in turn. Rep i runs every arm on seed i, in an order balanced over
reps (a Williams design: every arm runs in every position, and right after
every other arm, equally often).

It reports, per abort share and arm: throughput (higher is better) with a 95%
CI, the paired delta safe vs release-on-abort with its 95% CI and whether the
CI spans 0, the noise floor (safe vs safe-twin, same statistics), held
slot-seconds per abort, hold p50/p99 by release path, and corrupt pages
(the safe arms must show 0: it fails the command otherwise). --fence-off
adds an arm "safe-fence-off" (the real core without the fence), so the
fence's share of the cost shows apart from the core's. --scarce shrinks
the decode pool to half the slots the concurrency asks for, where holds cost
admissions and so throughput.

The comparison arm is a known-unsafe core, which only a build with
-tags kvfenceunsafe contains; a default build refuses the command:

  go run -tags kvfenceunsafe ./cmd/kvfence bench --reps 5

Numbers from a shared or small machine are noisy: compare the ratios, and
read the CI.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return benchCommand(cmd.Context(), o, b, cmd.Flags().Changed("slots"))
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&b.reps, "reps", 5, "repetitions per arm (paired: rep i runs every arm on seed i)")
	fl.IntVar(&o.Requests, "requests", 512, "requests per run")
	fl.IntVar(&o.Concurrency, "concurrency", 128, "requests in flight")
	fl.IntVar(&o.MinPages, "min-pages", 4, "fewest pages per request")
	fl.IntVar(&o.MaxPages, "max-pages", 16, "most pages per request")
	fl.Float64SliceVar(&b.abortShares, "abort-share", []float64{0.25}, "share of requests cancelled mid-transfer, in every arm; a list (0,0.25,0.5) runs each in turn")
	fl.IntVar(&o.Slots, "slots", demo.DefaultSlots, "decode KV slots")
	fl.BoolVar(&b.scarce, "scarce", false, "scarce slots: a decode pool half the size the concurrency asks for (concurrency × mean pages / 2), so held slots delay admissions")
	fl.StringVar(&b.fence, "fence", "on", "per-exposure keys with revocation in the safe arms: on (the shipped default) or off (the cores alone); release-on-abort never fences")
	fl.BoolVar(&b.fenceOffArm, "fence-off", false, "add an arm: the real core without the fence (splits the fence's cost from the core's)")
	fl.BoolVar(&b.drainArm, "after-drain", false, "add an arm: the safe default revoking an aborted request's keys only after its drain (what a transport without isolated refusals gets)")
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

// benchCommand is kvfence bench: every flag is checked (exit 2) before
// the first run starts; a default build refuses the command, since its
// comparison arm is a known-unsafe core.
func benchCommand(ctx context.Context, o demo.Options, b benchOptions, slotsSet bool) error {
	if err := b.validate(&o, slotsSet); err != nil {
		return err
	}
	if err := validateRun(&o); err != nil {
		return err
	}
	if !knownunsafe.Compiled {
		return usagef("kvfence bench compares the safe core with the known-unsafe release-on-abort core, which this build leaves out; run it from a build with -tags kvfenceunsafe (go run -tags kvfenceunsafe ./cmd/kvfence bench)")
	}
	if err := choosePlugin(&o); err != nil { // plugin_flag.go
		return err
	}
	return runBench(ctx, o, b)
}

// validate refuses nonsense in bench's own flags and applies --scarce.
func (b *benchOptions) validate(o *demo.Options, slotsSet bool) error {
	switch {
	case b.reps < 2 || b.reps > 1000:
		return usagef("--reps must be between 2 and 1000 (a CI needs two), got %d", b.reps)
	case b.fence != "on" && b.fence != "off":
		return usagef("--fence must be on or off, not %q", b.fence)
	case o.Slots < 1 || o.Slots > maxSlots:
		return usagef("--slots must be between 1 and %d, got %d", maxSlots, o.Slots)
	case b.scarce && slotsSet:
		return usagef("--scarce sizes the pool itself: give --scarce or --slots, not both")
	case len(b.abortShares) == 0 || len(b.abortShares) > 8:
		return usagef("--abort-share takes 1 to 8 shares, got %d", len(b.abortShares))
	}
	for _, share := range b.abortShares {
		if share < 0 || share > 1 {
			return usagef("--abort-share must be between 0 and 1, got %v", share)
		}
		o.AbortShare = max(o.AbortShare, share) // the plugin preflight checks the largest
	}
	if b.report != "" {
		if err := checkWritableFile(b.report); err != nil {
			return usagef("--report: %v", err)
		}
	}
	o.Fence = b.fence == "on"
	if b.drainArm && !o.Fence {
		return usagef("--after-drain needs --fence on: without a fence nothing is revoked")
	}
	if b.scarce {
		o.Slots = max(o.MaxPages, o.Concurrency*(o.MinPages+o.MaxPages)/4)
	}
	return nil
}

// benchRun is what kvfence bench --json prints: one result per abort
// share, in the order given.
type benchRun struct {
	Results []*benchResult `json:"results"`
}

// benchResult is the comparison at one abort share.
type benchResult struct {
	Reps        int     `json:"reps"`
	Requests    int     `json:"requests"`
	Concurrency int     `json:"concurrency"`
	AbortShare  float64 `json:"abort_share"`
	Fence       bool    `json:"fence"`
	Slots       int     `json:"slots"`
	Scarce      bool    `json:"scarce"`
	// LoadAverage is the machine's 1-minute load average when the share's
	// reps started and when they ended (the figures are only as quiet as
	// the machine was).
	LoadAverage [2]float64 `json:"load_average_1m"`
	// Better says how to read each figure.
	Better map[string]string `json:"better"`
	Arms   []*benchArm       `json:"arms"`
	// Delta is the shipped default against the unsafe arm; NoiseFloor the
	// same statistic between two identical default arms: a Delta inside
	// the noise floor is no cost this run can see.
	Delta      benchDelta  `json:"delta_safe_vs_release_on_abort"`
	NoiseFloor benchDelta  `json:"noise_floor_safe_vs_safe_twin"`
	FenceCost  *benchDelta `json:"delta_safe_vs_safe_fence_off,omitempty"`
	AfterDrain *benchDelta `json:"delta_safe_vs_safe_after_drain,omitempty"`
	Checksum   *benchDelta `json:"delta_checksums_vs_safe,omitempty"`
	// SafeArmFailures lists what the safe arms broke (corrupt pages, held
	// exposures, failed requests): the command then exits 1.
	SafeArmFailures []string `json:"safe_arm_failures"`
	Report          string   `json:"report,omitempty"`
}

// benchArms: the shipped default, its identical twin (the noise floor),
// the unsafe arm, and the optional ones.
func benchArms(o demo.Options, b benchOptions) []*benchArm {
	arms := []*benchArm{{Name: "safe", Fence: o.Fence}, {Name: "release-on-abort", unsafe: "release-on-abort"},
		{Name: "safe-twin", Fence: o.Fence}}
	if b.fenceOffArm {
		arms = append(arms, &benchArm{Name: "safe-fence-off"})
	}
	if b.drainArm && o.Fence {
		arms = append(arms, &benchArm{Name: "safe-after-drain", Fence: true, agentArgs: []string{"--revoke=after-drain"}})
	}
	if b.checksumArm {
		arms = append(arms, &benchArm{Name: "safe+checksums", Fence: o.Fence, checksums: true})
	}
	return arms
}

func runBench(ctx context.Context, o demo.Options, b benchOptions) error {
	var run benchRun
	var failures []string
	for _, share := range b.abortShares {
		o.AbortShare = share
		res, err := benchShare(ctx, o, b, len(b.abortShares) > 1)
		if err != nil {
			return err
		}
		run.Results = append(run.Results, res)
		failures = append(failures, res.SafeArmFailures...)
	}
	if b.asJSON {
		out, _ := json.Marshal(run)
		fmt.Println(string(out))
	} else {
		for i, res := range run.Results {
			if i > 0 {
				fmt.Println()
			}
			printBench(os.Stdout, res)
		}
		fmt.Println()
		printBenchSummary(os.Stdout, run.Results)
	}
	if len(failures) > 0 {
		return fmt.Errorf("a safe arm broke its promise in %d runs: %s", len(failures), strings.Join(failures, "; "))
	}
	return nil
}

// benchShare runs every arm and rep at o.AbortShare.
func benchShare(ctx context.Context, o demo.Options, b benchOptions, several bool) (*benchResult, error) {
	arms := benchArms(o, b)
	res := &benchResult{Reps: b.reps, Requests: o.Requests, Concurrency: o.Concurrency, AbortShare: o.AbortShare,
		Fence: o.Fence, Slots: o.Slots, Scarce: b.scarce, Arms: arms, SafeArmFailures: []string{},
		Better: map[string]string{
			"req_per_s": "higher", "delta_pct": "higher (negative: safety costs throughput)",
			"held_slot_seconds_per_abort": "lower", "corrupt_pages": "lower (the safe arm must show 0)",
			"cpu_ms_per_request": "lower", "cpu_delta_pct": "lower (positive: safety costs CPU)",
		}}
	res.LoadAverage[0] = loadAverage()
	fmt.Fprintf(os.Stderr, "kvfence bench: %d reps × %d arms, %d requests at concurrency %d, %.0f%% aborted, fence %s in the safe arms, %d decode slots, load %.1f\n",
		b.reps, len(arms), o.Requests, o.Concurrency, o.AbortShare*100, b.fence, o.Slots, res.LoadAverage[0])
	for i := range b.reps {
		for _, j := range armOrder(len(arms), i) { // bench_order.go
			a := arms[j]
			r := o
			r.Unsafe, r.Fence, r.Checksums = a.unsafe, a.Fence, a.checksums
			r.AgentArgs = append(append([]string(nil), o.AgentArgs...), a.agentArgs...)
			r.Seed = o.Seed + uint64(i)
			s, failure, err := benchRep(ctx, r, b.keep)
			if err != nil {
				return nil, err
			}
			if failure != "" {
				res.SafeArmFailures = append(res.SafeArmFailures, failure)
			}
			a.add(s, r.Seed)
			fmt.Fprintf(os.Stderr, "rep %d %-17s %7.1f req/s steady, %7.1f wall, %4d aborts, %5.1f held slot-s, %d corrupt pages\n",
				i+1, a.Name, s.SteadyRequestsPerSec, s.RequestsPerSec, s.Aborts, sumValues(s.HoldSlotSec), s.CorruptPages)
		}
	}
	res.LoadAverage[1] = loadAverage()
	for _, a := range arms {
		a.finish()
	}
	res.Delta, res.NoiseFloor = newBenchDelta(arms[0], arms[1]), newBenchDelta(arms[0], arms[2])
	for _, a := range arms[3:] {
		d := newBenchDelta(arms[0], a)
		switch a.Name {
		case "safe-fence-off":
			res.FenceCost = &d
		case "safe-after-drain":
			res.AfterDrain = &d
		case "safe+checksums":
			d = newBenchDelta(a, arms[0])
			res.Checksum = &d
		}
	}
	if b.report != "" {
		path := b.report
		if several {
			path = sharePath(b.report, o.AbortShare)
		}
		if err := writeBenchReport(path, res); err != nil {
			return nil, err
		}
		res.Report = path
	}
	return res, nil
}

// sharePath names one share's report when several run: bench.html at 25%
// aborts is bench-abort25.html.
func sharePath(path string, share float64) string {
	ext := filepath.Ext(path)
	return fmt.Sprintf("%s-abort%.0f%s", strings.TrimSuffix(path, ext), share*100, ext)
}

// loadAverage is the 1-minute load average (0 where /proc has none).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// benchRep runs one repetition in a run directory of its own, removed
// unless keep or a safe arm failed; failure says what a safe arm broke.
func benchRep(ctx context.Context, r demo.Options, keep bool) (*demo.Summary, string, error) {
	cleanup, err := runDir(&r, "kvfence-bench-", keep)
	if err != nil {
		return nil, "", err
	}
	s, err := demo.Run(ctx, r)
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
