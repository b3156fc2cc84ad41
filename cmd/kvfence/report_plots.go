package main

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"html"
	"image/color"
	"sort"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/internal/demo"
)

// The charts of the demo's and bench's HTML reports, drawn with gonum/plot
// (ticks, legends, labels that do not collide) and embedded as PNG data
// URIs so a report is one self-contained file.

var (
	red    = color.RGBA{R: 0xcc, G: 0x22, B: 0x22, A: 0xff}
	blue   = color.RGBA{R: 0x22, G: 0x66, B: 0xcc, A: 0xff}
	green  = color.RGBA{R: 0x22, G: 0x99, B: 0x55, A: 0xff}
	orange = color.RGBA{R: 0xdd, G: 0x77, B: 0x11, A: 0xff}
	purple = color.RGBA{R: 0x88, G: 0x44, B: 0xbb, A: 0xff}
	grey   = color.RGBA{R: 0x88, G: 0x88, B: 0x88, A: 0xff}
	black  = color.RGBA{A: 0xff}
)

// pathColor colours a release path the same way in every chart.
func pathColor(path string) color.Color {
	switch path {
	case "drained":
		return green
	case "fenced":
		return blue
	case "timeout":
		return orange
	case "unsafe":
		return red
	}
	return grey
}

// holdSeries is one curve of a hold-duration chart: the holds (ms) of one
// release path, of one arm in the bench.
type holdSeries struct {
	name  string
	path  string
	holds []float64
	dash  bool
}

// holdsPlot draws each series' holds as a cumulative distribution (x =
// hold ms, y = share of holds at most that long) with its p50 (circle) and
// p99 (triangle) marked and named in the legend; nil when no series has a
// hold, so a report says so instead of drawing an empty chart.
func holdsPlot(title string, series []holdSeries) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "hold duration (ms)"
	p.Y.Label.Text = "share of holds ≤ x"
	p.Add(plotter.NewGrid())
	drawn, longest := 0, 0.0
	for _, s := range series {
		if len(s.holds) == 0 {
			continue
		}
		v := append([]float64(nil), s.holds...)
		sort.Float64s(v)
		xys := make(plotter.XYs, 0, 2*len(v))
		for i, x := range v {
			xys = append(xys, plotter.XY{X: x, Y: float64(i) / float64(len(v))}, plotter.XY{X: x, Y: float64(i+1) / float64(len(v))})
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		line.Color, line.Width = pathColor(s.path), vg.Points(1.5)
		if s.dash {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		longest = max(longest, v[len(v)-1])
		p50, p99 := demo.Quantile(v, 0.50), demo.Quantile(v, 0.99)
		marks, err := plotter.NewScatter(plotter.XYs{{X: p50, Y: 0.50}, {X: p99, Y: 0.99}})
		if err != nil {
			return nil, err
		}
		marks.GlyphStyleFunc = func(i int) draw.GlyphStyle {
			g := draw.GlyphStyle{Color: pathColor(s.path), Radius: vg.Points(4), Shape: draw.CircleGlyph{}}
			if i == 1 {
				g.Shape = draw.TriangleGlyph{}
			}
			return g
		}
		p.Add(line, marks)
		p.Legend.Add(fmt.Sprintf("%s (n=%d): p50 %s, p99 %s", s.name, len(v), fmtMs(p50), fmtMs(p99)), line)
		drawn++
	}
	if drawn == 0 {
		return nil, nil
	}
	// The legend goes above the curves (which end at 1), where it covers
	// nothing; the share axis is ticked over 0..1 only.
	p.Legend.Top, p.Legend.Left, p.Legend.XOffs = true, true, vg.Points(8)
	p.Y.Min, p.Y.Max = 0, 1.04+0.075*float64(drawn)
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 0, Label: "0"}, {Value: 0.25, Label: "0.25"},
		{Value: 0.5, Label: "0.5"}, {Value: 0.75, Label: "0.75"}, {Value: 0.99, Label: "0.99"}, {Value: 1, Label: ""}})
	p.X.Min, p.X.Max = 0, max(1, longest*1.04) // the p99 marks stay whole
	p.X.Tick.Marker = plainTicks{}
	return p, nil
}

// capacityPlot draws decode's slots by state over time under a line at the
// pool size; nil without samples.
func capacityPlot(title string, series []agent.HeldSample, poolSlots int) (*plot.Plot, error) {
	if len(series) == 0 {
		return nil, nil
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "seconds since decode started"
	p.Y.Label.Text = "decode slots"
	p.Add(plotter.NewGrid())
	var tmax float64
	peak := 1
	for _, s := range series {
		tmax, peak = max(tmax, s.T), max(peak, s.Assigned+s.Handed+s.Held)
	}
	for _, c := range []struct {
		name string
		col  color.Color
		get  func(agent.HeldSample) int
	}{
		{"assigned (transfer in flight)", blue, func(h agent.HeldSample) int { return h.Assigned }},
		{"handed (decoding)", green, func(h agent.HeldSample) int { return h.Handed }},
		{"held (aborted, waiting for drain/fence/timeout)", red, func(h agent.HeldSample) int { return h.Held }},
		{"in use (all three)", grey, func(h agent.HeldSample) int { return h.Assigned + h.Handed + h.Held }},
	} {
		xys := make(plotter.XYs, len(series))
		for i, s := range series {
			xys[i] = plotter.XY{X: s.T, Y: float64(c.get(s))}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = c.col, vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(c.name, l)
	}
	pool, err := plotter.NewLine(plotter.XYs{{X: 0, Y: float64(poolSlots)}, {X: tmax, Y: float64(poolSlots)}})
	if err != nil {
		return nil, err
	}
	pool.Color, pool.Width, pool.Dashes = black, vg.Points(1), []vg.Length{vg.Points(6), vg.Points(3)}
	p.Legend.Top = true
	// Room for the legend above the curves. A pool far above the peak
	// would flatten them: then it is named in the legend, not drawn.
	if float64(peak)*2 >= float64(poolSlots) {
		p.Add(pool)
		p.Legend.Add(fmt.Sprintf("pool size (%d slots)", poolSlots), pool)
		p.Y.Min, p.Y.Max = 0, float64(poolSlots)*1.5
	} else {
		p.Legend.Add(fmt.Sprintf("pool size %d slots: off the chart (peak use %d)", poolSlots, peak), pool)
		p.Y.Min, p.Y.Max = 0, float64(peak)*1.7
	}
	p.X.Min = 0
	p.X.Tick.Marker, p.Y.Tick.Marker = plainTicks{}, plainTicks{}
	return p, nil
}

// errPoints are points with asymmetric y errors (a mean and its CI).
type errPoints struct {
	plotter.XYs
	plotter.YErrors
}

// armThroughputPlot draws each arm's steady-state req/s: every rep as a
// grey dot, the mean with its 95% CI as a bar; an arm that corrupted pages
// is drawn red and says so under its name.
func armThroughputPlot(arms []*benchArm) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Throughput per arm (higher is better): reps and mean with 95% CI"
	p.Y.Label.Text = "requests/s (steady state)"
	p.Add(plotter.NewGrid())
	names := make([]string, len(arms))
	for i, a := range arms {
		names[i] = a.Name
		col := color.Color(blue)
		if a.CorruptPages > 0 {
			names[i] = fmt.Sprintf("%s\n%d CORRUPT PAGES", a.Name, a.CorruptPages)
			col = red
		}
		dots, m, err := addArmPoints(p, i, a.ReqPerSec, a.MeanReqPerSec, a.CI95Low, a.CI95High, col)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			p.Legend.Add("one rep", dots)
			p.Legend.Add("mean, 95% CI", m)
		}
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(arms))-0.15
	p.Y.Tick.Marker = plainTicks{}
	p.Legend.Top = true
	return p, nil
}

// addArmPoints draws arm i's reps as grey dots around x = i and their
// mean with its CI [lo, hi] as a bar in col.
func addArmPoints(p *plot.Plot, i int, reps []float64, mean, lo, hi float64, col color.Color) (dots, m *plotter.Scatter, err error) {
	xy := make(plotter.XYs, len(reps))
	for j, r := range reps {
		xy[j] = plotter.XY{X: float64(i) - 0.15 + 0.3*float64(j)/float64(max(1, len(reps)-1)), Y: r}
	}
	if dots, err = plotter.NewScatter(xy); err != nil {
		return nil, nil, err
	}
	dots.Color, dots.Radius, dots.Shape = grey, vg.Points(2.5), draw.CircleGlyph{}
	mp := errPoints{XYs: plotter.XYs{{X: float64(i), Y: mean}}, YErrors: plotter.YErrors{{Low: mean - lo, High: hi - mean}}}
	bars, err := plotter.NewYErrorBars(mp)
	if err != nil {
		return nil, nil, err
	}
	bars.Color, bars.Width, bars.CapWidth = col, vg.Points(2), vg.Points(14)
	if m, err = plotter.NewScatter(mp.XYs); err != nil {
		return nil, nil, err
	}
	m.Color, m.Radius, m.Shape = col, vg.Points(4), draw.BoxGlyph{}
	p.Add(dots, bars, m)
	return dots, m, nil
}

// deltaPlot draws the paired per-rep deltas of d and their mean with its
// 95% CI against a dashed line at 0: a CI crossing it cannot tell the arms
// apart.
func deltaPlot(d benchDelta) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Paired delta, %s vs %s (higher is better)", d.Of, d.Against)
	p.X.Label.Text = "throughput delta (%)"
	p.Add(plotter.NewGrid())
	reps := make(plotter.XYs, len(d.PerRep))
	lo, hi := 0.0, 0.0
	for i, x := range d.PerRep {
		reps[i] = plotter.XY{X: x, Y: 0.6}
		lo, hi = min(lo, x), max(hi, x)
	}
	dots, err := plotter.NewScatter(reps)
	if err != nil {
		return nil, err
	}
	dots.Color, dots.Radius, dots.Shape = grey, vg.Points(3), draw.CircleGlyph{}
	col := color.Color(blue)
	if !d.SpansZero && d.Pct < 0 {
		col = orange
	}
	ci, err := plotter.NewLine(plotter.XYs{{X: d.CI95Low, Y: 0.3}, {X: d.CI95High, Y: 0.3}})
	if err != nil {
		return nil, err
	}
	ci.Color, ci.Width = col, vg.Points(3)
	mean, err := plotter.NewScatter(plotter.XYs{{X: d.Pct, Y: 0.3}})
	if err != nil {
		return nil, err
	}
	mean.Color, mean.Radius, mean.Shape = col, vg.Points(5), draw.BoxGlyph{}
	lo, hi = min(lo, d.CI95Low), max(hi, d.CI95High)
	zero, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 0, Y: 1}})
	if err != nil {
		return nil, err
	}
	zero.Color, zero.Dashes = black, []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(dots, ci, mean, zero)
	p.Legend.Add("one rep (paired)", dots)
	p.Legend.Add(fmt.Sprintf("mean %+.2f%%, 95%% CI [%+.2f%%, %+.2f%%]", d.Pct, d.CI95Low, d.CI95High), ci)
	p.Legend.Add("no difference", zero)
	p.Legend.Top = true
	pad := max(0.5, (hi-lo)*0.1)
	p.X.Min, p.X.Max = lo-pad, hi+pad
	p.Y.Min, p.Y.Max = 0, 2.1 // the legend sits above the zero line's end
	p.X.Tick.Marker = plainTicks{}
	p.HideY()
	return p, nil
}

// plainTicks are gonum's default ticks labelled without trailing zeros
// (5000, not 5000.00), and at least three of them.
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	labelled := 0
	for _, t := range ts {
		if t.Label != "" {
			labelled++
		}
	}
	for i := range ts {
		// With fewer than three labels, the minor ticks get one too.
		if ts[i].Label != "" || labelled < 3 {
			ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', -1, 64)
		}
	}
	return ts
}

// plotImg renders p as a PNG <img> with alt text, or a sentence saying
// why there is no chart when p is nil.
func plotImg(p *plot.Plot, w, h vg.Length, alt, empty string) (string, error) {
	if p == nil {
		return fmt.Sprintf("<p class=empty>%s</p>", html.EscapeString(empty)), nil
	}
	png, err := plotPNG(p, w, h)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`<img alt="%s" src="data:image/png;base64,%s">`, html.EscapeString(alt), base64.StdEncoding.EncodeToString(png)), nil
}

func plotPNG(p *plot.Plot, w, h vg.Length) ([]byte, error) {
	wt, err := p.WriterTo(w, h, "png")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func fmtMs(ms float64) string {
	if ms >= 1000 {
		return fmt.Sprintf("%.2f s", ms/1000)
	}
	return fmt.Sprintf("%.1f ms", ms)
}
