package gpumem

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
)

// directEngine is decode's engine in direct mode: its KV is engPages pages
// of 2×halfPage (K and V of a page), in one fake-GPU buffer (K and V side
// by side) or split across a K and a V buffer — one buffer per layer, the
// way SGLang and vLLM keep theirs.
type directEngine struct {
	dev  *Device
	bufs []Buffer
}

// page reads engine page p through the driver: its piece in every buffer,
// in order.
func (e *directEngine) page(t *testing.T, p int) []byte {
	var out []byte
	for _, b := range e.bufs {
		piece := make([]byte, b.PageBytes)
		if err := e.dev.CopyFromDevice(piece, b.Base+uintptr(int64(p)*b.PageBytes)); err != nil {
			t.Error(err)
		}
		out = append(out, piece...)
	}
	return out
}

// scrub zeroes engine page p in every buffer (the engine reusing it).
func (e *directEngine) scrub(t *testing.T, p int) {
	for _, b := range e.bufs {
		if err := e.dev.CopyToDevice(b.Base+uintptr(int64(p)*b.PageBytes), make([]byte, b.PageBytes)); err != nil {
			t.Error(err)
		}
	}
}

// directPair runs decode in direct mode: the engine's buffers are exported
// as dma-bufs, which decode's TCP plugin process imports (SCM_RIGHTS) and
// registers in place of the agent's pool, so prefill's writes land in the
// engine's pages. With a check (one buffer only: a split page is no one
// range), the agent reads the test's own CPU mapping of the same dma-buf
// (the fake driver's is a memfd; a GPU's has none).
func directPair(t *testing.T, check agent.ContentCheck, split bool) (*agent.Decode, *agent.Prefill, *directEngine) {
	fakeOnly(t) // host-page alignment of the export, and the CPU mapping
	eng := &directEngine{dev: openFake(t, Options{})}
	pieces := []int64{2 * halfPage}
	if split {
		pieces = []int64{halfPage, halfPage}
	}
	var xs []*DirectBuffer
	for _, pb := range pieces {
		base, err := eng.dev.Alloc(engPages * pb)
		if err != nil {
			t.Fatal(err)
		}
		b := Buffer{Base: base, PageBytes: pb}
		x, err := eng.dev.ExportBuffer(b, engPages)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = x.Close() })
		eng.bufs, xs = append(eng.bufs, b), append(xs, x)
	}
	mem := xs[0].EngineMemory()
	if split {
		var err error
		if mem, err = EngineBuffers(xs); err != nil {
			t.Fatal(err)
		}
	}
	if check != nil {
		view, err := sdk.MapDMABuf(xs[0].Desc())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = view.Close() }) // after the agent closed (cleanups run last first)
		mem.View = view.Bytes()
	}
	d, p := pairWith(t, check, mem)
	return d, p, eng
}

// TestDirectHoldUntilReleased is direct mode end to end with real plugin
// processes (TCP, the engine's fake-GPU buffers registered as dma-bufs:
// one, or one per layer), the data path behind the 40 ms delaying proxy:
// half the requests are aborted on decode while prefill's writes are in
// flight, and the engine gives a request's pages back (and lends them
// again at once) as soon as its DirectReceiver says PagesFree. No page may
// be lent again while the previous request's exposure is still open;
// every page of a successful request is read back through the driver,
// buffer by buffer; the aborted requests' bytes seen in their held engine
// pages at release show the writes were in flight, i.e. what would have
// reached a page reused at abort; no byte lands in a free engine page; no
// page is lent at the end. The control arm (-tags kvfenceunsafe: pages
// free at Abort) must be caught in each layout; the core then refuses to
// expose the reused pages again until the release.
func TestDirectHoldUntilReleased(t *testing.T) {
	t.Run("one buffer", func(t *testing.T) { directHold(t, false) })
	t.Run("buffer per layer", func(t *testing.T) { directHold(t, true) })
}

func directHold(t *testing.T, split bool) {
	held := &heldBytes{reqs: map[int]int{}}
	var check agent.ContentCheck = held
	if split {
		check = nil // the engine-side evidence below stands in for it
	}
	d, p, eng := directPair(t, check, split)
	pages := &enginePages{holder: map[int]*DirectReceiver{}, heldSeen: map[int]bool{}}
	for i := range engPages {
		pages.give([]int{i})
	}
	const workers, perWorker = 4, 8
	var mu sync.Mutex
	aborted := map[int]bool{}
	ok := 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for j := range perWorker {
				k := w*perWorker + j
				abort := j%2 == 1
				if runDirect(t, d, p, eng, pages, k, abort) {
					mu.Lock()
					if abort {
						aborted[k] = true
					} else {
						ok++
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	waitUntil(t, "every hold to end", func() bool {
		s := d.Stats()
		return s.Core.HeldSlots == 0 && s.Core.AssignedSlots == 0 && s.Core.HandedSlots == 0
	})
	lateHeld := max(held.seen(aborted), pages.seen(aborted)) // the check, or the engine's look
	t.Logf("%d buffer(s): %d requests succeeded (%d engine pages verified through the driver), %d aborted with writes in flight (%d with bytes seen in the held engine pages); pages lent again while their exposure was open: %d (the core refused to expose them %d times)",
		len(eng.bufs), ok, pages.verified, len(aborted), lateHeld, pages.reusedOpen, pages.refusedLent)
	if freesAtAbort {
		if pages.reusedOpen == 0 {
			t.Fatal("control arm (engine pages free at abort) not caught: no page was lent again while its exposure was open")
		}
		t.Logf("control arm caught (%d buffer(s)): %d engine pages lent again while the NIC could still write them", len(eng.bufs), pages.reusedOpen)
		return
	}
	if pages.reusedOpen != 0 || pages.refusedLent != 0 {
		t.Fatalf("%d engine pages were lent again while their previous request's exposure was open (%d refused by the core)", pages.reusedOpen, pages.refusedLent)
	}
	if pages.verified != ok*reqPages {
		t.Fatalf("%d engine pages verified, want %d", pages.verified, ok*reqPages)
	}
	if ok < workers*perWorker/3 || len(aborted) < workers*perWorker/3 {
		t.Fatalf("too few requests of each kind ran: %d succeeded, %d aborted", ok, len(aborted))
	}
	if lateHeld == 0 {
		t.Fatal("no aborted request's bytes were seen in its held exposure: the test did not have writes in flight at abort")
	}
	if held.late != 0 || pages.late != 0 {
		t.Fatalf("%d slots (agent's check) and %d engine pages (read through the driver when taken) written while free", held.late, pages.late)
	}
}

// runDirect runs request k; with abort it aborts once prefill's writes are
// posted (they are then in the proxy and land after the abort). It returns
// whether the request ran as asked, and gives its pages back when free —
// looking first, through the driver, for an aborted request's bytes in
// them, then zeroing them (a page taken must still be zero).
func runDirect(t *testing.T, d *agent.Decode, p *agent.Prefill, eng *directEngine, pages *enginePages, k int, abort bool) bool {
	key := core.RequestKey{Room: uint64(k + 1), Gen: 1}
	var idx []int
	waitUntil(t, "engine pages", func() bool { idx = pages.take(reqPages); return idx != nil })
	pages.checkFree(t, eng, idx)
	rv := NewDirectReceiver(d.NewReceiver(key))
	waitUntil(t, "decode exposure", func() bool { return pages.init(rv, idx) })
	defer func() {
		waitUntil(t, "engine pages free", rv.PagesFree)
		pages.release(t, eng, idx, k, abort)
	}()
	snd := p.NewSender(key)
	defer snd.Close()
	posted := p.Stats().Posted
	waitUntil(t, "prefill source pages", func() bool { return snd.Init(reqPages) == nil })
	for i := range reqPages {
		copy(snd.Page(i), append(content(k, i, 0), content(k, i, 1)...))
	}
	if err := snd.Send(reqPages); err != nil {
		t.Errorf("request %d: send: %v", k, err)
		return false
	}
	if err := snd.Finish(reqPages); err != nil {
		t.Errorf("request %d: finish: %v", k, err)
		return false
	}
	if abort {
		waitUntil(t, "writes posted", func() bool { return p.Stats().Posted > posted })
		time.Sleep(2 * time.Millisecond)
		rv.Abort()
		return true
	}
	waitUntil(t, "request final", func() bool { return rv.Poll().Final() })
	if st := rv.Poll(); st != agent.PollSuccess {
		t.Errorf("request %d: %v (%v)", k, st, rv.Err())
		return false
	}
	for i, pg := range idx { // the request's KV, in the engine's own pages
		verifyEnginePage(t, eng, k, i, pg)
		pages.mu.Lock()
		pages.verified++
		pages.mu.Unlock()
	}
	rv.Finish() // the engine decodes from its pages, then lets the exposure go
	return true
}

// verifyEnginePage: request k's page i is in engine page pg, buffer by
// buffer (K then V: one piece each when split).
func verifyEnginePage(t *testing.T, eng *directEngine, k, i, pg int) {
	got, want := eng.page(t, pg), append(content(k, i, 0), content(k, i, 1)...)
	var lo int64
	for b, buf := range eng.bufs {
		if g, w := got[lo:lo+buf.PageBytes], want[lo:lo+buf.PageBytes]; !bytes.Equal(g, w) {
			t.Errorf("request %d page %d (engine page %d), buffer %d holds %.12q, want %.12q", k, i, pg, b, g, w)
		}
		lo += buf.PageBytes
	}
}

// TestDirectAbortAfterSuccessFreesPages: an abort that comes after the
// request succeeded (an engine dropping a finished request) still lets the
// exposure go, so the engine gets its pages back; before the fix the
// exposure stayed open for ever.
func TestDirectAbortAfterSuccessFreesPages(t *testing.T) {
	d, p, _ := directPair(t, nil, true)
	key := core.RequestKey{Room: 1, Gen: 1}
	rv := NewDirectReceiver(d.NewReceiver(key))
	waitUntil(t, "decode slots", func() bool { _, err := rv.Init([]int{3, 4}, []core.RankID{1}); return err == nil })
	snd := p.NewSender(key)
	defer snd.Close()
	waitUntil(t, "prefill source pages", func() bool { return snd.Init(2) == nil })
	if err := snd.Finish(2); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "request final", func() bool { return rv.Poll().Final() })
	if st := rv.Poll(); st != agent.PollSuccess {
		t.Fatalf("request: %v (%v)", st, rv.Err())
	}
	if rv.PagesFree() {
		t.Fatal("engine pages free while the exposure is open")
	}
	rv.Abort()
	waitUntil(t, "engine pages free after an abort that lost the race", rv.PagesFree)
}
