package demo

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/errdefs"
)

// Run starts one decode and two prefill rank processes, each with its own
// transport plugin process (and, on the embedded TCP plugin, a delaying
// proxy on decode's data path), and drives the workload from this process
// (the router).
func Run(ctx context.Context, o Options) (*Summary, error) {
	exe, tlsArgs, err := prepareRun(&o, "kvfence-demo-")
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	common := commonArgs(o)
	dec, err := startChild(cctx, exe, decodeArgs(o, append(common, tlsArgs...)), "decode-0.log", o.Dir)
	if err != nil {
		return nil, err
	}
	defer dec.stop()
	preArgs := append(append(append([]string(nil), common...), tlsArgs...), o.PluginArgs(o.PrefillEnv)...)
	pre, stopPre, err := startPrefills(cctx, exe, dec.control, preArgs, o.Dir)
	if err != nil {
		return nil, err
	}
	defer stopPre()
	router, err := dialRun(cctx, o, dec, pre)
	if err != nil {
		return nil, err
	}
	defer router.Close()
	if o.KillPrefillAfter > 0 {
		victim := pre[1].cmd.Process
		t := time.AfterFunc(o.KillPrefillAfter, func() { _ = victim.Kill() })
		defer t.Stop()
	}
	return drive(cctx, o, router, cpuProbe(dec.cmd.Process.Pid, []int{pre[0].cmd.Process.Pid, pre[1].cmd.Process.Pid}))
}

// commonArgs are the __agent flags every rank of a run takes.
func commonArgs(o Options) []string {
	common := []string{"--unsafe", o.Unsafe}
	if o.Checksums {
		common = append(common, "--checksums")
	}
	return append(common, o.AgentArgs...)
}

// decodeArgs is the decode rank's command line: the delaying proxy goes
// on the embedded TCP plugin's data path, except under the restart fence
// (each target instance announces its own endpoint).
func decodeArgs(o Options, common []string) []string {
	dargs := append([]string{"--role", "decode", "--rank", "0", fmt.Sprintf("--fence=%v", o.Fence),
		fmt.Sprintf("--slots=%d", o.PoolSlots())}, common...)
	if o.RestartInstances > 0 {
		dargs = append(dargs, fmt.Sprintf("--restart-fence-instances=%d", o.RestartInstances), "--restart-fence-after="+o.RestartAfter.String())
	} else if len(o.Delays) > 0 && o.Plugin == "" {
		dargs = append(dargs, "--data-delay", delayList(o.Delays))
	}
	dargs = append(dargs, o.PluginArgs(o.DecodeEnv)...)
	if len(o.DataHosts) > 0 {
		dargs = append(dargs, "--advertise-hosts", strings.Join(o.DataHosts, ","))
	}
	return dargs
}

// dialRun connects the router (this process) to the run's ranks.
func dialRun(ctx context.Context, o Options, dec *child, pre []*child) (*Router, error) {
	routerTLS, err := maybeTLS(o.TLS, o.Dir, "router")
	if err != nil {
		return nil, err
	}
	return DialRouter(ctx, dec.control, []string{pre[0].control, pre[1].control}, routerTLS)
}

// plan is one request of a run: its pages, and when the router cancels
// it (<0: never).
type plan struct {
	pages   int
	abortAt time.Duration
}

// makePlans draws the run's requests from o.Seed: plans[room] for rooms
// 1..o.Requests. A cancelled request is cancelled mid-transfer: while its
// pages are still being produced or are in flight on the delayed path.
func makePlans(o Options) []plan {
	rng := rand.New(rand.NewPCG(o.Seed, 7))
	plans := make([]plan, o.Requests+1)
	for i := 1; i <= o.Requests; i++ {
		p := plan{pages: o.MinPages + rng.IntN(o.MaxPages-o.MinPages+1), abortAt: -1}
		if rng.Float64() < o.AbortShare {
			span := time.Duration(p.pages)*o.PageEvery + maxDelay(o.Delays)
			p.abortAt = time.Duration(rng.Int64N(int64(span) + 1))
		}
		plans[i] = p
	}
	return plans
}

// counts are what the router saw of a run's requests.
type counts struct {
	done, handed, failed, lost, cancels atomic.Int64

	mu      sync.Mutex
	latSum  time.Duration // guarded by mu
	elapsed time.Duration // set once every request ended
}

// end counts one request that ended after took.
func (c *counts) end(o outcome, cancelled bool, took time.Duration) {
	if o == outHanded {
		c.handed.Add(1)
	} else {
		// A request that did not hand off failed; one the router did not
		// cancel is lost (a failed request).
		c.failed.Add(1)
		if !cancelled {
			c.lost.Add(1)
		}
	}
	c.mu.Lock()
	c.latSum += took
	c.mu.Unlock()
	c.done.Add(1)
}

// drive runs the workload: Requests at Concurrency, a share cancelled at a
// random moment while it transfers, then waits until decode holds nothing.
// cpu samples the run's processes (nil: not counted) when the workload
// starts and when its last request ended.
func drive(ctx context.Context, o Options, router *Router, cpu func() cpuSample) (*Summary, error) {
	var cpu0 cpuSample
	if cpu != nil {
		cpu0 = cpu()
	}
	start := time.Now()
	rooms := watchRooms(router.Done)
	plans := makePlans(o)
	c := &counts{}
	bar := startProgress(o.Progress, c, o.Requests, start)
	feed(ctx, o.Concurrency, o.Requests, nil, func(i int) {
		room, p := uint64(i+1), plans[i+1]
		began := time.Now()
		ch := rooms.wait(room)
		t := transfer{room: room, pages: p.pages, abortAt: p.abortAt, onCancel: func() { c.cancels.Add(1) }}
		out, cancelled := t.run(ctx, router, o, ch)
		rooms.end(room, false)
		if out != outGone {
			c.end(out, cancelled, time.Since(began))
		}
	})
	c.elapsed = time.Since(start)
	var cpuUsed map[string]float64
	if cpu != nil {
		cpuUsed = cpu().since(cpu0)
	}
	st, err := waitReleased(ctx, router, 45*time.Second)
	bar.stop()
	if err != nil {
		return nil, err
	}
	s := summarize(o, c, st)
	s.CPUSeconds = cpuUsed
	return s, nil
}

// waitReleased waits (up to limit) until decode holds no exposure — holds
// outlive requests — and returns decode's stats then.
func waitReleased(ctx context.Context, router *Router, limit time.Duration) (agent.DecodeStats, error) {
	for deadline := time.Now().Add(limit); ; time.Sleep(100 * time.Millisecond) {
		st, err := router.DecodeStats(ctx)
		if err != nil || st.LiveTags == 0 || time.Now().After(deadline) {
			return st, err
		}
	}
}

// feed runs do(i) for i in 0..n-1 on workers goroutines, and stops handing
// out work once cut is closed or ctx is done; it returns when every worker
// has stopped.
func feed(ctx context.Context, workers, n int, cut <-chan struct{}, do func(i int)) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				do(i)
			}
		}()
	}
loop:
	for i := 0; i < n; i++ {
		select {
		case jobs <- i:
		case <-cut:
			break loop
		case <-ctx.Done():
			break loop
		}
	}
	close(jobs)
	wg.Wait()
}

// outcome is how one request ended, as the router saw it.
type outcome int

const (
	outFailed outcome = iota // refused, failed, or no outcome within a minute
	outHanded                // decode handed it off
	outCut                   // the wave was cut (decode killed) before it ended
	outGone                  // the run's context ended
)

// transfer is one request from the router's side: admit on decode (retried
// while decode is full), open on every prefill rank, then wait for decode's
// outcome, cancelling at abortAt (<0: never) and giving up when cut closes.
type transfer struct {
	room     uint64
	pages    int
	abortAt  time.Duration
	cut      <-chan struct{}
	onCancel func()
}

// run returns the request's outcome and whether the router cancelled it.
func (t transfer) run(ctx context.Context, router *Router, o Options, ch <-chan Event) (outcome, bool) {
	if !admitWithRetry(ctx, router, t.room, t.pages, o.DecodeFor) {
		return outFailed, false
	}
	if err := router.Open(ctx, t.room, 1, t.pages, o.PageEvery); err != nil {
		router.Cancel(ctx, t.room, 1)
	}
	var timer <-chan time.Time
	if t.abortAt >= 0 {
		timer = time.After(t.abortAt)
	}
	cancelled := false
	for {
		select {
		case ev := <-ch:
			if ev.Done != nil && ev.Done.Handed {
				return outHanded, cancelled
			}
			return outFailed, cancelled
		case <-timer:
			timer, cancelled = nil, true
			t.onCancel()
			router.Cancel(ctx, t.room, 1)
		case <-t.cut:
			return outCut, cancelled
		case <-time.After(60 * time.Second):
			return outFailed, cancelled
		case <-ctx.Done():
			return outGone, cancelled
		}
	}
}

// admitWithRetry admits a request on decode, waiting like a router queue
// while decode is full (holds count); false when it was refused otherwise.
func admitWithRetry(ctx context.Context, router *Router, room uint64, pages int, decodeFor time.Duration) bool {
	for attempt := 0; attempt < 2000; attempt++ {
		err := router.Admit(ctx, room, 1, pages, decodeFor)
		switch {
		case err == nil:
			return true
		case !errdefs.IsResourceExhausted(err):
			return false
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return false
		}
	}
	return false
}

// rooms hands decode's outcomes (Router.Done) to the request waiting for
// each room, and counts handed-off outcomes for rooms already cut.
type rooms struct {
	mu           sync.Mutex
	waiting      map[uint64]chan Event
	cut          map[uint64]bool
	orphanHanded int
}

func watchRooms(done <-chan Event) *rooms {
	r := &rooms{waiting: map[uint64]chan Event{}, cut: map[uint64]bool{}}
	go func() {
		for ev := range done {
			r.mu.Lock()
			ch := r.waiting[ev.Room]
			if ch == nil && r.cut[ev.Room] && ev.Done != nil && ev.Done.Handed {
				r.orphanHanded++
			}
			r.mu.Unlock()
			if ch != nil {
				ch <- ev
			}
		}
	}()
	return r
}

// wait registers room and returns where its outcome will arrive.
func (r *rooms) wait(room uint64) <-chan Event {
	ch := make(chan Event, 1)
	r.mu.Lock()
	r.waiting[room] = ch
	r.mu.Unlock()
	return ch
}

// end stops waiting for room; a cut room's later handoff is an orphan.
func (r *rooms) end(room uint64, cut bool) {
	r.mu.Lock()
	delete(r.waiting, room)
	if cut {
		r.cut[room] = true
	}
	r.mu.Unlock()
}

func (r *rooms) orphans() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.orphanHanded
}
