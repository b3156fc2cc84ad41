package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"

	"github.com/kvfence/kvfence/plugins/tcp"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// boundarySizes are the op sizes of kvfence bench boundary, by JSON suffix.
var boundarySizes = []struct {
	name    string
	bytes   uint64
	batches int
}{{"4k", 4 << 10, 2048}, {"64k", 64 << 10, 1024}, {"1m", 1 << 20, 256}}

// boundaryArm is one sender: the embedded TCP transport in this process,
// or as its own plugin process over the rings or over gRPC.
type boundaryArm struct {
	name string
	rig  *sdktest.BoundaryRig
	us   map[string][]float64 // per size: µs per batch, one per rep
	cpu  map[string][]float64 // per size: CPU µs per batch (both processes)
	sw   map[string][]float64 // per size: context switches per batch (both processes)
}

// kvfence bench boundary: what crossing the plugin boundary costs per
// batch, measured side by side in one run.
func newBenchBoundaryCommand() *cobra.Command {
	var reps, window int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "boundary",
		Short: "plugin boundary cost: TCP sender out of process (rings with the default asynchronous Post, rings with synchronous Post, gRPC) vs in process, 4 KiB/64 KiB/1 MiB, interleaved",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBoundary(cmd.Context(), reps, window, asJSON)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&reps, "reps", 5, "interleaved repetitions per arm and size")
	fl.IntVar(&window, "window", 64, "batches in flight")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// boundaryArms starts one in-process receiver and four senders: in
// process, this executable as a plugin on the rings as every host opens it
// (asynchronous Post, the default), again with synchronous Post
// (OpenOptions.SyncPost), and with the rings off (KVFENCE_RINGS=off while
// it is opened: the gRPC data path).
func boundaryArms(ctx context.Context) ([]*boundaryArm, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	newTCP := func() (*tcp.Transport, error) {
		t, err := tcp.New(tcp.Config{}, hclog.NewNullLogger())
		if err == nil {
			closers = append(closers, func() { _ = t.Close() })
		}
		return t, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, closeAll, err
	}
	open := func(dataPath sdk.DataPath, async bool) (*sdk.Plugin, error) {
		if dataPath == sdk.DataPathGRPC {
			os.Setenv("KVFENCE_RINGS", "off")
			defer os.Unsetenv("KVFENCE_RINGS")
		}
		p, err := sdk.Open(self, sdk.OpenOptions{Args: []string{"__plugin-tcp"}, SyncPost: !async})
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() { _ = p.Close() })
		if p.DataPath() != dataPath || p.AsyncPost() != async {
			return nil, fmt.Errorf("plugin data path %s (async %v), want %s (async %v)", p.DataPath(), p.AsyncPost(), dataPath, async)
		}
		return p, nil
	}
	recv, err := newTCP()
	if err != nil {
		return nil, closeAll, err
	}
	in, err := newTCP()
	if err != nil {
		return nil, closeAll, err
	}
	rings, err := open(sdk.DataPathRings, true)
	if err != nil {
		return nil, closeAll, err
	}
	viaGRPC, err := open(sdk.DataPathGRPC, false)
	if err != nil {
		return nil, closeAll, err
	}
	syncPost, err := open(sdk.DataPathRings, false)
	if err != nil {
		return nil, closeAll, err
	}
	var arms []*boundaryArm
	for _, a := range []struct {
		name string
		s    sdk.Transport
		pid  int
	}{{"in_process", in, 0}, {"out_of_process", rings.Transport(), rings.Pid()}, {"grpc_out_of_process", viaGRPC.Transport(), viaGRPC.Pid()},
		{"sync_out_of_process", syncPost.Transport(), syncPost.Pid()}} {
		rig, err := sdktest.NewBoundaryRig(ctx, a.s, recv, a.pid, 64<<20)
		if err != nil {
			return nil, closeAll, fmt.Errorf("%s: %w", a.name, err)
		}
		closers = append(closers, rig.Close)
		arms = append(arms, &boundaryArm{name: a.name, rig: rig, us: map[string][]float64{}, cpu: map[string][]float64{}, sw: map[string][]float64{}})
	}
	return arms, closeAll, nil
}

// boundaryReport: medians per arm and size, and the boundary's cost as
// differences and throughput ratios against the in-process arm.
func boundaryReport(arms []*boundaryArm, reps, window int) map[string]any {
	res := map[string]any{"reps": reps, "window": window, "ops_per_batch": 1, "transport": "tcp",
		"data_path": string(sdk.DataPathRings), "default_post": "async",
		"note": "median of interleaved reps; this machine is shared, so absolute numbers are noisy: read the ratios"}
	in := arms[0]
	for _, size := range boundarySizes {
		n := size.name
		base := median(in.us[n])
		res["batches_"+n] = size.batches
		for _, a := range arms {
			us := median(a.us[n])
			res[a.name+"_us_per_batch_"+n] = us
			res[a.name+"_cpu_us_per_batch_"+n] = median(a.cpu[n])
			res[a.name+"_context_switches_per_batch_"+n] = median(a.sw[n])
			if a == in {
				continue
			}
			prefix, _ := strings.CutSuffix(a.name, "out_of_process")
			res[prefix+"boundary_added_us_per_batch_"+n] = us - base
			lo, hi := pairedRange(a.us[n], in.us[n])
			res[prefix+"boundary_added_us_per_batch_min_"+n] = lo
			res[prefix+"boundary_added_us_per_batch_max_"+n] = hi
			res[prefix+"throughput_ratio_"+n] = base / us
		}
	}
	return res
}

// pairedRange is the spread of the added cost: each rep's arm minus the
// same rep's in-process run (the two ran back to back, at the same load).
func pairedRange(arm, base []float64) (lo, hi float64) {
	for i := range min(len(arm), len(base)) {
		d := arm[i] - base[i]
		if i == 0 || d < lo {
			lo = d
		}
		if i == 0 || d > hi {
			hi = d
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

// runBoundary is kvfence bench boundary: every arm and size, reps times,
// interleaved, then the report.
func runBoundary(ctx context.Context, reps, window int, asJSON bool) error {
	if reps < 1 || reps > 1000 || window < 1 || window > 1024 {
		return usagef("--reps must be 1..1000 and --window 1..1024")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	arms, closeAll, err := boundaryArms(ctx)
	defer closeAll()
	if err != nil {
		return err
	}
	if err := measureBoundary(ctx, arms, reps, window); err != nil {
		return err
	}
	res := boundaryReport(arms, reps, window)
	if asJSON {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return nil
	}
	printBoundary(res, reps, window)
	return nil
}

// measureBoundary runs each arm and size reps times, rotating which arm
// goes first, after one warm-up run of every arm.
func measureBoundary(ctx context.Context, arms []*boundaryArm, reps, window int) error {
	for rep := 0; rep < reps; rep++ {
		for _, size := range boundarySizes {
			for j := range arms {
				a := arms[(rep+j)%len(arms)] // rotate which arm goes first
				if rep == 0 && j == 0 {
					for _, w := range arms { // warm up connections and mappings
						if _, err := w.rig.Run(ctx, window, window, size.bytes); err != nil {
							return fmt.Errorf("%s: %w", w.name, err)
						}
					}
				}
				r, err := a.rig.Run(ctx, size.batches, window, size.bytes)
				if err != nil {
					return fmt.Errorf("%s %s: %w", a.name, size.name, err)
				}
				a.us[size.name] = append(a.us[size.name], r.MicrosPerBatch())
				a.cpu[size.name] = append(a.cpu[size.name], r.CPUMicrosPerBatch())
				a.sw[size.name] = append(a.sw[size.name], r.SwitchesPerBatch())
			}
		}
		fmt.Fprintf(os.Stderr, "rep %d/%d done\n", rep+1, reps)
	}
	return nil
}

// printBoundary prints the report for a person.
func printBoundary(res map[string]any, reps, window int) {
	fmt.Printf("plugin boundary, TCP sender, one write per batch, %d in flight, median [min, max] of %d interleaved reps, each paired with its own in-process run (noisy on a shared machine: read the ratios)\n", window, reps)
	for _, size := range boundarySizes {
		n := size.name
		fmt.Printf("  %-4s in-process %7.1f µs/batch  rings (default, async Post) %7.1f (+%.1f [%.1f, %.1f], throughput %.3f)  rings+sync Post %7.1f (+%.1f [%.1f, %.1f], throughput %.3f)  gRPC %7.1f (+%.1f, throughput %.3f)\n", n,
			res["in_process_us_per_batch_"+n], res["out_of_process_us_per_batch_"+n], res["boundary_added_us_per_batch_"+n],
			res["boundary_added_us_per_batch_min_"+n], res["boundary_added_us_per_batch_max_"+n],
			res["throughput_ratio_"+n], res["sync_out_of_process_us_per_batch_"+n], res["sync_boundary_added_us_per_batch_"+n],
			res["sync_boundary_added_us_per_batch_min_"+n], res["sync_boundary_added_us_per_batch_max_"+n],
			res["sync_throughput_ratio_"+n], res["grpc_out_of_process_us_per_batch_"+n], res["grpc_boundary_added_us_per_batch_"+n],
			res["grpc_throughput_ratio_"+n])
	}
}
