package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// kvfence bench, end to end on a tiny workload (real rank and plugin
// processes, the tagged build), at 0% and 50% aborts: the shipped default
// (fence on) against release-on-abort (no fence) and against its twin (the
// noise floor). With aborts the arms must differ where
// safety lives — the known-unsafe arm frees at once (about no held slot-seconds)
// and its late writes corrupt pages; the safe arm holds and corrupts none.
// If the arms ran without aborts (the A/A bench this replaces), both
// would show zero holds and zero corrupt pages and this test would fail.
func TestBenchMeasuresTheCostOfSafetyWithAborts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts rank processes")
	}
	// Two arms of rank processes, each a whole bench run (minutes under -race).
	if os.Getenv("KVFENCE_TEST_QUICK") != "" {
		t.Skip("long test: make test-long runs it")
	}
	exe := unsafeBinary(t)
	report := filepath.Join(t.TempDir(), "bench.html")
	cmd := exec.Command(exe, "bench", "--json", "--reps", "2", "--requests", "48", "--concurrency", "12",
		"--page-every", "2ms", "--decode-for", "100ms", "--data-delay", "150ms,1ms", "--abort-share", "0,0.5", "--scarce",
		"--report", report)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kvfence bench: %v\n%s", err, stderr.String())
	}
	var run benchRun
	if err := json.Unmarshal(stdout.Bytes(), &run); err != nil || len(run.Results) != 2 {
		t.Fatalf("bench --json: %v (want one result per abort share): %s", err, stdout.String())
	}
	if noAborts := run.Results[0]; noAborts.AbortShare != 0 || noAborts.Arms[0].Aborts != 0 {
		t.Errorf("the 0%% share aborted %d requests", noAborts.Arms[0].Aborts)
	}
	res := run.Results[1]
	if len(res.Arms) != 3 || res.Arms[0].Name != "safe" || res.Arms[1].Name != "release-on-abort" || res.Arms[2].Name != "safe-twin" ||
		!res.Scarce || res.Slots != 12*20/4 || res.AbortShare != 0.5 {
		t.Fatalf("arms or mode: %s", stdout.String())
	}
	// The comparison is the shipped default (fence on) against the unsafe
	// arm, which fences nothing; the twin is the default again.
	if !res.Fence || !res.Arms[0].Fence || res.Arms[1].Fence || !res.Arms[2].Fence {
		t.Fatalf("fence per arm: safe %v, release-on-abort %v, twin %v; want on, off, on", res.Arms[0].Fence, res.Arms[1].Fence, res.Arms[2].Fence)
	}
	if len(res.NoiseFloor.PerRep) != 2 || res.NoiseFloor.Against != "safe-twin" || res.LoadAverage[0] <= 0 {
		t.Errorf("noise floor %+v, load %v", res.NoiseFloor, res.LoadAverage)
	}
	safe, unsafe := res.Arms[0], res.Arms[1]
	if safe.Aborts == 0 || unsafe.Aborts == 0 {
		t.Fatalf("no aborts in an arm (safe %d, unsafe %d): the comparison would be A/A", safe.Aborts, unsafe.Aborts)
	}
	if safe.CorruptPages != 0 || len(res.SafeArmFailures) != 0 {
		t.Errorf("safe arm: %d corrupt pages, failures %v", safe.CorruptPages, res.SafeArmFailures)
	}
	if unsafe.CorruptPages == 0 {
		t.Errorf("release-on-abort showed no corrupt pages with %d aborts: the bench does not exercise what safety prevents", unsafe.Aborts)
	}
	if safe.HeldSlotSecPerAbort <= 0 || unsafe.HeldSlotSecPerAbort*10 > safe.HeldSlotSecPerAbort {
		t.Errorf("held slot-seconds per abort: safe %v (want > 0), release-on-abort %v (want about 0)", safe.HeldSlotSecPerAbort, unsafe.HeldSlotSecPerAbort)
	}
	// CPU per request is counted in every rep for the rank processes with
	// their plugins (a probe that missed them reads 0 there) and for the
	// router (this tiny run's router may use less than /proc's 10 ms tick).
	for _, a := range res.Arms {
		_, router := a.CPUPartsMs["router"]
		if len(a.CPUMsPerRequest) != 2 || a.MeanCPUMsPerRequest <= 0 || !router || a.CPUPartsMs["decode"] <= 0 || a.CPUPartsMs["prefill"] <= 0 {
			t.Errorf("arm %s: CPU ms per request %v, by part %v", a.Name, a.CPUMsPerRequest, a.CPUPartsMs)
		}
	}
	// The fence's plugin round trips: at least a grant per request in the
	// safe arm, none where nothing is fenced.
	if safe.KeyCallsPerRequest <= 0 || unsafe.KeyCallsPerRequest != 0 {
		t.Errorf("key calls per request: safe %v (want > 0), release-on-abort %v (want 0)", safe.KeyCallsPerRequest, unsafe.KeyCallsPerRequest)
	}
	if len(res.Delta.PerRep) != 2 || res.Delta.Verdict == "" || res.Better["req_per_s"] != "higher" {
		t.Errorf("delta: %+v", res.Delta)
	}
	if page := readReport(t, sharePath(report, 0.5)); strings.Count(page, "data:image/png") != 6 || !strings.Contains(page, "class=bad") {
		t.Errorf("report: want 5 charts and the unsafe arm's corrupt pages highlighted")
	}
}
