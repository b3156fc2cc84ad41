package main

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/internal/demo"
)

func syntheticHolds(rng *rand.Rand, n int, base, spread float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = base + spread*rng.ExpFloat64()
	}
	return v
}

func syntheticSeries(pool int) []agent.HeldSample {
	var s []agent.HeldSample
	for i := range 80 {
		t := float64(i) / 10
		s = append(s, agent.HeldSample{T: t, Assigned: pool / 3, Handed: pool / 4, Held: (i % 20) * pool / 80})
	}
	return s
}

func readReport(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// checkReport wants charts embedded images and the corrupt pages
// highlighted; KVFENCE_REPORT_SAMPLES=dir copies the page there to look at.
func checkReport(t *testing.T, path string, charts int, corrupt string) {
	t.Helper()
	page := readReport(t, path)
	if n := strings.Count(page, `src="data:image/png;base64,`); n != charts {
		t.Errorf("%s: want %d charts, got %d", path, charts, n)
	}
	if !strings.Contains(page, corrupt) {
		t.Errorf("%s: corrupt pages are not highlighted (%q)", path, corrupt)
	}
	if dir := os.Getenv("KVFENCE_REPORT_SAMPLES"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, filepath.Base(path)), []byte(page), 0o644)
	}
}

// The demo report draws its two charts as images with a real plotting
// library, marks corrupt pages, and says so in words instead of drawing an
// empty chart (no "max 1e-09").
func TestDemoReportDrawsChartsOrSaysWhyNot(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dir := t.TempDir()
	s := &demo.Summary{Variant: "safe", Requests: 100, Aborts: 30, CorruptPages: 3, PoolSlots: 4096,
		Holds:  map[string][]float64{"drained": syntheticHolds(rng, 25, 300, 200), "timeout": syntheticHolds(rng, 5, 2500, 100)},
		Series: syntheticSeries(4096)}
	full := filepath.Join(dir, "full.html")
	if err := writeReport(full, s); err != nil {
		t.Fatal(err)
	}
	checkReport(t, full, 2, "class=bad>3 corrupt")
	empty := filepath.Join(dir, "empty.html")
	if err := writeReport(empty, &demo.Summary{Variant: "safe", PoolSlots: 4096}); err != nil {
		t.Fatal(err)
	}
	page := readReport(t, empty)
	if strings.Contains(page, "<img") || strings.Contains(page, "1e-09") || !strings.Contains(page, "nothing to draw") {
		t.Errorf("a run without holds or samples drew a chart: %.300s", page)
	}
}

// The bench report draws throughput per arm with its CI, the paired delta
// against 0, holds by arm and path, and each arm's held capacity.
func TestBenchReportDrawsEveryChart(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	safe := &benchArm{Name: "safe"}
	unsafe := &benchArm{Name: "release-on-abort", unsafe: "release-on-abort"}
	for i := range 5 {
		seed := uint64(i + 1)
		safe.add(&demo.Summary{SteadyRequestsPerSec: 100 + rng.NormFloat64()*2, Aborts: 30, PoolSlots: 640,
			HoldSlotSec: map[string]float64{"drained": 90}, Series: syntheticSeries(640),
			Holds: map[string][]float64{"drained": syntheticHolds(rng, 25, 600, 100), "timeout": syntheticHolds(rng, 5, 2100, 50)}}, seed)
		unsafe.add(&demo.Summary{SteadyRequestsPerSec: 104 + rng.NormFloat64()*2, Aborts: 30, CorruptPages: 7, PoolSlots: 640,
			Series: syntheticSeries(640), Holds: map[string][]float64{"unsafe": syntheticHolds(rng, 30, 0, 0.2)}}, seed)
	}
	safe.finish()
	unsafe.finish()
	if safe.HeldSlotSecPerAbort != 3 || safe.Holds["drained"] != 125 {
		t.Fatalf("pooled wrong: %v held slot-s per abort, %d drained holds", safe.HeldSlotSecPerAbort, safe.Holds["drained"])
	}
	res := &benchResult{Reps: 5, Requests: 512, Concurrency: 128, AbortShare: 0.25, Slots: 640, Scarce: true,
		Arms: []*benchArm{safe, unsafe}, Delta: newBenchDelta(safe, unsafe)}
	path := filepath.Join(t.TempDir(), "bench.html")
	if err := writeBenchReport(path, res); err != nil {
		t.Fatal(err)
	}
	// throughput, delta, holds, and one capacity chart per arm
	checkReport(t, path, 5, "class=bad>35 corrupt")
}

// The paired delta and its verdict: a CI that spans 0 says the run cannot
// tell the arms apart; one that excludes it names the slower arm.
func TestBenchDeltaVerdict(t *testing.T) {
	a := &benchArm{Name: "safe", ReqPerSec: []float64{95, 96, 94, 95, 97}}
	b := &benchArm{Name: "release-on-abort", ReqPerSec: []float64{100, 100, 100, 100, 100}}
	d := newBenchDelta(a, b)
	if d.SpansZero || d.Pct > -3 || d.Pct < -6 || !strings.Contains(d.Verdict, "safe is slower") {
		t.Errorf("a clear 5%% cost: %+v", d)
	}
	noisy := &benchArm{Name: "safe", ReqPerSec: []float64{90, 110, 95, 105, 100}}
	if d := newBenchDelta(noisy, b); !d.SpansZero || !strings.Contains(d.Verdict, "spans 0") {
		t.Errorf("noise read as a difference: %+v", d)
	}
	// Student's t, not the normal quantile, for few reps.
	if q := tQuantile975(4); q < 2.77 || q > 2.78 {
		t.Errorf("t(0.975, 4) = %v, want 2.776", q)
	}
}
