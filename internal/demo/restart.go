package demo

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvfence/kvfence/core"
)

// The decode-restart run (kvfence demo --restart-decode-after D, hidden; the
// test TestDemoDecodeRestart): the demo's processes, a first wave of
// requests, and D into it — once later requests of the wave are under way —
// a kill -9 of the decode agent (its TCP plugin dies with it) while their
// writes are on the delayed data path. A new decode process — a new
// instance — is started at once on the same control address; the prefill
// ranks stay up and relink. The run then waits until no prefill rank holds
// a request (source pages) or a batch in doubt, and runs a second wave of
// requests on the new instance.
//
// The prefill agents are frozen (SIGSTOP) from just before the kill until
// the new instance is ready. What the run checks is an order — the prefill
// ranks meet the new instance while they still hold the dead one's
// requests, so the new instance sees (and counts stale) the old instance's
// tags — and without the freeze that order is a race between the restart
// (a process start, slow on a loaded machine) and prefill's quiesce grace.
// Frozen, the ranks notice the dead link only when they resume, with the
// new instance already listening: relinking is one dial and handshake
// within a grace of restartQuiesceGrace. Their TCP plugins keep running, so
// the dead instance's writes still end in doubt on the data path.

// RestartSummary is what the decode-restart run reports.
type RestartSummary struct {
	Before          int `json:"requests_before"`      // first-wave requests started before the crash
	HandedBefore    int `json:"handed_before"`        // of those, handed off (and finished) before the crash
	FailedBefore    int `json:"failed_before"`        // refused or failed before the crash, or admission cut by it
	InFlightAtCrash int `json:"in_flight_at_crash"`   // admitted, not finished when decode died: reported failed
	OrphanHanded    int `json:"orphan_handed_events"` // handed outcomes received for requests already counted cut (must be 0)

	After       int `json:"requests_after"` // second-wave requests, on the new instance
	HandedAfter int `json:"handed_after"`
	FailedAfter int `json:"failed_after"`

	// Prefill, summed over the ranks.
	PrefillAlive          bool                 `json:"prefill_alive"`         // both rank processes still running at the end
	InDoubtAtPrefill      float64              `json:"prefill_in_doubt"`      // batches completed InDoubt
	QuiescedByEvidence    map[string]float64   `json:"prefill_quiesced"`      // batches settled by evidence, by kind
	UnsettledClearedSec   float64              `json:"unsettled_cleared_s"`   // kill → no batch in doubt on any rank
	SourceReleasedSec     float64              `json:"source_released_s"`     // kill → no rank holds a request's source pages
	PrefillHeldAtEnd      int                  `json:"prefill_requests_held"` // requests holding source pages at the end
	PrefillUnsettledAtEnd int                  `json:"prefill_unsettled"`     // batches that may still move, at the end
	PrefillCore           []core.SenderMetrics `json:"prefill_core"`          // each rank's core counters at the end

	// The new decode instance.
	Stale          uint64  `json:"stale_messages"`
	Handoffs       int     `json:"handoffs"`
	PagesVerified  int     `json:"pages_verified"`
	CorruptPages   int     `json:"corrupt_pages"`
	FreeWrites     int     `json:"free_writes"`
	Unreleased     int     `json:"unreleased_exposures"`
	RestartSeconds float64 `json:"restart_s"` // kill → new decode ready
	AtKill         string  `json:"at_kill"`   // prefill's holds when the kill was decided

	// The killed agent's child processes (its TCP plugin), and when the
	// last of them was gone (-1: still running 30 s after the kill).
	OldPlugins        int     `json:"old_plugins"`
	OldPluginsGoneSec float64 `json:"old_plugins_gone_s"`
	// Decode instances, from the agents' logs.
	OldInstance uint64  `json:"old_instance"`
	NewInstance uint64  `json:"new_instance"`
	Seconds     float64 `json:"seconds"`
	Dir         string  `json:"run_dir"`
}

// RunDecodeRestart is the decode-restart run: o.Requests is the size of
// each wave; in the first, the decode agent is killed once after has passed
// and new requests started after earlier ones finished (see crashPlan).
// It runs the embedded TCP plugin (o.Plugin is not used).
func RunDecodeRestart(ctx context.Context, o Options, after time.Duration) (*RestartSummary, error) {
	start := time.Now()
	r, err := newRestartRun(o)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if r.dec, err = startChild(cctx, r.exe, r.dargs, "decode-0.log", r.o.Dir); err != nil {
		return nil, err
	}
	defer func() { r.dec.stop() }() // the instance running at the end
	pre, stopPre, err := startPrefills(cctx, r.exe, r.dec.control, r.preArgs, r.o.Dir)
	if err != nil {
		return nil, err
	}
	defer stopPre()
	defer r.frozen.thaw() // before stopPre: a stopped process ignores SIGTERM
	r.pre, r.prefillAddrs = pre, []string{pre[0].control, pre[1].control}
	if r.routerTLS, err = maybeTLS(r.o.TLS, r.o.Dir, "router"); err != nil {
		return nil, err
	}
	router1, err := DialRouter(cctx, r.dec.control, r.prefillAddrs, r.routerTLS)
	if err != nil {
		return nil, err
	}
	defer router1.Close()
	killedAt, err := r.firstWave(cctx, router1, after)
	if err != nil {
		return nil, err
	}
	// The prefill ranks must let go of everything the dead instance had
	// them write: no batch in doubt (quiescence evidence), no request
	// holding source pages.
	if err := waitPrefillCleared(cctx, router1, killedAt, r.s); err != nil {
		return nil, err
	}
	if err := r.secondWave(cctx); err != nil {
		return nil, err
	}
	r.s.OldInstance = logInstance(filepath.Join(r.o.Dir, "decode-0.log"))
	r.s.NewInstance = logInstance(filepath.Join(r.o.Dir, "decode-0-restarted.log"))
	r.s.Seconds = time.Since(start).Seconds()
	return r.s, nil
}

// restartRun is the decode-restart run's state between its steps.
type restartRun struct {
	o              Options
	exe            string
	dargs, preArgs []string
	dec            *child // the decode instance now running
	pre            []*child
	prefillAddrs   []string
	routerTLS      *tls.Config
	frozen         freezer
	rng            *rand.Rand
	s              *RestartSummary
}

func newRestartRun(o Options) (*restartRun, error) {
	exe, pkiArgs, err := prepareRun(&o, "kvfence-restart-")
	if err != nil {
		return nil, err
	}
	common := append([]string{"--unsafe", o.Unsafe}, pkiArgs...)
	return &restartRun{o: o, exe: exe, dargs: restartDecodeArgs(o, common),
		preArgs: append([]string{"--quiesce-grace", restartQuiesceGrace.String()}, common...),
		rng:     rand.New(rand.NewPCG(o.Seed, 11)),
		s:       &RestartSummary{Dir: o.Dir, QuiescedByEvidence: map[string]float64{}}}, nil
}

// firstWave runs the first wave, cut by the crash, restarts decode, and
// returns when the kill was.
func (r *restartRun) firstWave(ctx context.Context, router *Router, after time.Duration) (time.Time, error) {
	crash := &crashPlan{after: after, minStarted: int64(r.o.Concurrency + 4), done: make(chan struct{})}
	go crash.run(ctx, r.dec, r.pre, router, &r.frozen)
	// The wave runs on: its workers may wait on a frozen prefill rank
	// until the restart is done.
	wave1 := make(chan waveResult, 1)
	go func() { wave1 <- runWave(ctx, router, r.o, r.rng, 1, r.o.Requests, crash.done, &crash.started) }()
	select {
	case <-crash.done:
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
	r.s.AtKill = crash.note
	if err := r.restartDecode(ctx, crash); err != nil {
		return time.Time{}, err
	}
	w1 := <-wave1
	r.s.Before, r.s.HandedBefore, r.s.FailedBefore, r.s.InFlightAtCrash, r.s.OrphanHanded = w1.started, w1.handed, w1.failed, w1.cut, w1.orphanHanded
	return crash.killedAt, w1.waitErr
}

// restartDecode reaps the killed process and starts a new instance on its
// control address, then lets the frozen prefill ranks run again.
func (r *restartRun) restartDecode(ctx context.Context, crash *crashPlan) error {
	_ = r.dec.cmd.Wait()
	r.s.OldPlugins = len(crash.orphans)
	r.s.OldPluginsGoneSec = waitGone(crash.orphans, crash.killedAt, 30*time.Second)
	if r.o.RestartDelay > 0 {
		time.Sleep(r.o.RestartDelay) // a slow restart, as on a loaded machine
	}
	dargs2 := append(append([]string(nil), r.dargs...), "--control", r.dec.control)
	dec2, err := startChild(ctx, r.exe, dargs2, "decode-0-restarted.log", r.o.Dir)
	if err != nil {
		return fmt.Errorf("restart decode on %s: %w", r.dec.control, err)
	}
	r.dec = dec2
	r.s.RestartSeconds = time.Since(crash.killedAt).Seconds()
	r.frozen.thaw()
	return nil
}

// secondWave runs the second wave on the new instance and collects the
// run's counters.
func (r *restartRun) secondWave(ctx context.Context) error {
	router2, err := DialRouter(ctx, r.dec.control, r.prefillAddrs, r.routerTLS)
	if err != nil {
		return fmt.Errorf("router to the restarted decode: %w", err)
	}
	defer router2.Close()
	w2 := runWave(ctx, router2, r.o, r.rng, uint64(r.o.Requests)+1, r.o.Requests, nil, nil)
	if w2.waitErr != nil {
		return w2.waitErr
	}
	r.s.After, r.s.HandedAfter, r.s.FailedAfter = w2.started, w2.handed, w2.failed+w2.cut
	return collectAfterRestart(ctx, router2, r.pre, r.s)
}

// restartDecodeArgs is the decode agent's command line in the restart run.
func restartDecodeArgs(o Options, common []string) []string {
	dargs := append([]string{"--role", "decode", "--rank", "0", fmt.Sprintf("--fence=%v", o.Fence)}, common...)
	if len(o.Delays) > 0 {
		var ds []string
		for _, d := range o.Delays {
			ds = append(ds, d.String())
		}
		dargs = append(dargs, "--data-delay", strings.Join(ds, ","))
	}
	return dargs
}

// crashPlan kills the decode agent once writes are in flight: after
// `after`, and once requests started after others finished (so the data
// lanes are up: a batch queued behind a connection still being set up is
// never sent and fails definitely), a little later: their pages are then
// written and on the delayed data path, however slow the machine. The
// prefill agents are frozen first (see RunDecodeRestart). done is closed
// after the kill; the other fields are set before it.
type crashPlan struct {
	after      time.Duration
	minStarted int64
	started    atomic.Int64 // first-wave requests started
	done       chan struct{}

	note     string
	killedAt time.Time
	orphans  []int // the dead agent's children: its TCP plugin
}

func (c *crashPlan) run(ctx context.Context, victim *child, pre []*child, router *Router, frozen *freezer) {
	select {
	case <-time.After(c.after):
	case <-ctx.Done():
		return
	}
	for deadline := time.Now().Add(60 * time.Second); c.started.Load() < c.minStarted && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(150 * time.Millisecond)
	if held, unsettled, err := prefillHolds(ctx, router); err == nil {
		c.note = fmt.Sprintf("%d requests started; prefill: %d requests held, %d batches unsettled", c.started.Load(), held, unsettled)
	}
	c.orphans = childrenOf(victim.cmd.Process.Pid)
	frozen.freeze(pre)
	c.killedAt = time.Now()
	_ = victim.cmd.Process.Kill()
	close(c.done)
}

// waitPrefillCleared waits (up to a minute) until no prefill rank holds a
// request's source pages or a batch in doubt, and records when.
func waitPrefillCleared(ctx context.Context, router *Router, killedAt time.Time, s *RestartSummary) error {
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		held, unsettled, err := prefillHolds(ctx, router)
		if err != nil {
			return err
		}
		if unsettled == 0 && s.UnsettledClearedSec == 0 {
			s.UnsettledClearedSec = time.Since(killedAt).Seconds()
		}
		if held == 0 && unsettled == 0 {
			s.SourceReleasedSec = time.Since(killedAt).Seconds()
			return nil
		}
	}
	s.SourceReleasedSec = -1
	return nil
}

// collectAfterRestart reads the new decode instance's counters (once its
// tags are released, or after 45 s) and the prefill ranks'.
func collectAfterRestart(ctx context.Context, router2 *Router, pre []*child, s *RestartSummary) error {
	st, err := waitReleased(ctx, router2, 45*time.Second)
	if err != nil {
		return err
	}
	s.Stale, s.Handoffs, s.PagesVerified, s.CorruptPages, s.FreeWrites, s.Unreleased =
		st.Core.StaleMessages, st.Handoffs, st.PagesVerified, st.CorruptPages, st.FreeWrites, st.LiveTags
	if s.PrefillHeldAtEnd, s.PrefillUnsettledAtEnd, err = prefillHolds(ctx, router2); err != nil {
		return err
	}
	for _, raw := range router2.PrefillStats(ctx) {
		var m core.SenderMetrics
		if json.Unmarshal(raw, &m) == nil {
			s.PrefillCore = append(s.PrefillCore, m)
		}
	}
	return collectPrefillMetrics(ctx, pre, s)
}

// collectPrefillMetrics checks that the prefill processes live and sums
// their in-doubt completions and quiescence evidence from /metrics.
func collectPrefillMetrics(ctx context.Context, pre []*child, s *RestartSummary) error {
	s.PrefillAlive = true
	for _, c := range pre {
		if c.cmd.ProcessState != nil || c.cmd.Process.Signal(syscall.Signal(0)) != nil {
			s.PrefillAlive = false
		}
		m, err := scrapeMetrics(ctx, c.metrics)
		if err != nil {
			return err
		}
		s.InDoubtAtPrefill += m["kvfence_in_doubt_completions_total"]
		for k, v := range m {
			if ev, ok := strings.CutPrefix(k, "kvfence_quiesced_batches_total/"); ok {
				s.QuiescedByEvidence[ev] += v
			}
		}
	}
	return nil
}

// restartQuiesceGrace is the prefill ranks' quiesce grace in the restart
// run: after they resume, it must outlast one relink to the new instance.
const restartQuiesceGrace = 10 * time.Second

// freezer stops processes (SIGSTOP) and resumes them once (SIGCONT).
type freezer struct {
	mu   sync.Mutex
	pids []int
}

func (f *freezer) freeze(cs []*child) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		if c.cmd.Process.Signal(syscall.SIGSTOP) == nil {
			f.pids = append(f.pids, c.cmd.Process.Pid)
		}
	}
}

func (f *freezer) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, pid := range f.pids {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	f.pids = nil
}

// waitGone waits up to limit for every process in pids to be gone and
// returns how long after since that was, or -1 if some still run.
func waitGone(pids []int, since time.Time, limit time.Duration) float64 {
	for deadline := time.Now().Add(limit); ; time.Sleep(20 * time.Millisecond) {
		n := 0
		for _, pid := range pids {
			if running(pid) {
				n++
			}
		}
		if n == 0 {
			return time.Since(since).Seconds()
		}
		if time.Now().After(deadline) {
			return -1
		}
	}
}

// childrenOf lists the processes whose parent is pid (from /proc).
func childrenOf(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(c); ok && ppid == pid {
			out = append(out, c)
		}
	}
	return out
}

// running: the process exists and is not a zombie (a container without an
// init may leave a re-parented child unreaped).
func running(pid int) bool {
	st, _, ok := procStat(pid)
	return ok && st != 'Z' && st != 'X'
}

// procStatFields are a process's /proc/PID/stat fields after its command
// (state, ppid, ...: proc(5) fields 3 on), or nil if it is gone.
func procStatFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// procStat reads a process's state letter and parent pid.
func procStat(pid int) (state byte, ppid int, ok bool) {
	f := procStatFields(pid)
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return f[0][0], ppid, err == nil
}

// logInstance is the instance a decode agent logged when it came up (0 if
// the log does not say).
func logInstance(path string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Message  string `json:"@message"`
			Instance uint64 `json:"instance"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "decode agent up" {
			return line.Instance
		}
	}
	return 0
}

// waveResult counts one wave's requests as the router saw them.
type waveResult struct {
	started, handed, failed int
	cut                     int // admitted, not finished when the wave was cut
	orphanHanded            int // handed outcomes for requests already counted cut
	waitErr                 error
}

// runWave runs n requests (rooms first, first+1, ...) at o.Concurrency and
// returns when they all ended, or — once cut closes — when every worker has
// stopped (requests admitted and not finished then are counted cut).
func runWave(ctx context.Context, router *Router, o Options, rng *rand.Rand, first uint64, n int, cut <-chan struct{}, started *atomic.Int64) waveResult {
	rs := watchRooms(router.Done)
	pages := make([]int, n)
	for i := range pages {
		pages[i] = o.MinPages + rng.IntN(o.MaxPages-o.MinPages+1)
	}
	var mu sync.Mutex
	var res waveResult
	feed(ctx, o.Concurrency, n, cut, func(i int) {
		room := first + uint64(i)
		ch := rs.wait(room)
		mu.Lock()
		res.started++
		mu.Unlock()
		if started != nil {
			started.Add(1)
		}
		out, _ := transfer{room: room, pages: pages[i], abortAt: -1, cut: cut, onCancel: func() {}}.run(ctx, router, o, ch)
		rs.end(room, out == outCut)
		mu.Lock()
		res.count(out)
		mu.Unlock()
	})
	res.orphanHanded = rs.orphans()
	if ctx.Err() != nil {
		res.waitErr = ctx.Err()
	}
	return res
}

// count adds one request's outcome.
func (w *waveResult) count(out outcome) {
	switch out {
	case outHanded:
		w.handed++
	case outCut:
		w.cut++
	default:
		w.failed++
	}
}

// prefillHolds sums, over the prefill ranks, the requests whose source pages
// are held and the batches that may still move.
func prefillHolds(ctx context.Context, r *Router) (held, unsettled int, err error) {
	raws := r.PrefillStats(ctx)
	for i, raw := range raws {
		var m core.SenderMetrics
		if err := json.Unmarshal(raw, &m); err != nil {
			return 0, 0, fmt.Errorf("prefill rank %d stats: %w (%q)", i+1, err, raw)
		}
		held += m.Requests
		unsettled += m.Unsettled
	}
	return held, unsettled, nil
}

// scrapeMetrics reads an agent's /metrics: counters and gauges summed by
// name, and by name/label-value for the quiescence evidence.
func scrapeMetrics(ctx context.Context, addr string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		series := line[:i]
		name, labels, _ := strings.Cut(series, "{")
		out[name] += v
		if _, rest, ok := strings.Cut(labels, `evidence="`); ok {
			if ev, _, ok := strings.Cut(rest, `"`); ok {
				out[name+"/"+ev] += v
			}
		}
	}
	return out, sc.Err()
}
