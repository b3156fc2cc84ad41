package main

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// printBench prints kvfence bench's result for people: every figure says
// which direction is better, and the delta says whether its CI spans 0.
func printBench(w io.Writer, r *benchResult) {
	fence := "off"
	if r.Fence {
		fence = "on"
	}
	mode := "ample"
	if r.Scarce {
		mode = "scarce"
	}
	fmt.Fprintf(w, "kvfence bench — the cost of safety: the shipped default (safe) vs the known-unsafe release-on-abort, and vs its identical twin (the noise floor)\n")
	fmt.Fprintf(w, "  %d requests at concurrency %d, %.0f%% aborted mid-transfer, fence %s in the safe arms (never in release-on-abort), %d decode slots (%s), load average %.1f → %.1f\n",
		r.Requests, r.Concurrency, r.AbortShare*100, fence, r.Slots, mode, r.LoadAverage[0], r.LoadAverage[1])
	fmt.Fprintf(w, "  %d reps per arm, paired (rep i runs every arm on the same seed), order balanced over reps (Williams); one shared machine: noisy, read the CI\n\n", r.Reps)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "arm\tfence\treq/s mean\t95% CI\taborts\theld slot-s per abort\tcorrupt pages\tfree writes\tlost requests\tCPU ms per request\tkey calls\t")
	fmt.Fprintln(tw, "\t\t(higher better)\t\t\t(lower better)\t(lower better)\t\t\t(all processes)\tper request\t")
	for _, a := range r.Arms {
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t[%.1f, %.1f]\t%d\t%.3f\t%d\t%d\t%d\t%s\t%.2f\t\n", a.Name, armFence(a),
			a.MeanReqPerSec, a.CI95Low, a.CI95High, a.Aborts, a.HeldSlotSecPerAbort, a.CorruptPages, a.FreeWrites, a.LostRequests, cpuCell(a), a.KeyCallsPerRequest)
	}
	tw.Flush()
	fmt.Fprintln(w)
	printDelta(w, r.Delta)
	fmt.Fprintf(w, "noise floor (two identical arms) ")
	printDelta(w, r.NoiseFloor)
	if r.FenceCost != nil {
		printDelta(w, *r.FenceCost)
	}
	if r.AfterDrain != nil {
		printDelta(w, *r.AfterDrain)
	}
	if r.Checksum != nil {
		printDelta(w, *r.Checksum)
	}
	fmt.Fprintf(w, "\nholds of aborted requests by release path (pooled over reps; lower is better)\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "arm\tpath\tholds\tp50 ms\tp99 ms\tslot-seconds\t")
	for _, a := range r.Arms {
		for _, p := range releasePaths(a.holds) {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.1f\t%.1f\t\n", a.Name, p, a.Holds[p], a.HoldP50Ms[p], a.HoldP99Ms[p], a.HeldSlotSec[p])
		}
	}
	tw.Flush()
	if r.Report != "" {
		fmt.Fprintf(w, "\nreport  %s\n", r.Report)
	}
}

// armFence is the arm's fence and, with one, when it revoked an aborted
// request's keys.
func armFence(a *benchArm) string {
	switch {
	case !a.Fence:
		return "off"
	case a.RevokeAtAbort:
		return "on, revoke at abort"
	}
	return "on, revoke after drain"
}

func printDelta(w io.Writer, d benchDelta) {
	fmt.Fprintf(w, "throughput %s vs %s: %+.2f%%  95%% CI [%+.2f%%, %+.2f%%]  per rep %s\n  %s\n",
		d.Of, d.Against, d.Pct, d.CI95Low, d.CI95High, fmtPcts(d.PerRep), d.Verdict)
	fmt.Fprintf(w, "  CPU per request %+.1f%% [%+.1f%%, %+.1f%%] (lower better)\n", d.CPUPct, d.CPUCI95Low, d.CPUCI95High)
}

// cpuCell is an arm's mean CPU per request with its split: router,
// decode, prefill.
func cpuCell(a *benchArm) string {
	return fmt.Sprintf("%.2f (r %.2f, d %.2f, p %.2f)", a.MeanCPUMsPerRequest, a.CPUPartsMs["router"], a.CPUPartsMs["decode"], a.CPUPartsMs["prefill"])
}

func fmtPcts(v []float64) string {
	s := ""
	for i, x := range v {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%+.1f%%", x)
	}
	return s
}

// printBenchSummary is the one screen a user needs: per abort share, the
// shipped default against release-on-abort (paired delta, its CI, whether
// it is within 1% and the CI spans 0) beside the noise floor (two
// identical default arms), the fence's own share where measured, and
// what the safety buys (held slot-seconds per abort, corrupt pages).
func printBenchSummary(w io.Writer, results []*benchResult) {
	fmt.Fprintf(w, "summary — req/s of the shipped default (safe, fence on) vs release-on-abort (unsafe), paired deltas with 95%% CIs; negative: safety costs\n")
	fmt.Fprintf(w, "  noise: safe vs its identical twin; goal: within 1%% with the CI spanning 0; fence: safe vs safe-fence-off; CPU: safe vs unsafe, per request, all processes; held slot-s per abort and corrupt pages: lower is better\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "aborted\tsafe vs unsafe\t95% CI\tgoal met\tnoise\t95% CI\tfence\tCPU\theld safe | unsafe\tcorrupt safe | unsafe\t")
	for _, r := range results {
		var fence string
		if r.FenceCost != nil {
			fence = fmt.Sprintf("%+.2f%% [%+.2f, %+.2f]\t", r.FenceCost.Pct, r.FenceCost.CI95Low, r.FenceCost.CI95High)
		} else {
			fence = "add --fence-off\t"
		}
		safe, unsafe := r.Arms[0], r.Arms[1]
		fmt.Fprintf(tw, "%.0f%%\t%+.2f%%\t[%+.2f, %+.2f]\t%s\t%+.2f%%\t[%+.2f, %+.2f]\t%s%+.1f%%\t%.3f | %.3f\t%d | %d\t\n",
			r.AbortShare*100, r.Delta.Pct, r.Delta.CI95Low, r.Delta.CI95High, withinGoal(r.Delta),
			r.NoiseFloor.Pct, r.NoiseFloor.CI95Low, r.NoiseFloor.CI95High, fence, r.Delta.CPUPct,
			safe.HeldSlotSecPerAbort, unsafe.HeldSlotSecPerAbort, safe.CorruptPages, unsafe.CorruptPages)
	}
	tw.Flush()
}

// withinGoal says whether a delta meets issue 21's goal: the mean within
// 1% of the baseline and the 95% CI spanning 0.
func withinGoal(d benchDelta) string {
	switch {
	case d.SpansZero && d.Pct >= -1:
		return "yes"
	case d.SpansZero:
		return "no: mean below -1%"
	default:
		return "no: CI excludes 0"
	}
}
