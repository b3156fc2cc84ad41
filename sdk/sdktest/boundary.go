package sdktest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvfence/kvfence/sdk"
	"golang.org/x/sys/unix"
)

// BoundaryRig measures what the plugin boundary costs: one sender (in
// process, or a plugin process) posting one-write batches to a receiver,
// a window of them in flight. Run it for an in-process and an
// out-of-process sender of the same transport, interleaved, and compare:
// the difference is the boundary. It measures; it never asserts on speed.
type BoundaryRig struct {
	sender    sdk.Transport
	senderPID int   // the plugin process, for its CPU time; 0 in process
	others    []int // more processes whose CPU and switches count (CountProcess)
	src, dst  *sdk.SharedMemory
	srcID     sdk.RegionID
	key       sdk.Key
	peer      sdk.PeerID
	next      sdk.BatchID
	size      uint64
}

// BoundaryResult is one measurement.
type BoundaryResult struct {
	Batches int
	Wall    time.Duration
	CPU     time.Duration // this process plus the sender's plugin process
	// Switches counts context switches (voluntary and not) of every
	// thread of this process and the plugin process.
	Switches uint64
}

// SwitchesPerBatch is context switches (both processes) per batch.
func (r BoundaryResult) SwitchesPerBatch() float64 {
	return float64(r.Switches) / float64(max(1, r.Batches))
}

// MicrosPerBatch is wall time per batch.
func (r BoundaryResult) MicrosPerBatch() float64 {
	return float64(r.Wall.Nanoseconds()) / 1e3 / float64(max(1, r.Batches))
}

// CPUMicrosPerBatch is CPU time (both processes) per batch.
func (r BoundaryResult) CPUMicrosPerBatch() float64 {
	return float64(r.CPU.Nanoseconds()) / 1e3 / float64(max(1, r.Batches))
}

// NewBoundaryRig registers size bytes at both ends, grants the whole
// destination and connects the sender to the receiver.
func NewBoundaryRig(ctx context.Context, sender, receiver sdk.Transport, senderPID int, size uint64) (*BoundaryRig, error) {
	g := &BoundaryRig{sender: sender, senderPID: senderPID, size: size}
	var err error
	if g.src, err = sdk.NewSharedMemory("boundary-src", size); err != nil {
		return nil, err
	}
	if g.dst, err = sdk.NewSharedMemory("boundary-dst", size); err != nil {
		g.src.Close()
		return nil, err
	}
	fail := func(what string, err error) (*BoundaryRig, error) {
		g.Close()
		return nil, fmt.Errorf("boundary rig: %s: %w", what, err)
	}
	if g.srcID, err = sender.RegisterMemory(ctx, g.src.Desc()); err != nil {
		return fail("register source", err)
	}
	dstID, err := receiver.RegisterMemory(ctx, g.dst.Desc())
	if err != nil {
		return fail("register destination", err)
	}
	granter, ok := receiver.(sdk.Granter)
	if !ok {
		return fail("grant", fmt.Errorf("receiver cannot grant"))
	}
	if g.key, err = granter.Grant(ctx, sdk.Window{Region: dstID, Length: size}); err != nil {
		return fail("grant", err)
	}
	ep, err := receiver.LocalEndpoint(ctx)
	if err != nil {
		return fail("endpoint", err)
	}
	if g.peer, err = sender.Connect(ctx, ep); err != nil {
		return fail("connect", err)
	}
	return g, nil
}

// Run posts batches batches of one opBytes write each, keeping up to
// window in flight, and waits for every completion (each must succeed).
func (g *BoundaryRig) Run(ctx context.Context, batches, window int, opBytes uint64) (BoundaryResult, error) {
	if opBytes == 0 || opBytes > g.size {
		return BoundaryResult{}, fmt.Errorf("boundary rig: op of %d bytes in %d", opBytes, g.size)
	}
	slots := g.size / opBytes
	cpu0, sw0 := g.cpu(), g.switches()
	start := time.Now()
	inflight := 0
	for posted := 0; posted < batches || inflight > 0; {
		for posted < batches && inflight < window {
			g.next++
			off := (uint64(g.next) % slots) * opBytes
			b := sdk.Batch{ID: g.next, Peer: g.peer, Ops: []sdk.Op{{Kind: sdk.OpWrite, LocalRegion: g.srcID,
				LocalOffset: off, RemoteKey: g.key, RemoteOffset: off, Length: opBytes}}}
			if err := g.sender.Post(ctx, b); err != nil {
				return BoundaryResult{}, fmt.Errorf("boundary rig: Post: %w", err)
			}
			posted++
			inflight++
		}
		select {
		case c, ok := <-g.sender.Completions():
			if !ok {
				return BoundaryResult{}, fmt.Errorf("boundary rig: completions closed")
			}
			if c.Status != sdk.Succeeded {
				return BoundaryResult{}, fmt.Errorf("boundary rig: batch %d: %v %s", c.Batch, c.Status, c.Detail)
			}
			inflight--
		case <-ctx.Done():
			return BoundaryResult{}, ctx.Err()
		}
	}
	wall := time.Since(start)
	return BoundaryResult{Batches: batches, Wall: wall, CPU: g.cpu() - cpu0, Switches: g.switches() - sw0}, nil
}

// CountProcess adds pid's CPU time and context switches to every
// result: a receiver in a process of its own is part of the run's cost.
func (g *BoundaryRig) CountProcess(pid int) { g.others = append(g.others, pid) }

// processes are the plugin processes whose cost counts besides this one.
func (g *BoundaryRig) processes() []int {
	if g.senderPID > 0 {
		return append([]int{g.senderPID}, g.others...)
	}
	return g.others
}

// cpu is this process's CPU time plus the plugin processes'.
func (g *BoundaryRig) cpu() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	d := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	for _, pid := range g.processes() {
		d += processCPU(pid)
	}
	return d
}

// switches sums the context switches of this process's threads and the
// plugins' (threads that ended meanwhile are not counted).
func (g *BoundaryRig) switches() uint64 {
	n := threadSwitches(os.Getpid())
	for _, pid := range g.processes() {
		n += threadSwitches(pid)
	}
	return n
}

func threadSwitches(pid int) uint64 {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n uint64
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				c, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// processCPU reads utime+stime of pid from /proc (clock ticks of 10 ms:
// coarse, so measure long enough).
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state); utime is field 14
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const userHZ = 100 // USER_HZ, fixed at 100 for /proc on Linux
	return time.Duration(ut+st) * time.Second / userHZ
}

// Close releases the rig's memory (the transports stay open).
func (g *BoundaryRig) Close() {
	g.src.Close()
	g.dst.Close()
}
