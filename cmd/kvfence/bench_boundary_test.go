package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// kvfence bench boundary, end to end (real plugin processes, one rep):
// every arm, the paired intervals, the noise floor (the in-process arm
// against its twin), the goals, and a report with one chart per size. The
// numbers are not judged (they are the machine's); their presence is.
func TestBenchBoundaryReportsArmsIntervalsNoiseFloorAndPlots(t *testing.T) {
	if testing.Short() {
		t.Skip("starts plugin processes")
	}
	report := filepath.Join(t.TempDir(), "boundary.html")
	cmd := exec.Command(agentExe, "bench", "boundary", "--json", "--reps", "2", "--load", "1", "--report", report)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kvfence bench boundary: %v\n%s", err, stderr.String())
	}
	var res map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("--json: %v: %s", err, stdout.String())
	}
	for _, size := range []string{"4k", "64k", "1m"} {
		for _, k := range []string{"in_process_us_per_batch_", "in_process_twin_us_per_batch_", "out_of_process_us_per_batch_",
			"v1_out_of_process_us_per_batch_", "sync_out_of_process_us_per_batch_", "grpc_out_of_process_us_per_batch_",
			"boundary_added_us_per_batch_", "boundary_added_us_per_batch_ci95_low_", "boundary_added_us_per_batch_ci95_high_",
			"noise_floor_boundary_added_us_per_batch_", "noise_floor_boundary_added_us_per_batch_ci95_high_",
			"throughput_ratio_", "throughput_ratio_ci95_low_", "v1_throughput_ratio_", "sync_throughput_ratio_", "grpc_throughput_ratio_",
			"out_of_process_context_switches_per_batch_"} {
			if _, ok := res[k+size].(float64); !ok {
				t.Errorf("no %s%s in %s", k, size, stdout.String())
			}
		}
	}
	if _, ok := res["goal_met_4k"].(bool); !ok || res["load_processes"] != 1.0 {
		t.Errorf("goals or load missing: %s", stdout.String())
	}
	if page := readReport(t, report); strings.Count(page, `src="data:image/png;base64,`) != 3 || !strings.Contains(page, "noise floor") {
		t.Errorf("report: want the table and 3 charts (one per size)")
	}
}
