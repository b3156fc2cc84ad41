package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
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
	name   string // JSON: <name>_us_per_batch_<size>
	prefix string // JSON: <prefix>boundary_added_us_per_batch_<size>, against in_process
	label  string // for a person
	rig    *sdktest.BoundaryRig
	us     map[string][]float64 // per size: µs per batch, one per rep
	cpu    map[string][]float64 // per size: CPU µs per batch (both processes)
	sw     map[string][]float64 // per size: context switches per batch (both processes)
}

// boundaryOptions are kvfence bench boundary's flags.
type boundaryOptions struct {
	reps, window, load int
	asJSON             bool
	report             string
	receiver           string // where the receiver runs: in-process or plugin
}

// kvfence bench boundary: what crossing the plugin boundary costs per
// batch, measured side by side in one run.
func newBenchBoundaryCommand() *cobra.Command {
	var o boundaryOptions
	cmd := &cobra.Command{
		Use:   "boundary",
		Short: "plugin boundary cost: TCP sender out of process (rings with the default asynchronous Post, the same on v1 rings with futex doorbells, rings with synchronous Post, gRPC) vs in process (and its twin, the noise floor), 4 KiB/64 KiB/1 MiB, interleaved",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBoundary(cmd.Context(), o)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&o.reps, "reps", 5, "interleaved repetitions per arm and size")
	fl.IntVar(&o.window, "window", 64, "batches in flight")
	fl.IntVar(&o.load, "load", 0, "busy-loop processes to run beside the measurement (machine load), 0..64")
	fl.BoolVar(&o.asJSON, "json", false, "print one JSON object")
	fl.StringVar(&o.report, "report", "", "write an HTML report (charts) to this path")
	fl.StringVar(&o.receiver, "receiver", "in-process", "where the receiver runs: in-process (this process, beside the in-process senders) or plugin (a plugin process of its own, for every arm; its CPU and switches count)")
	return cmd
}

// boundaryArms starts one receiver (in this process, or with --receiver
// plugin in a plugin process of its own, so that no sender shares its Go
// runtime with the receiver) and six senders: in
// process, its twin (in process again: their difference is the noise
// floor), this executable as a plugin on the rings as every host opens it
// (asynchronous Post, the default), again on the older rings with futex
// doorbells (KVFENCE_RINGS=v1 while it is opened: the change of issue 21
// against its own baseline, in the same run), with synchronous Post
// (OpenOptions.SyncPost), and with the rings off (KVFENCE_RINGS=off: the
// gRPC data path).
func boundaryArms(ctx context.Context, receiver string) ([]*boundaryArm, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	newTCP := func() (sdk.Transport, int, error) {
		t, err := tcp.New(tcp.Config{}, hclog.NewNullLogger())
		if err == nil {
			closers = append(closers, func() { _ = t.Close() })
		}
		return t, 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, closeAll, err
	}
	open := func(dataPath sdk.DataPath, async bool, rings string) (sdk.Transport, int, error) {
		if rings != "" { // KVFENCE_RINGS while it is opened: off, or v1 (futex doorbells)
			os.Setenv("KVFENCE_RINGS", rings)
			defer os.Unsetenv("KVFENCE_RINGS")
		}
		p, err := sdk.Open(self, sdk.OpenOptions{Args: []string{"__plugin-tcp"}, SyncPost: !async})
		if err != nil {
			return nil, 0, err
		}
		closers = append(closers, func() { _ = p.Close() })
		if p.DataPath() != dataPath || p.AsyncPost() != async {
			return nil, 0, fmt.Errorf("plugin data path %s (async %v), want %s (async %v)", p.DataPath(), p.AsyncPost(), dataPath, async)
		}
		return p.Transport(), p.Pid(), nil
	}
	recv, recvPID, err := newTCP()
	if receiver == "plugin" {
		recv, recvPID, err = open(sdk.DataPathRings, true, "")
	}
	if err != nil {
		return nil, closeAll, err
	}
	var arms []*boundaryArm
	for _, a := range []struct {
		name, prefix, label string
		start               func() (sdk.Transport, int, error)
	}{
		{"in_process", "", "in-process", newTCP},
		{"in_process_twin", "noise_floor_", "in-process twin (noise floor)", newTCP},
		{"out_of_process", "", "rings, async Post (default)", func() (sdk.Transport, int, error) { return open(sdk.DataPathRings, true, "") }},
		{"v1_out_of_process", "v1_", "rings v1 (futex bells), async", func() (sdk.Transport, int, error) { return open(sdk.DataPathRings, true, "v1") }},
		{"sync_out_of_process", "sync_", "rings, sync Post", func() (sdk.Transport, int, error) { return open(sdk.DataPathRings, false, "") }},
		{"grpc_out_of_process", "grpc_", "gRPC", func() (sdk.Transport, int, error) { return open(sdk.DataPathGRPC, false, "off") }},
	} {
		s, pid, err := a.start()
		if err != nil {
			return nil, closeAll, fmt.Errorf("%s: %w", a.name, err)
		}
		rig, err := sdktest.NewBoundaryRig(ctx, s, recv, pid, 64<<20)
		if err != nil {
			return nil, closeAll, fmt.Errorf("%s: %w", a.name, err)
		}
		closers = append(closers, rig.Close)
		if recvPID != 0 {
			rig.CountProcess(recvPID)
		}
		arms = append(arms, &boundaryArm{name: a.name, prefix: a.prefix, label: a.label, rig: rig,
			us: map[string][]float64{}, cpu: map[string][]float64{}, sw: map[string][]float64{}})
	}
	return arms, closeAll, nil
}

// runBoundary is kvfence bench boundary: every arm and size, reps times,
// interleaved, then the report.
func runBoundary(ctx context.Context, o boundaryOptions) error {
	if o.reps < 1 || o.reps > 1000 || o.window < 1 || o.window > 1024 || o.load < 0 || o.load > 64 {
		return usagef("--reps must be 1..1000, --window 1..1024 and --load 0..64")
	}
	if o.receiver != "in-process" && o.receiver != "plugin" {
		return usagef("--receiver must be in-process or plugin, not %q", o.receiver)
	}
	if o.report != "" {
		if err := checkWritableFile(o.report); err != nil {
			return usagef("--report: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	stopLoad, err := startLoad(o.load)
	defer stopLoad()
	if err != nil {
		return err
	}
	arms, closeAll, err := boundaryArms(ctx, o.receiver)
	defer closeAll()
	if err != nil {
		return err
	}
	load0 := loadAverage()
	if err := measureBoundary(ctx, arms, o.reps, o.window); err != nil {
		return err
	}
	res := boundaryReport(arms, o.reps, o.window)
	res["load_average_1m"] = []float64{load0, loadAverage()}
	res["load_processes"] = o.load
	res["receiver"] = o.receiver
	if o.report != "" {
		if err := writeBoundaryReport(o.report, arms, res); err != nil {
			return err
		}
	}
	if o.asJSON {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return nil
	}
	printBoundary(os.Stdout, arms, res)
	return nil
}

// startLoad starts n busy-loop processes (the machine load of --load);
// the returned function kills and reaps each of them.
func startLoad(n int) (func(), error) {
	var procs []*exec.Cmd
	stop := func() {
		for _, c := range procs {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	for range n {
		c := exec.Command("/bin/sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the bench
		if err := c.Start(); err != nil {
			return stop, fmt.Errorf("--load: %w", err)
		}
		procs = append(procs, c)
	}
	return stop, nil
}

// measureBoundary runs each arm and size reps times, in an order balanced
// over reps (armOrder), after one warm-up run of every arm.
func measureBoundary(ctx context.Context, arms []*boundaryArm, reps, window int) error {
	for rep := 0; rep < reps; rep++ {
		for _, size := range boundarySizes {
			for k, j := range armOrder(len(arms), rep) { // bench_order.go
				a := arms[j]
				if rep == 0 && k == 0 {
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
