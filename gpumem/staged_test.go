package gpumem

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/delayproxy"
	"github.com/kvfence/kvfence/sdk"
)

const (
	engPages = 64   // GPU pages per engine buffer
	halfPage = 2048 // bytes of one engine page in one buffer (K or V)
	reqPages = 4
)

// gpuEngine is an engine's KV in (fake) GPU memory: a K and a V buffer.
type gpuEngine struct {
	dev  *Device
	bufs []Buffer
}

func newGPUEngine(t *testing.T, dev *Device) *gpuEngine {
	e := &gpuEngine{dev: dev}
	for range 2 {
		base, err := dev.Alloc(engPages * halfPage)
		if err != nil {
			t.Fatal(err)
		}
		e.bufs = append(e.bufs, Buffer{Base: base, PageBytes: halfPage})
	}
	return e
}

func content(req, page, buf int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("r%04d p%d b%d|", req, page, buf)), halfPage/8)[:halfPage]
}

var freeFill = bytes.Repeat([]byte{0xEE}, halfPage)

func (e *gpuEngine) write(t *testing.T, p, buf int, b []byte) {
	if err := e.dev.CopyToDevice(e.bufs[buf].Base+uintptr(p*halfPage), b); err != nil {
		t.Error(err)
	}
}

func (e *gpuEngine) read(t *testing.T, p, buf int) []byte {
	b := make([]byte, halfPage)
	if err := e.dev.CopyFromDevice(b, e.bufs[buf].Base+uintptr(p*halfPage)); err != nil {
		t.Error(err)
	}
	return b
}

// decodePages is decode's GPU page allocator: a free page holds freeFill,
// and any other byte in it is a write into a free GPU page.
type decodePages struct {
	t       *testing.T
	eng     *gpuEngine
	mu      sync.Mutex
	free    []int
	touched int // free pages found written
	aborted int // ... with an aborted request's bytes
	corrupt int // pages of a successful request not holding its bytes
}

func (a *decodePages) check(p int) {
	for b := range a.eng.bufs {
		if got := a.eng.read(a.t, p, b); !bytes.Equal(got, freeFill) {
			a.touched++
			if strings.HasPrefix(string(got), "r") {
				a.aborted++
			}
			return
		}
	}
}

func (a *decodePages) take(n int) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	got := a.free[:n:n]
	a.free = a.free[n:]
	for _, p := range got {
		a.check(p)
	}
	return got
}

func (a *decodePages) give(ps []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range ps {
		for b := range a.eng.bufs {
			a.eng.write(a.t, p, b, freeFill)
		}
	}
	a.free = append(a.free, ps...)
}

// stagedPair is a decode rank and a prefill rank on TCP plugin processes,
// the data path through a delaying proxy, both engines' KV in GPU memory.
func stagedPairCheck(t *testing.T, check agent.ContentCheck) (*agent.Decode, *agent.Prefill) {
	return pairWith(t, check, nil)
}

// pairWith is stagedPairCheck; with engine, decode runs in direct mode on
// the engine's memory (32 of its pages lent at once). Decode revokes after
// the drain, never at the abort: the tests here show an aborted request's
// late writes landing in held memory and not in a GPU page, and with
// revocation at the abort (TCP's default) the fence would refuse most of
// them before they landed anywhere.
func pairWith(t *testing.T, check agent.ContentCheck, engine *agent.EngineMemory) (*agent.Decode, *agent.Prefill) {
	ctx := context.Background()
	dp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	var proxies []*delayproxy.Proxy
	t.Cleanup(func() {
		for _, px := range proxies {
			px.Close()
		}
	})
	d, err := agent.NewDecode(ctx, agent.DecodeConfig{Rank: 0, Slots: 32, ShardBytes: 2 * halfPage, Shards: 1,
		Lease: 2 * time.Second, MaxHold: 20 * time.Second, Fence: true, Revoke: agent.RevokeAfterDrain, ControlAddr: "127.0.0.1:0", Check: check, Engine: engine,
		AdvertiseData: func(ep sdk.Endpoint) []sdk.Endpoint {
			target, pin, pinned := strings.Cut(ep.Address, "#")
			px := &delayproxy.Proxy{Target: target, Delays: []time.Duration{40 * time.Millisecond}}
			addr, err := px.Start("127.0.0.1:0")
			if err != nil {
				t.Error(err)
				return []sdk.Endpoint{ep}
			}
			proxies = append(proxies, px)
			if pinned {
				addr += "#" + pin
			}
			ep.Address = addr
			return []sdk.Endpoint{ep}
		}}, dp.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	pp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pp.Close() })
	p, err := agent.NewPrefill(ctx, agent.PrefillConfig{Rank: 1, DecodeAddr: d.Addr(), SourcePages: 32, ShardBytes: 2 * halfPage,
		Lanes: 1, MaxInflight: 32, MaxBatchPages: 2, Heartbeat: 100 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
		RequestTombstone: 5 * time.Second, BootstrapTimeout: 10 * time.Second, Events: pp.Events()}, pp.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	waitUntil(t, "prefill linked", p.Linked)
	return d, p
}

// waitUntil and waitChan wait for one step (30 s each, for a loaded
// machine); they run on worker goroutines too, so they report with Errorf.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("timed out waiting for %s", what)
			return
		}
	}
}

func waitChan(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Errorf("timed out waiting for %s", what)
	}
}

// heldBytes is a ContentCheck that sees which requests' bytes were in
// decode's slots when they were released (for an aborted request: writes
// that landed while the slots were held), and scrubs them.
type heldBytes struct {
	mu   sync.Mutex
	reqs map[int]int // request → shards released holding its bytes
	late int         // shards written while free
}

func (h *heldBytes) Free(shard []byte) string {
	if bytes.ContainsFunc(shard, func(r rune) bool { return r != 0 }) {
		h.mu.Lock()
		h.late++
		h.mu.Unlock()
		return "a late write"
	}
	return ""
}

func (h *heldBytes) Owned([]byte, core.Tag, int, core.RankID) (bool, string) { return true, "" }

func (h *heldBytes) Released(shard []byte) {
	var k int
	if _, err := fmt.Sscanf(string(shard[:5]), "r%04d", &k); err == nil {
		h.mu.Lock()
		h.reqs[k]++
		h.mu.Unlock()
	}
	clear(shard)
}

// seen is how many of the requests reqs had bytes in slots at release.
func (h *heldBytes) seen(reqs map[int]bool) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for k := range reqs {
		if h.reqs[k] > 0 {
			n++
		}
	}
	return n
}

type outcome struct {
	ok, decodeAborted, prefillAborted int
}

// TestLateWriteNeverReachesGPUPage runs requests whose KV lives in GPU
// memory on both sides through the staged mode, with the data path behind
// a 40 ms delaying proxy; a third are aborted on decode while their writes
// are in flight, a sixth on prefill mid-gather. Decode's engine reuses an
// aborted request's GPU pages as soon as the staged receiver says they are
// quiet, filling them with a free pattern; a free GPU page that changes is
// a write that reached a GPU page it no longer belongs to. Safe build: no
// such write, every successful page exact, and the aborted requests' late
// bytes are seen in the held host slots. The control arm (-tags
// kvfenceunsafe: copies into GPU pages before success) must be caught.
func TestLateWriteNeverReachesGPUPage(t *testing.T) {
	t.Setenv("FAKECUDA_DELAY_US", "1000")
	dev := openFake(t, Options{ChunkBytes: 64 << 10, Chunks: 4})
	held := &heldBytes{reqs: map[int]int{}}
	d, p := stagedPairCheck(t, held)
	pre := newGPUEngine(t, dev)
	dec := &decodePages{t: t, eng: newGPUEngine(t, dev)}
	all := make([]int, engPages)
	for i := range all {
		all[i] = i
	}
	dec.give(all)

	const workers, perWorker = 4, 9
	var mu sync.Mutex
	var out outcome
	abortedReqs := map[int]bool{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for j := range perWorker {
				k := w*perWorker + j
				mode := []int{0, 1, 0, 1, 0, 2}[k%6]
				got := runStaged(t, dev, d, p, pre, dec, k, w, mode)
				mu.Lock()
				switch got {
				case 0:
					out.ok++
				case 1:
					out.decodeAborted++
					abortedReqs[k] = true
				case 2:
					out.prefillAborted++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	waitUntil(t, "every hold to end", func() bool { s := d.Stats(); return s.Core.HeldSlots == 0 && s.Core.AssignedSlots == 0 })
	dev.Close() // every copy that was given to the device has run
	for pg := range engPages {
		dec.check(pg)
	}
	s := d.Stats()
	lateHeld := held.seen(abortedReqs)
	t.Logf("requests: %d verified, %d aborted on decode with writes in flight (%d of them with bytes seen in held host slots), %d aborted on prefill; releases %v; free GPU pages written: %d (%d with a request's bytes); successful requests' GPU pages corrupt: %d",
		out.ok, out.decodeAborted, lateHeld, out.prefillAborted, s.Released, dec.touched, dec.aborted, dec.corrupt)
	if CopiesBeforeSuccess {
		if dec.touched+dec.corrupt == 0 {
			t.Fatal("control arm (copies before success) not caught: no free GPU page was written")
		}
		t.Logf("control arm caught: %d free GPU pages written, %d pages of successful requests corrupt", dec.touched, dec.corrupt)
		return
	}
	if dec.touched != 0 {
		t.Fatalf("%d free GPU pages were written (%d with a request's bytes): a late write reached GPU memory", dec.touched, dec.aborted)
	}
	if out.ok < workers*perWorker/3 || out.decodeAborted < workers*perWorker/4 {
		t.Fatalf("too few requests of each kind ran: %+v", out)
	}
	if lateHeld == 0 {
		t.Fatal("no aborted request's bytes were seen in held host slots: the test did not have writes in flight at abort")
	}
	if held.late != 0 {
		t.Fatalf("%d host slots written while free", held.late)
	}
}

// runStaged runs request k of worker w; mode 0 succeeds (every GPU page
// checked), 1 aborts on decode once prefill's writes are posted, 2 aborts
// on prefill mid-gather. It returns the mode it ran.
func runStaged(t *testing.T, dev *Device, d *agent.Decode, p *agent.Prefill, pre *gpuEngine, dec *decodePages, k, w, mode int) int {
	key := core.RequestKey{Room: uint64(k + 1), Gen: 1}
	pidx := []int{w * 16, w*16 + 1, w*16 + 5, w*16 + 6}
	for i, pg := range pidx {
		for b := range pre.bufs {
			pre.write(t, pg, b, content(k, i, b))
		}
	}
	didx := dec.take(reqPages)
	defer dec.give(didx)
	rv := NewStagedReceiver(dev, d.NewReceiver(key), dec.eng.bufs)
	waitUntil(t, "decode slots", func() bool { _, err := rv.Init(didx, []core.RankID{1}); return err == nil })
	ss := NewStagedSender(dev, p.NewSender(key), pre.bufs)
	defer ss.Close()
	posted := p.Stats().Posted
	waitUntil(t, "prefill source pages", func() bool { return ss.Send(pidx) == nil })
	defer waitUntil(t, "prefill's GPU pages released", ss.GPUReleasable)
	switch mode {
	case 1:
		waitUntil(t, "gather done", ss.GPUReleasable)
		// Abort once prefill posted (a loaded machine may take a while):
		// the writes are then in the 40 ms proxy, and land after the abort.
		waitUntil(t, "writes posted", func() bool { return p.Stats().Posted > posted })
		time.Sleep(2 * time.Millisecond)
		rv.Abort()
		waitChan(t, "decode GPU pages quiet", rv.Quiesced())
		return 1
	case 2:
		ss.Abort()
		rv.Abort()
		waitChan(t, "decode GPU pages quiet", rv.Quiesced())
		return 2
	}
	waitUntil(t, "request final", func() bool { return rv.Poll().Final() })
	if st := rv.Poll(); st != agent.PollSuccess {
		t.Errorf("request %d: %v (%v)", k, st, rv.Err())
		return -1
	}
	for i, pg := range didx {
		for b := range dec.eng.bufs {
			if got := dec.eng.read(t, pg, b); !bytes.Equal(got, content(k, i, b)) {
				dec.mu.Lock()
				dec.corrupt++
				dec.mu.Unlock()
				if !CopiesBeforeSuccess {
					t.Errorf("request %d page %d buffer %d: GPU page holds %.12q", k, i, b, got)
				}
			}
		}
	}
	return 0
}
