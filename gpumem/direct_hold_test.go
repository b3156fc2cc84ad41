package gpumem

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
)

// TestDirectHoldUntilReleased is direct mode's hold rule with real plugin
// processes (TCP), the data path behind the 40 ms delaying proxy: half the
// requests are aborted on decode while prefill's writes are in flight, and
// the engine gives a request's pages back (and lends them again at once)
// as soon as its DirectReceiver says PagesFree. No page may be lent again
// while the previous request's exposure is still open. The TCP plugin
// cannot write GPU memory, so the agent's slots stand in for the engine's
// pages here (in direct mode the exposure is on the engine's pages
// themselves); the aborted requests' bytes seen in held slots at release
// show the writes were in flight, i.e. what would have reached a page
// reused at abort. The control arm (-tags kvfenceunsafe: pages free at
// Abort) must be caught.
func TestDirectHoldUntilReleased(t *testing.T) {
	held := &heldBytes{reqs: map[int]int{}}
	d, p := stagedPairCheck(t, held)
	pages := &enginePages{holder: map[int]*DirectReceiver{}}
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
				if runDirect(t, d, p, pages, k, abort) {
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
	waitUntil(t, "every hold to end", func() bool { s := d.Stats(); return s.Core.HeldSlots == 0 && s.Core.AssignedSlots == 0 })
	lateHeld := held.seen(aborted)
	t.Logf("requests: %d succeeded, %d aborted with writes in flight (%d with bytes seen in the held exposure); pages lent again while their exposure was open: %d",
		ok, len(aborted), lateHeld, pages.reusedOpen)
	if freesAtAbort {
		if pages.reusedOpen == 0 {
			t.Fatal("control arm (engine pages free at abort) not caught: no page was lent again while its exposure was open")
		}
		t.Logf("control arm caught: %d engine pages lent again while the NIC could still write them", pages.reusedOpen)
		return
	}
	if pages.reusedOpen != 0 {
		t.Fatalf("%d engine pages were lent again while their previous request's exposure was open", pages.reusedOpen)
	}
	if ok < workers*perWorker/3 || len(aborted) < workers*perWorker/3 {
		t.Fatalf("too few requests of each kind ran: %d succeeded, %d aborted", ok, len(aborted))
	}
	if lateHeld == 0 {
		t.Fatal("no aborted request's bytes were seen in its held exposure: the test did not have writes in flight at abort")
	}
	if held.late != 0 {
		t.Fatalf("%d slots written while free", held.late)
	}
}

// runDirect runs request k; with abort it aborts once prefill's writes are
// posted (they are then in the proxy and land after the abort). It returns
// whether the request ran as asked, and gives its pages back when free.
func runDirect(t *testing.T, d *agent.Decode, p *agent.Prefill, pages *enginePages, k int, abort bool) bool {
	key := core.RequestKey{Room: uint64(k + 1), Gen: 1}
	var idx []int
	waitUntil(t, "engine pages", func() bool { idx = pages.take(reqPages); return idx != nil })
	rv := NewDirectReceiver(d.NewReceiver(key))
	waitUntil(t, "decode slots", func() bool { _, err := rv.Init(idx, []core.RankID{1}); return err == nil })
	pages.lend(idx, rv)
	defer func() {
		waitUntil(t, "engine pages free", rv.PagesFree)
		pages.give(idx)
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
	for i, pg := range rv.rv.Pages() { // the request's KV, in place
		if want := append(content(k, i, 0), content(k, i, 1)...); !bytes.Equal(pg, want) {
			t.Errorf("request %d page %d holds %.12q", k, i, pg)
		}
	}
	rv.Finish() // the engine decodes from its pages, then lets the exposure go
	return true
}

// TestDirectAbortAfterSuccessFreesPages: an abort that comes after the
// request succeeded (an engine dropping a finished request) still lets the
// exposure go, so the engine gets its pages back; before the fix the
// exposure stayed open for ever.
func TestDirectAbortAfterSuccessFreesPages(t *testing.T) {
	d, p := stagedPairCheck(t, nil)
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
