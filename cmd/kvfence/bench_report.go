package main

import (
	"fmt"
	"html"

	"gonum.org/v1/plot/vg"
)

// writeBenchReport writes kvfence bench's self-contained HTML page:
// throughput per arm with its CI, the paired delta against 0, holds by
// release path and arm, held capacity over time in each arm's first rep,
// and corrupt pages highlighted.
func writeBenchReport(path string, res *benchResult) error {
	r := newHTMLReport("kvfence bench — the cost of safety")
	fence := "off"
	if res.Fence {
		fence = "on"
	}
	r.para("%d reps per arm, paired (rep i runs every arm on the same seed), order balanced over reps (a Williams design: each arm in each position and after each other arm equally often); %d requests at concurrency %d, %.0f%% aborted mid-transfer, fence %s in the safe arms (never in release-on-abort), load average %.1f → %.1f, %d decode slots%s. safe-twin is safe again: its difference from safe is the noise floor. One machine, shared: figures are noisy, read the CI.",
		res.Reps, res.Requests, res.Concurrency, res.AbortShare*100, fence, res.LoadAverage[0], res.LoadAverage[1], res.Slots, map[bool]string{true: " (scarce)", false: ""}[res.Scarce])
	r.raw("<table><tr><th>arm</th><th>req/s mean (higher is better)</th><th>95% CI</th><th>aborts</th><th>held slot-s per abort (lower is better)</th><th>corrupt pages (lower is better)</th><th>lost requests</th><th>CPU ms per request, all processes (lower is better)</th></tr>")
	for _, a := range res.Arms {
		fmt.Fprintf(&r.b, "<tr><td>%s</td><td>%.1f</td><td>[%.1f, %.1f]</td><td>%d</td><td>%.3f</td>%s<td>%d</td><td>%s</td></tr>",
			html.EscapeString(a.Name), a.MeanReqPerSec, a.CI95Low, a.CI95High, a.Aborts, a.HeldSlotSecPerAbort, corruptCell(a.CorruptPages), a.LostRequests, html.EscapeString(cpuCell(a)))
	}
	r.raw("</table>")
	for _, d := range append([]benchDelta{res.Delta, res.NoiseFloor}, append(derefDeltas(res.FenceCost), derefDeltas(res.Checksum)...)...) {
		r.para("Throughput %s vs %s: %+.2f%%, 95%% CI [%+.2f%%, %+.2f%%] — %s. CPU per request %+.1f%% [%+.1f%%, %+.1f%%].", d.Of, d.Against, d.Pct, d.CI95Low, d.CI95High, d.Verdict, d.CPUPct, d.CPUCI95Low, d.CPUCI95High)
	}
	if len(res.SafeArmFailures) > 0 {
		r.raw(fmt.Sprintf("<p class=bad>A safe arm broke its promise: %s</p>", html.EscapeString(fmt.Sprint(res.SafeArmFailures))))
	}

	r.heading("Throughput per arm")
	tp, err := armThroughputPlot(res.Arms)
	if err != nil {
		return err
	}
	img, err := plotImg(tp, chartW, chartH, "throughput per arm", "")
	if err != nil {
		return err
	}
	r.raw(img)
	dp, err := deltaPlot(res.Delta)
	if err != nil {
		return err
	}
	if img, err = plotImg(dp, chartW, 2.2*vg.Inch, "paired delta", ""); err != nil {
		return err
	}
	r.raw(img)

	r.heading("Hold durations of aborted requests, by arm and release path")
	r.para("Pooled over reps. Circles mark p50, triangles p99; dashed curves are the known-unsafe arm.")
	var series []holdSeries
	for _, a := range res.Arms {
		for _, p := range releasePaths(a.holds) {
			series = append(series, holdSeries{name: a.Name + " · " + p, path: p, holds: a.holds[p], dash: a.unsafe != ""})
		}
	}
	hp, err := holdsPlot("Hold durations by arm and release path", series)
	if err != nil {
		return err
	}
	if img, err = plotImg(hp, chartW, chartH, "hold durations", "No aborted request was held in any arm (--abort-share 0?): nothing to draw."); err != nil {
		return err
	}
	r.raw(img)

	r.heading("Held capacity over time (each arm's first rep)")
	for _, a := range res.Arms {
		if a.first == nil {
			continue
		}
		cp, err := capacityPlot(fmt.Sprintf("%s, seed %d: decode slots by state", a.Name, a.seeded[0]), a.first.Series, a.first.PoolSlots)
		if err != nil {
			return err
		}
		if img, err = plotImg(cp, chartW, chartH, a.Name+" held capacity", "No slot samples for "+a.Name+"."); err != nil {
			return err
		}
		r.raw(img)
	}
	return r.write(path)
}

func derefDeltas(d *benchDelta) []benchDelta {
	if d == nil {
		return nil
	}
	return []benchDelta{*d}
}
