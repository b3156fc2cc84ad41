package main

import (
	"fmt"
	"html"
	"os"
	"strings"

	"gonum.org/v1/plot/vg"

	"github.com/kvfence/kvfence/internal/demo"
)

// reportStyle is shared by the demo's and bench's HTML reports; .bad marks
// what broke the promise (corrupt pages) so it cannot be missed.
const reportStyle = `<style>body{font-family:sans-serif;margin:2em;max-width:1000px}` +
	`td,th{padding:3px 10px;text-align:right}th{background:#eee}td:first-child{text-align:left}` +
	`.bad{background:#c22;color:#fff;font-weight:bold}.ok{color:#292}.empty{color:#777;font-style:italic}` +
	`img{display:block;margin:1em 0}</style>`

const chartW, chartH = 9 * vg.Inch, 4.5 * vg.Inch

// htmlReport accumulates a report page.
type htmlReport struct{ b strings.Builder }

func newHTMLReport(title string) *htmlReport {
	r := &htmlReport{}
	fmt.Fprintf(&r.b, "<!doctype html><html><head><meta charset=utf-8><title>%s</title>%s</head><body><h1>%s</h1>",
		html.EscapeString(title), reportStyle, html.EscapeString(title))
	return r
}

func (r *htmlReport) raw(s string) { r.b.WriteString(s) }
func (r *htmlReport) para(format string, a ...any) {
	r.b.WriteString("<p>" + html.EscapeString(fmt.Sprintf(format, a...)) + "</p>")
}
func (r *htmlReport) heading(s string) { r.b.WriteString("<h2>" + html.EscapeString(s) + "</h2>") }

// corruptCell shows a corrupt-page count, highlighted when above zero.
func corruptCell(n int) string {
	if n > 0 {
		return fmt.Sprintf("<td class=bad>%d corrupt</td>", n)
	}
	return "<td class=ok>0</td>"
}

func (r *htmlReport) write(path string) error {
	r.b.WriteString("</body></html>")
	return os.WriteFile(path, []byte(r.b.String()), 0o644)
}

// writeReport writes the demo's self-contained HTML page: the summary,
// hold durations by release path with p50/p99, and held capacity over time
// against the pool size.
func writeReport(path string, s *demo.Summary) error {
	r := newHTMLReport("kvfence demo — " + s.Variant)
	r.raw("<table>")
	row := func(k string, v any) {
		fmt.Fprintf(&r.b, "<tr><td>%s</td><td>%s</td></tr>", html.EscapeString(k), html.EscapeString(fmt.Sprint(v)))
	}
	row("requests", s.Requests)
	row("handoffs", s.Handoffs)
	row("aborts", s.Aborts)
	row("released drained / fenced / timeout / completed / unsafe", fmt.Sprintf("%d / %d / %d / %d / %d",
		s.ReleasedDrained, s.ReleasedFenced, s.ReleasedTimeout, s.ReleasedDone, s.ReleasedUnsafe))
	row("pages verified", s.PagesVerified)
	fmt.Fprintf(&r.b, "<tr><td>corrupt pages (of which written while free: %d)</td>%s</tr>", s.FreeWrites, corruptCell(s.CorruptPages))
	row("fence (per-exposure keys)", s.Fence)
	if s.Fence {
		row("revocation of an aborted request's keys", map[bool]string{true: "at the abort", false: "after the drain"}[s.RevokeAtAbort])
	}
	row("decode pool", fmt.Sprintf("%d slots", s.PoolSlots))
	row("seconds", fmt.Sprintf("%.1f (%.0f req/s)", s.Seconds, s.RequestsPerSec))
	r.raw("</table>")

	r.heading("Hold durations of aborted requests, by release path")
	r.para("Cumulative share of holds at most x ms long; circles mark each path's p50, triangles its p99. A hold ends when the request's writes drained, were fenced, or its bound timed out; 'unsafe' is a known-unsafe core freeing at once.")
	var series []holdSeries
	for _, p := range releasePaths(s.Holds) {
		series = append(series, holdSeries{name: p, path: p, holds: s.Holds[p]})
	}
	hp, err := holdsPlot("Hold durations by release path", series)
	if err != nil {
		return err
	}
	img, err := plotImg(hp, chartW, chartH, "hold durations by release path", "No aborted request was held in this run: nothing to draw.")
	if err != nil {
		return err
	}
	r.raw(img)

	r.heading("Held capacity over time")
	r.para("Decode slots by state, sampled every 100 ms, under the pool size: red is capacity that aborted requests still hold.")
	cp, err := capacityPlot("Decode slots by state", s.Series, s.PoolSlots)
	if err != nil {
		return err
	}
	if img, err = plotImg(cp, chartW, chartH, "held capacity over time", "No slot samples in this run."); err != nil {
		return err
	}
	r.raw(img)
	return r.write(path)
}
