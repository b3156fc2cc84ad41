package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo"
)

// agentExe is the kvfence binary the rank processes run (default: this
// executable; tests point it at a freshly built binary).
var agentExe string

// demoOptions size one run of the demo (and of each bench repetition).
type demoOptions struct {
	// Exe is the kvfence binary the rank processes run (default: agentExe,
	// else this executable).
	Exe                                       string
	Requests, Concurrency, MinPages, MaxPages int
	AbortShare                                float64
	PageEvery, DecodeFor                      time.Duration
	Delays                                    []time.Duration
	Unsafe                                    string
	Fence                                     bool
	TLS                                       bool
	Progress                                  io.Writer // nil: no progress bar
	Dir                                       string    // run directory (logs, certs); created if empty
	Seed                                      uint64
	// Slots sizes decode's KV pool (0: demoSlots, the agent's default);
	// the bench's scarce mode makes it small so holds cost admissions.
	Slots int
	// KillPrefillAfter, when positive, kill -9s prefill rank 2 that long
	// into the run (the crash test).
	KillPrefillAfter time.Duration
	// RestartDelay, in the decode-restart run, waits this long after the
	// kill before starting the new instance (a slow restart, as on a loaded
	// machine: the test's).
	RestartDelay time.Duration
	// Checksums: every rank computes (prefill) or checks (decode) a
	// checksum at commit.
	Checksums bool
	// Plugin, when set, is the transport plugin binary every rank loads
	// instead of the embedded TCP one (the Soft-RoCE VM: the verbs plugin),
	// with PrefillEnv/DecodeEnv added to its environment; no delaying proxy
	// is started (the network delays: netem), Delays only widen the window
	// in which aborts fall. DataHosts: decode advertises its data endpoint
	// once per host (one connection per lane, see __agent --advertise-hosts).
	Plugin                string
	PrefillEnv, DecodeEnv []string
	DataHosts             []string
	// RestartInstances, when positive, runs decode with the restart fence
	// (--restart-fence-instances): that many target plugin processes,
	// one restarted when a hold on it must end sooner than its bound (a
	// hold past RestartAfter, a dead writer on a transport that cannot
	// revoke). Decode then takes no delaying proxy.
	RestartInstances int
	RestartAfter     time.Duration
	// AgentArgs are extra __agent flags for every rank (e.g. a longer
	// --lease on a slow emulated machine).
	AgentArgs []string
}

// poolSlots is the size of the decode pool the run starts.
func (o demoOptions) poolSlots() int {
	if o.Slots > 0 {
		return o.Slots
	}
	return demoSlots
}

// pluginArgs are the __agent flags that load o.Plugin with env.
func (o demoOptions) pluginArgs(env []string) []string {
	if o.Plugin == "" {
		return nil
	}
	a := []string{"--plugin", o.Plugin}
	for _, kv := range env {
		a = append(a, "--plugin-env", kv)
	}
	return a
}

// demoSummary is what the demo prints (and --json emits).
type demoSummary struct {
	Variant     string `json:"variant"`
	Fence       bool   `json:"fence"`
	Requests    int    `json:"requests"`
	Handoffs    int    `json:"handoffs"`
	Aborts      int    `json:"aborts"`
	CancelsSent int    `json:"cancels_sent"`
	Failed      int    `json:"failed"`
	// Lost counts requests that did not hand off although the router
	// never cancelled them (failed requests: admission never succeeded,
	// the transfer failed, or no outcome came).
	Lost            int                `json:"lost_requests"`
	ReleasedDrained int                `json:"released_drained"`
	ReleasedFenced  int                `json:"released_fenced"`
	ReleasedTimeout int                `json:"released_timeout"`
	ReleasedDone    int                `json:"released_completed"`
	ReleasedUnsafe  int                `json:"released_unsafe"`
	HoldP50Ms       map[string]float64 `json:"hold_p50_ms"`
	HoldP99Ms       map[string]float64 `json:"hold_p99_ms"`
	HoldSlotSec     map[string]float64 `json:"hold_slot_seconds"`
	PagesVerified   int                `json:"pages_verified"`
	CorruptPages    int                `json:"corrupt_pages"`
	FreeWrites      int                `json:"free_writes"` // of corrupt_pages: late writes found in released memory
	StaleMessages   uint64             `json:"stale_messages"`
	// KeysBound: rank key sets bound to the rank's data identity;
	// KeysUnbound: admissions that also granted unbound keys (a rank not
	// connected to decode's transport yet). agent/writer_keys.go.
	KeysBound   int `json:"keys_bound"`
	KeysUnbound int `json:"keys_unbound"`
	// The restart fence (--restart-fence-instances): target instances,
	// restarts (each reaped before its holds were released fenced), and
	// live exposures the restarts failed (the blast radius).
	TargetInstances  int     `json:"target_instances,omitempty"`
	TargetRestarts   int     `json:"target_restarts"`
	RestartFailed    int     `json:"restart_failed_exposures"`
	FailedPerRestart float64 `json:"restart_failed_per_restart"`
	Unreleased       int     `json:"unreleased_exposures"`
	Seconds          float64 `json:"seconds"`
	RequestsPerSec   float64 `json:"requests_per_second"`
	// MeanLatencyMs is the mean time a request took, from the moment a
	// client slot picked it up (admission retries included) to its end.
	MeanLatencyMs float64 `json:"mean_latency_ms"`
	// SteadyRequestsPerSec is concurrency / mean latency (Little's law):
	// the throughput while every client slot is busy, without the start
	// and the tail of the run, whose length depends on which slot drew
	// which requests — the benchmark compares arms on it.
	SteadyRequestsPerSec float64 `json:"steady_requests_per_second"`
	PoolSlots            int     `json:"pool_slots"`
	Dir                  string  `json:"run_dir"`
	Report               string  `json:"report,omitempty"`

	holds  map[string][]float64
	series []agent.HeldSample
}

type child struct {
	cmd     *exec.Cmd
	control string
	metrics string
}

// startPrefills starts prefill ranks 1 and 2 against decode's control
// address; the returned func stops them.
func startPrefills(ctx context.Context, exe, decode string, args []string, dir string) ([]*child, func(), error) {
	var pre []*child
	stop := func() {
		for i := len(pre) - 1; i >= 0; i-- {
			pre[i].stop()
		}
	}
	for r := 1; r <= 2; r++ {
		c, err := startChild(ctx, exe, append([]string{"--role", "prefill", "--rank", fmt.Sprint(r), "--decode", decode}, args...),
			fmt.Sprintf("prefill-%d.log", r), dir)
		if err != nil {
			stop()
			return nil, nil, err
		}
		pre = append(pre, c)
	}
	return pre, stop, nil
}

func startChild(ctx context.Context, exe string, args []string, logName string, dir string) (*child, error) {
	cmd := exec.CommandContext(ctx, exe, append([]string{"__agent", "--log", filepath.Join(dir, logName)}, args...)...)
	cmd.Stderr = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	lines := bufio.NewScanner(out)
	ready := make(chan []string, 1)
	go func() {
		for lines.Scan() {
			if f := strings.Fields(lines.Text()); len(f) == 3 && f[0] == "READY" {
				ready <- f
			}
		}
		close(ready)
	}()
	select {
	case f, ok := <-ready:
		if !ok {
			_ = cmd.Wait()
			return nil, fmt.Errorf("%s exited before it was ready (see %s)", logName, filepath.Join(dir, logName))
		}
		return &child{cmd: cmd, control: f[1], metrics: f[2]}, nil
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("%s not ready after 60s", logName)
	}
}

func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// runDemo starts one decode and two prefill rank processes, each with its
// own TCP plugin process, plus a delaying proxy on the data path, and
// drives the workload from this process (the router).
func runDemo(ctx context.Context, o demoOptions) (*demoSummary, error) {
	exe, tlsArgs, err := prepareRun(&o, "kvfence-demo-")
	if err != nil {
		return nil, err
	}
	common := []string{"--unsafe", o.Unsafe}
	if o.Checksums {
		common = append(common, "--checksums")
	}
	common = append(common, o.AgentArgs...)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var delays []string
	for _, d := range o.Delays {
		delays = append(delays, d.String())
	}
	dargs := append(append([]string{"--role", "decode", "--rank", "0", fmt.Sprintf("--fence=%v", o.Fence),
		fmt.Sprintf("--slots=%d", o.poolSlots())}, common...), tlsArgs...)
	if o.RestartInstances > 0 {
		dargs = append(dargs, fmt.Sprintf("--restart-fence-instances=%d", o.RestartInstances), "--restart-fence-after="+o.RestartAfter.String())
	} else if len(delays) > 0 && o.Plugin == "" {
		dargs = append(dargs, "--data-delay", strings.Join(delays, ","))
	}
	dargs = append(dargs, o.pluginArgs(o.DecodeEnv)...)
	if len(o.DataHosts) > 0 {
		dargs = append(dargs, "--advertise-hosts", strings.Join(o.DataHosts, ","))
	}
	dec, err := startChild(cctx, exe, dargs, "decode-0.log", o.Dir)
	if err != nil {
		return nil, err
	}
	defer dec.stop()
	pre, stopPre, err := startPrefills(cctx, exe, dec.control, append(append(append([]string(nil), common...), tlsArgs...), o.pluginArgs(o.PrefillEnv)...), o.Dir)
	if err != nil {
		return nil, err
	}
	defer stopPre()
	routerTLS, err := maybeTLS(o.TLS, o.Dir, "router")
	if err != nil {
		return nil, err
	}
	router, err := demo.DialRouter(cctx, dec.control, []string{pre[0].control, pre[1].control}, routerTLS)
	if err != nil {
		return nil, err
	}
	defer router.Close()
	if o.KillPrefillAfter > 0 {
		victim := pre[1].cmd.Process
		t := time.AfterFunc(o.KillPrefillAfter, func() { _ = victim.Kill() })
		defer t.Stop()
	}
	return drive(cctx, o, router)
}

func maybeTLS(on bool, dir, name string) (*tls.Config, error) {
	if !on {
		return nil, nil
	}
	return demo.LoadTLS(filepath.Join(dir, "pki"), name)
}

// drive runs the workload: Requests at Concurrency, a share cancelled at a
// random moment while it transfers, then waits until decode holds nothing.
func drive(ctx context.Context, o demoOptions, router *demo.Router) (*demoSummary, error) {
	start := time.Now()
	var mu sync.Mutex
	waiters := map[uint64]chan demo.Event{}
	go func() {
		for ev := range router.Done {
			mu.Lock()
			ch := waiters[ev.Room]
			mu.Unlock()
			if ch != nil {
				ch <- ev
			}
		}
	}()
	var done, handed, failed, lost, cancels atomic.Int64
	var latSum time.Duration // guarded by mu
	jobs := make(chan uint64)
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(o.Seed, 7))
	type plan struct {
		pages   int
		abortAt time.Duration // <0: never
	}
	plans := make([]plan, o.Requests+1)
	for i := 1; i <= o.Requests; i++ {
		p := plan{pages: o.MinPages + rng.IntN(o.MaxPages-o.MinPages+1), abortAt: -1}
		if rng.Float64() < o.AbortShare {
			// Mid-transfer: while pages are still being produced or are in
			// flight on the (delayed) data path.
			span := time.Duration(p.pages)*o.PageEvery + maxDelay(o.Delays)
			p.abortAt = time.Duration(rng.Int64N(int64(span) + 1))
		}
		plans[i] = p
	}
	stopBar := make(chan struct{})
	barDone := make(chan struct{})
	go func() {
		defer close(barDone)
		if o.Progress == nil {
			<-stopBar
			return
		}
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				progressBar(o.Progress, int(done.Load()), o.Requests, int(handed.Load()), int(cancels.Load()), time.Since(start))
			case <-stopBar:
				progressBar(o.Progress, int(done.Load()), o.Requests, int(handed.Load()), int(cancels.Load()), time.Since(start))
				fmt.Fprintln(o.Progress)
				return
			}
		}
	}()
	for w := 0; w < o.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for room := range jobs {
				began := time.Now()
				p := plans[room]
				ch := make(chan demo.Event, 1)
				mu.Lock()
				waiters[room] = ch
				mu.Unlock()
				ok := admitWithRetry(ctx, router, room, p.pages, o)
				// fail counts a request that did not hand off; one the
				// router did not cancel is lost (a failed request).
				cancelled := false
				fail := func() {
					failed.Add(1)
					if !cancelled {
						lost.Add(1)
					}
				}
				if ok {
					if err := router.Open(ctx, room, 1, p.pages, o.PageEvery); err != nil {
						router.Cancel(ctx, room, 1)
					}
					var timer <-chan time.Time
					if p.abortAt >= 0 {
						timer = time.After(p.abortAt)
					}
				wait:
					for {
						select {
						case ev := <-ch:
							if ev.Done != nil && ev.Done.Handed {
								handed.Add(1)
							} else {
								fail()
							}
							break wait
						case <-timer:
							timer = nil
							cancelled = true
							cancels.Add(1)
							router.Cancel(ctx, room, 1)
						case <-time.After(60 * time.Second):
							fail()
							break wait
						case <-ctx.Done():
							return
						}
					}
				} else {
					fail()
				}
				mu.Lock()
				delete(waiters, room)
				mu.Unlock()
				took := time.Since(began)
				mu.Lock()
				latSum += took
				mu.Unlock()
				done.Add(1)
			}
		}()
	}
	for i := 1; i <= o.Requests; i++ {
		select {
		case jobs <- uint64(i):
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(start)
	// Holds outlive requests: wait (bounded) until decode released them all.
	var st agent.DecodeStats
	var err error
	for deadline := time.Now().Add(45 * time.Second); ; {
		st, err = router.DecodeStats(ctx)
		if err != nil {
			close(stopBar)
			<-barDone
			return nil, err
		}
		if st.LiveTags == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stopBar)
	<-barDone
	s := &demoSummary{Variant: orSafe(o.Unsafe), Fence: o.Fence, Requests: o.Requests, Handoffs: int(handed.Load()),
		Aborts: int(st.Core.Aborts), CancelsSent: int(cancels.Load()), Failed: int(failed.Load()), Lost: int(lost.Load()),
		ReleasedDrained: st.Released["drained"], ReleasedFenced: st.Released["fenced"], ReleasedTimeout: st.Released["timeout"],
		ReleasedDone: st.Released["completed"], ReleasedUnsafe: st.Released["unsafe"],
		HoldP50Ms: map[string]float64{}, HoldP99Ms: map[string]float64{}, HoldSlotSec: st.HoldSlotSec,
		PagesVerified: st.PagesVerified, CorruptPages: st.CorruptPages, FreeWrites: st.FreeWrites, StaleMessages: st.Core.StaleMessages,
		KeysBound: st.BoundGrants, KeysUnbound: st.UnboundGrants,
		Unreleased: st.LiveTags, Seconds: elapsed.Seconds(), RequestsPerSec: float64(o.Requests) / elapsed.Seconds(),
		MeanLatencyMs:        latSum.Seconds() * 1000 / float64(max(1, o.Requests)),
		SteadyRequestsPerSec: float64(o.Concurrency) / (latSum.Seconds() / float64(max(1, o.Requests))),
		PoolSlots:            o.poolSlots(), Dir: o.Dir, holds: st.HoldsMs, series: st.Series,
		TargetInstances: o.RestartInstances, TargetRestarts: st.TargetRestarts, RestartFailed: int(st.Core.RestartFailed)}
	if s.TargetRestarts > 0 {
		s.FailedPerRestart = float64(s.RestartFailed) / float64(s.TargetRestarts)
	}
	for path, v := range st.HoldsMs {
		s.HoldP50Ms[path] = quantile(v, 0.50)
		s.HoldP99Ms[path] = quantile(v, 0.99)
	}
	return s, nil
}

func admitWithRetry(ctx context.Context, router *demo.Router, room uint64, pages int, o demoOptions) bool {
	for attempt := 0; attempt < 2000; attempt++ {
		err := router.Admit(ctx, room, 1, pages, o.DecodeFor)
		switch {
		case err == nil:
			return true
		case !errdefs.IsResourceExhausted(err):
			return false
		}
		select {
		case <-time.After(5 * time.Millisecond): // decode is full (holds count): wait like a router queue
		case <-ctx.Done():
			return false
		}
	}
	return false
}

func maxDelay(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	i := int(q * float64(len(s)-1))
	return s[i]
}

func orSafe(v string) string {
	if v == "" {
		return "safe"
	}
	return v
}

func progressBar(w io.Writer, done, total, handed, cancels int, el time.Duration) {
	const width = 40
	n := done * width / max(total, 1)
	fmt.Fprintf(w, "\r[%s%s] %4d/%d requests  handoffs %4d  cancels %4d  %5.1fs",
		strings.Repeat("=", n), strings.Repeat(" ", width-n), done, total, handed, cancels, el.Seconds())
}

// prepareRun fills in the run directory (a new temp dir named after
// prefix when o.Dir is empty), returns the agent binary, and, with TLS,
// writes throwaway certificates and returns the --pki flag for the agents.
func prepareRun(o *demoOptions, prefix string) (exe string, pkiArgs []string, err error) {
	if o.Dir == "" {
		if o.Dir, err = os.MkdirTemp("", prefix); err != nil {
			return "", nil, err
		}
	}
	if exe = o.Exe; exe == "" {
		exe = agentExe
	}
	if exe == "" {
		if exe, err = os.Executable(); err != nil {
			return "", nil, err
		}
	}
	if o.TLS {
		pki := filepath.Join(o.Dir, "pki")
		if err := os.MkdirAll(pki, 0o700); err != nil {
			return "", nil, err
		}
		if err := demo.WriteThrowawayPKI(pki, pkiNames(2)); err != nil {
			return "", nil, err
		}
		pkiArgs = []string{"--pki", pki}
	}
	return exe, pkiArgs, nil
}
