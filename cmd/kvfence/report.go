package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"sort"
	"strings"
)

// writeReport writes a self-contained HTML page: the summary, hold
// durations by release path (sorted, one curve per path) and held capacity
// over time, as inline SVG.
func writeReport(path string, s *demoSummary) error {
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html><html><head><meta charset=utf-8><title>kvfence demo</title>"+
		"<style>body{font-family:sans-serif;margin:2em}td{padding:2px 10px}svg{border:1px solid #ccc}</style></head><body>")
	fmt.Fprintf(&b, "<h1>kvfence demo — %s</h1><table>", html.EscapeString(s.Variant))
	row := func(k string, v any) { fmt.Fprintf(&b, "<tr><td>%s</td><td><b>%v</b></td></tr>", k, v) }
	row("requests", s.Requests)
	row("handoffs", s.Handoffs)
	row("aborts", s.Aborts)
	row("released drained / fenced / timeout / completed / unsafe", fmt.Sprintf("%d / %d / %d / %d / %d",
		s.ReleasedDrained, s.ReleasedFenced, s.ReleasedTimeout, s.ReleasedDone, s.ReleasedUnsafe))
	row("pages verified", s.PagesVerified)
	row("corrupt pages", s.CorruptPages)
	row("fence (per-exposure keys)", s.Fence)
	row("seconds", fmt.Sprintf("%.1f", s.Seconds))
	b.WriteString("</table>")

	b.WriteString("<h2>Hold durations by release path</h2><p>Each curve: the holds of aborted requests released by that path, sorted (x = rank, y = ms).</p>")
	var paths []string
	for p := range s.holds {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var curves []curve
	colors := map[string]string{"drained": "#2a7", "fenced": "#27c", "timeout": "#c72", "unsafe": "#c22"}
	for _, p := range paths {
		v := append([]float64(nil), s.holds[p]...)
		sort.Float64s(v)
		c := curve{name: fmt.Sprintf("%s (%d)", p, len(v)), color: colors[p]}
		for i, y := range v {
			c.x = append(c.x, float64(i)/math.Max(1, float64(len(v)-1)))
			c.y = append(c.y, y)
		}
		curves = append(curves, c)
	}
	b.WriteString(svgPlot(curves, "share of holds", "hold ms"))

	b.WriteString("<h2>Held capacity over time</h2><p>Decode slots by state, sampled every 100 ms.</p>")
	held := curve{name: "held (aborting)", color: "#c22"}
	asg := curve{name: "assigned", color: "#27c"}
	hnd := curve{name: "handed", color: "#2a7"}
	for _, p := range s.series {
		held.x, held.y = append(held.x, p.T), append(held.y, float64(p.Held))
		asg.x, asg.y = append(asg.x, p.T), append(asg.y, float64(p.Assigned))
		hnd.x, hnd.y = append(hnd.x, p.T), append(hnd.y, float64(p.Handed))
	}
	b.WriteString(svgPlot([]curve{held, asg, hnd}, "seconds", "slots"))
	b.WriteString("</body></html>")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

type curve struct {
	name, color string
	x, y        []float64
}

func svgPlot(cs []curve, xl, yl string) string {
	const W, H, m = 720.0, 300.0, 50.0
	var xmax, ymax float64 = 1e-9, 1e-9
	for _, c := range cs {
		for i := range c.x {
			xmax, ymax = math.Max(xmax, c.x[i]), math.Max(ymax, c.y[i])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%v" height="%v" xmlns="http://www.w3.org/2000/svg">`, W, H+30)
	fmt.Fprintf(&b, `<line x1="%v" y1="%v" x2="%v" y2="%v" stroke="#000"/><line x1="%v" y1="%v" x2="%v" y2="%v" stroke="#000"/>`, m, H-m, W-10, H-m, m, 10, m, H-m)
	fmt.Fprintf(&b, `<text x="%v" y="%v" font-size="12">%s (max %.3g)</text><text x="5" y="20" font-size="12">%s (max %.4g)</text>`, W/2, H-m+30, xl, xmax, yl, ymax)
	for i, c := range cs {
		if len(c.x) == 0 {
			continue
		}
		var pts strings.Builder
		for j := range c.x {
			fmt.Fprintf(&pts, "%.1f,%.1f ", m+(W-10-m)*c.x[j]/xmax, (H-m)-(H-m-10)*c.y[j]/ymax)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, c.color, pts.String())
		fmt.Fprintf(&b, `<text x="%v" y="%v" font-size="12" fill="%s">%s</text>`, W-200, 20+16*i, c.color, html.EscapeString(c.name))
	}
	b.WriteString("</svg>")
	return b.String()
}
