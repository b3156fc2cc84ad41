package main

import (
	"fmt"
	"html"
	"image/color"
	"io"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The goals of issue 21 for the default (asynchronous) boundary.
const (
	boundaryGoalAddedUs4k     = 10.0 // at most this many µs added per 4 KiB batch
	boundaryGoalThroughput64k = 0.95 // at least this share of in-process throughput at 64 KiB
)

// boundaryPair is one arm against the in-process arm, rep by rep (each
// rep ran both back to back, at the same load).
type boundaryPair struct {
	added         []float64 // µs per batch: arm minus in-process
	ratio         []float64 // throughput: in-process µs / arm µs
	addedMean     float64
	addedLo       float64 // 95% CI of the mean added µs
	addedHi       float64
	ratioMean     float64
	ratioLo       float64
	ratioHi       float64
	addedMedian   float64
	ratioOfMedian float64 // median in-process µs / median arm µs
}

func pairBoundary(arm, base []float64) boundaryPair {
	var p boundaryPair
	for i := range min(len(arm), len(base)) {
		p.added = append(p.added, arm[i]-base[i])
		p.ratio = append(p.ratio, base[i]/arm[i])
	}
	p.addedMean, p.addedLo, p.addedHi = meanCI(p.added)
	p.ratioMean, p.ratioLo, p.ratioHi = meanCI(p.ratio)
	p.addedMedian = median(arm) - median(base)
	p.ratioOfMedian = median(base) / median(arm)
	return p
}

// boundaryReport: medians per arm and size, and the boundary's cost as
// differences and throughput ratios against the in-process arm (the
// twin's are the noise floor), with their spread and 95% CI.
func boundaryReport(arms []*boundaryArm, reps, window int) map[string]any {
	res := map[string]any{"reps": reps, "window": window, "ops_per_batch": 1, "transport": "tcp",
		"data_path": "rings", "default_post": "async",
		"goal_added_us_per_batch_4k": boundaryGoalAddedUs4k, "goal_throughput_ratio_64k": boundaryGoalThroughput64k,
		"note": "median of interleaved reps, paired with the same rep's in-process run; CIs are of the paired mean; noise_floor_* is the in-process arm against its twin"}
	in := arms[0]
	for _, size := range boundarySizes {
		n := size.name
		res["batches_"+n] = size.batches
		for _, a := range arms {
			res[a.name+"_us_per_batch_"+n] = median(a.us[n])
			res[a.name+"_cpu_us_per_batch_"+n] = median(a.cpu[n])
			res[a.name+"_context_switches_per_batch_"+n] = median(a.sw[n])
			if a == in {
				continue
			}
			p := pairBoundary(a.us[n], in.us[n])
			k := a.prefix + "boundary_added_us_per_batch_"
			res[k+n] = p.addedMedian
			res[k+"min_"+n], res[k+"max_"+n] = minMax(p.added)
			res[k+"mean_"+n], res[k+"ci95_low_"+n], res[k+"ci95_high_"+n] = p.addedMean, p.addedLo, p.addedHi
			res[a.prefix+"throughput_ratio_"+n] = p.ratioOfMedian
			res[a.prefix+"throughput_ratio_ci95_low_"+n], res[a.prefix+"throughput_ratio_ci95_high_"+n] = p.ratioLo, p.ratioHi
		}
	}
	res["goal_met_4k"] = res["boundary_added_us_per_batch_4k"].(float64) <= boundaryGoalAddedUs4k
	res["goal_met_64k"] = res["throughput_ratio_64k"].(float64) >= boundaryGoalThroughput64k
	return res
}

func minMax(v []float64) (lo, hi float64) {
	for i, x := range v {
		if i == 0 || x < lo {
			lo = x
		}
		if i == 0 || x > hi {
			hi = x
		}
	}
	return lo, hi
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// printBoundary prints the report for a person, on one screen: per size,
// every arm's µs per batch, what it adds to the in-process arm (median,
// the paired mean's 95% CI), its throughput ratio, and its switches and
// CPU per batch (what a spin or a wake-up costs the host, whatever the
// load does to the times); the twin's row is the noise floor; then the
// goals.
func printBoundary(w io.Writer, arms []*boundaryArm, res map[string]any) {
	load := res["load_average_1m"].([]float64)
	fmt.Fprintf(w, "plugin boundary: TCP sender, one write per batch, %d in flight, %d interleaved reps, receiver %s, load average %.1f → %.1f (%d busy-loop processes added)\n",
		res["window"], res["reps"], res["receiver"], load[0], load[1], res["load_processes"])
	fmt.Fprintf(w, "%-4s %-30s %9s  %-28s %-22s %-15s %s\n", "size", "arm", "µs/batch", "added µs: median, 95% CI", "throughput vs in-proc", "switches/batch", "CPU µs/batch")
	for _, size := range boundarySizes {
		n := size.name
		for i, a := range arms {
			sz := ""
			if i == 0 {
				sz = n
			}
			fmt.Fprintf(w, "%-4s %-30s %9.1f  ", sz, a.label, res[a.name+"_us_per_batch_"+n])
			if i == 0 {
				fmt.Fprintf(w, "%-28s %-22s", "(baseline)", "1")
			} else {
				k := a.prefix + "boundary_added_us_per_batch_"
				t := a.prefix + "throughput_ratio_"
				fmt.Fprintf(w, "%-28s %-22s",
					fmt.Sprintf("%+.1f [%+.1f, %+.1f]", res[k+n], res[k+"ci95_low_"+n], res[k+"ci95_high_"+n]),
					fmt.Sprintf("%.3f [%.3f, %.3f]", res[t+n], res[t+"ci95_low_"+n], res[t+"ci95_high_"+n]))
			}
			fmt.Fprintf(w, " %-15.2f %.1f\n", res[a.name+"_context_switches_per_batch_"+n], res[a.name+"_cpu_us_per_batch_"+n])
		}
	}
	fmt.Fprintf(w, "goals (default arm): ≤ %.0f µs added per 4 KiB batch: %+.1f µs, %s; ≥ %.2f of in-process throughput at 64 KiB: %.3f, %s\n",
		boundaryGoalAddedUs4k, res["boundary_added_us_per_batch_4k"], metWord(res["goal_met_4k"].(bool)),
		boundaryGoalThroughput64k, res["throughput_ratio_64k"], metWord(res["goal_met_64k"].(bool)))
	fmt.Fprintln(w, "the twin's row is the noise floor: a difference inside it is not the boundary's. Medians; the CI is of the paired mean.")
}

func metWord(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// writeBoundaryReport writes a self-contained HTML page: the printed
// table, then per size a chart of what each arm adds per batch.
func writeBoundaryReport(path string, arms []*boundaryArm, res map[string]any) error {
	r := newHTMLReport("kvfence bench boundary — the cost of the plugin boundary")
	var table strings.Builder
	printBoundary(&table, arms, res)
	r.raw("<pre>" + html.EscapeString(table.String()) + "</pre>")
	for _, size := range boundarySizes {
		r.heading(size.name + " per batch")
		goal := 0.0
		if size.name == "4k" {
			goal = boundaryGoalAddedUs4k
		}
		p, err := boundaryAddedPlot(arms, size.name, goal)
		if err != nil {
			return err
		}
		img, err := plotImg(p, chartW, chartH, "µs added per "+size.name+" batch", "")
		if err != nil {
			return err
		}
		r.raw(img)
	}
	return r.write(path)
}

// boundaryAddedPlot draws, for each arm but the in-process one, the µs it
// adds per batch: every paired rep as a grey dot, the mean with its 95%
// CI as a bar, a dashed line at 0 and, where there is one, the goal.
func boundaryAddedPlot(arms []*boundaryArm, size string, goal float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "µs added per " + size + " batch against in-process (lower is better): paired reps, mean with 95% CI"
	p.Y.Label.Text = "µs per batch"
	p.Add(plotter.NewGrid())
	var names []string
	for i, a := range arms[1:] {
		names = append(names, a.label)
		pr := pairBoundary(a.us[size], arms[0].us[size])
		dots, m, err := addArmPoints(p, i, pr.added, pr.addedMean, pr.addedLo, pr.addedHi, blue)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			p.Legend.Add("one rep (paired)", dots)
			p.Legend.Add("mean, 95% CI", m)
		}
	}
	if err := addHLine(p, 0, black, "no difference"); err != nil {
		return nil, err
	}
	if goal > 0 {
		if err := addHLine(p, goal, orange, fmt.Sprintf("goal: ≤ %.0f µs (default arm)", goal)); err != nil {
			return nil, err
		}
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	p.Y.Tick.Marker = plainTicks{}
	p.Legend.Top = true
	return p, nil
}

// addHLine adds a dashed horizontal line at y across the arms.
func addHLine(p *plot.Plot, y float64, col color.Color, name string) error {
	l, err := plotter.NewLine(plotter.XYs{{X: -0.6, Y: y}, {X: 10, Y: y}})
	if err != nil {
		return err
	}
	l.Color, l.Dashes = col, []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}
