package main

import (
	"bytes"
	"strings"
	"testing"
)

// The summary is one line per abort share with the comparison a user
// needs: the default vs release-on-abort with its CI and the goal's
// verdict, beside the noise floor; a share whose CI excludes 0, or whose
// mean costs more than 1%, is not "within 1%".
func TestBenchSummaryOneScreen(t *testing.T) {
	arms := func(safeHeld float64, corrupt int) []*benchArm {
		return []*benchArm{{Name: "safe", HeldSlotSecPerAbort: safeHeld}, {Name: "release-on-abort", CorruptPages: corrupt}, {Name: "safe-twin"}}
	}
	results := []*benchResult{
		{AbortShare: 0, Arms: arms(0, 0), Delta: benchDelta{Pct: -0.4, CI95Low: -2.5, CI95High: 1.7, SpansZero: true},
			NoiseFloor: benchDelta{Pct: 0.3, CI95Low: -1.9, CI95High: 2.5, SpansZero: true}},
		{AbortShare: 0.25, Arms: arms(3.7, 671), Delta: benchDelta{Pct: -5.8, CI95Low: -9.6, CI95High: -2.3, CPUPct: 7.25},
			NoiseFloor: benchDelta{Pct: -0.2, CI95Low: -3, CI95High: 2.6, SpansZero: true},
			FenceCost:  &benchDelta{Pct: -6.1, CI95Low: -8, CI95High: -4}},
		{AbortShare: 0.5, Arms: arms(4, 900), Delta: benchDelta{Pct: -1.6, CI95Low: -4, CI95High: 0.8, SpansZero: true}},
	}
	var b bytes.Buffer
	printBenchSummary(&b, results)
	t.Log("\n" + b.String())
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3+len(results) {
		t.Fatalf("want a title (two lines), a header and one line per share, got:\n%s", b.String())
	}
	for i, want := range [][]string{
		{"0%", "-0.40%", "[-2.50, +1.70]", "yes", "+0.30%", "add --fence-off"},
		{"25%", "-5.80%", "no: CI excludes 0", "-0.20%", "-6.10% [-8.00, -4.00]", "+7.2%", "3.700 | 0.000", "0 | 671"},
		{"50%", "-1.60%", "no: mean below -1%"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[3+i], w) {
				t.Errorf("share line %d lacks %q: %s", i, w, lines[3+i])
			}
		}
	}
}
