package agent

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/sdk"
)

// hostPages is the host landing pages the tests add past the engine's 32
// pages (indices 32..35): where SGLang's aux and state rows land.
const hostPages = 4

// checkLanding: landing page idx[i]-32 holds want(i) for every idx[i] past
// the engine's pages, and every other landing page is zero.
func checkLanding(t *testing.T, d *Decode, idx []int, want func(int) []byte) {
	t.Helper()
	lent := map[int]int{}
	for i, pg := range idx {
		lent[pg] = i
	}
	for h := range hostPages {
		got := d.slotMem(uint32(32 + h))
		w := make([]byte, len(got))
		if i, ok := lent[32+h]; ok {
			w = want(i)
		}
		if !bytes.Equal(got, w) {
			t.Fatalf("host landing page %d (index %d; lent %v): not the request's page", h, 32+h, lent)
		}
	}
}

// TestDirectHostLandingPages: a request's pages past its KV pages (aux and
// state rows) land in host landing pages at the indices past the engine's
// (as staged slots: the whole shard under one key), while its KV pages
// land split across the engine buffers; the landing pages are read back
// through Pages; nothing else is written — with the fence (pieces,
// windows, whole pages) and without it.
func TestDirectHostLandingPages(t *testing.T) {
	for _, arm := range keyArms {
		t.Run(arm.name, func(t *testing.T) {
			mems, tweak := engineBuffers(t)
			d, p := startPair(t, func(c *DecodeConfig) {
				tweak(c)
				c.Engine.HostPages, c.Slots = hostPages, 8+hostPages
				c.Fence, c.keyBounds = arm.fence, arm.bounds
			}, nil, nil)
			key := core.RequestKey{Room: 9, Gen: 1}
			idx := []int{17, 2, 34, 32} // two KV pages, an aux row and a state row
			rv := d.NewReceiver(key)
			if _, err := rv.InitAt(idx, []core.RankID{1}); err != nil {
				t.Fatal(err)
			}
			snd := transfer(t, p, rv, key, len(idx))
			defer snd.Close()
			checkSplitPages(t, mems, idx[:2], snd.Page)
			checkLanding(t, d, idx, snd.Page)
			if pages := rv.Pages(); pages[0] != nil || !bytes.Equal(pages[2], snd.Page(2)) {
				t.Fatal("Pages: an engine page without a host view must be nil, a landing page its bytes")
			}
			rv.Finish()
			waitFor(t, "exposure released", rv.Released)
		})
	}
}

// TestDirectHostLandingTwoShards: with two prefill ranks per page, each
// landing page holds rank 1's whole shard then rank 2's (the staged slot),
// while the KV pages are split per buffer; keys bound as pieces, windows
// and whole pages.
func TestDirectHostLandingTwoShards(t *testing.T) {
	for _, b := range []sdk.Bounds{sdk.BoundsPieces, sdk.BoundsWindow, sdk.BoundsNone} {
		t.Run(b.String(), func(t *testing.T) {
			mems, split := engineBuffers(t)
			d, p1 := startPair(t, func(c *DecodeConfig) {
				split(c)
				c.Engine.HostPages, c.Slots = hostPages, 8+hostPages
				c.ShardBytes, c.Shards, c.keyBounds = 2048, 2, &b
			}, func(c *PrefillConfig) { c.ShardBytes = 2048 }, nil)
			p2 := startPrefill(t, d.Addr(), func(c *PrefillConfig) { c.Rank, c.ShardBytes = 2, 2048 })
			waitFor(t, "prefill rank 2 linked", p2.Linked)
			for room, idx := range [][]int{{20, 33}, {35, 7, 21, 32}} {
				key := core.RequestKey{Room: uint64(room + 11), Gen: 1}
				rv := d.NewReceiver(key)
				if _, err := rv.InitAt(idx, []core.RankID{1, 2}); err != nil {
					t.Fatal(err)
				}
				s1 := sendShards(t, p1, key, len(idx), byte(room+1))
				s2 := sendShards(t, p2, key, len(idx), byte(room+7))
				waitFor(t, "request final", func() bool { return rv.Poll().Final() })
				if st := rv.Poll(); st != PollSuccess {
					t.Fatalf("request %v: %v (%v)", key, st, rv.Err())
				}
				checkLanding(t, d, idx, func(i int) []byte { return append(append([]byte(nil), s1.Page(i)...), s2.Page(i)...) })
				rv.Finish()
				waitFor(t, "exposure released", rv.Released)
				for _, m := range mems {
					clear(m.Bytes())
				}
				clear(d.landing.mem.Bytes())
			}
		})
	}
}

// TestDirectHostLandingRefusals: indices past the landing pages are
// InvalidArgument; a negative HostPages is refused at start.
func TestDirectHostLandingRefusals(t *testing.T) {
	_, tweak := engineMemory(t)
	d, _ := startPair(t, func(c *DecodeConfig) { tweak(c); c.Engine.HostPages = hostPages }, nil, nil)
	if _, err := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1}).InitAt([]int{3, 32 + hostPages}, []core.RankID{1}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("index %d with %d landing pages: %v, want InvalidArgument", 32+hostPages, hostPages, err)
	}
	_, err := splitDecode(t, func(c *DecodeConfig) { c.Engine.HostPages = -1 })
	if !errdefs.IsInvalidArgument(err) {
		t.Fatalf("HostPages -1: %v, want InvalidArgument", err)
	}
}

// gatedPost is prefill's transport with its first Post held until open
// is closed: the batch is then in flight (posted, not landed) for as long
// as the test wants, with no clock involved.
type gatedPost struct {
	sdk.Transport
	once   sync.Once
	posted chan struct{}
	open   chan struct{}
}

func (g *gatedPost) Post(ctx context.Context, b sdk.Batch) error {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.posted)
		<-g.open
	}
	return g.Transport.Post(ctx, b)
}

// landingAbortRun is what landingAbort saw.
type landingAbortRun struct {
	early bool // C was admitted on A's pages while A's batch was in flight
	// lateKV, lateLanding: A's bytes found, after its batch landed, in the
	// engine pages and the landing page lent to C (C's writer not yet run).
	lateKV, lateLanding int
	landed              bool // A's batch completed after the abort
	stats               DecodeStats
}

// landingAbort runs request A over two engine pages and a landing page
// (no fence: one key over each region, so only the hold keeps a late
// write out), holds A's one batch in flight (gatedPost), aborts A on
// decode, and asks for the same pages for request C; then lets the batch
// land, waits for A's release, admits C (when it was refused) and looks
// in C's pages for A's bytes before C's writer runs.
func landingAbort(t *testing.T) landingAbortRun {
	mem, tweak := engineMemory(t)
	g := &gatedPost{posted: make(chan struct{}), open: make(chan struct{})}
	d, p := startPair(t, func(c *DecodeConfig) {
		tweak(c)
		c.Engine.HostPages, c.Slots, c.Fence = hostPages, 8+hostPages, false
	}, func(c *PrefillConfig) { c.MaxBatchPages = 4 }, func(tr sdk.Transport) sdk.Transport { g.Transport = tr; return g })
	var once sync.Once
	open := func() { once.Do(func() { close(g.open) }) }
	t.Cleanup(open) // before the pair closes: prefill's loop may be in Post
	idx, ranks := []int{3, 4, 33}, []core.RankID{1}
	rv := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1})
	if _, err := rv.InitAt(idx, ranks); err != nil {
		t.Fatal(err)
	}
	snd := p.NewSender(core.RequestKey{Room: 1, Gen: 1})
	t.Cleanup(func() { snd.Close() })
	waitFor(t, "prefill source pages", func() bool { return snd.Init(len(idx)) == nil })
	for i := range idx {
		oracle.FillShard(snd.Page(i), oracle.PageIdentity{Room: 1, Gen: 1, Page: uint32(i), Rank: 1})
	}
	sent := make(chan error, 1)
	go func() { // Send and Finish wait on prefill's loop, which waits in the gated Post
		err := snd.Send(len(idx))
		if err == nil {
			err = snd.Finish(len(idx))
		}
		sent <- err
	}()
	waitFor(t, "A's batch posted", func() bool {
		select {
		case <-g.posted:
			return true
		default:
			return false
		}
	})
	rv.Abort()
	var run landingAbortRun
	c := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1})
	_, err := c.InitAt(idx, ranks)
	if run.early = err == nil; !run.early && !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("C on A's held pages: %v, want FailedPrecondition", err)
	}
	open()
	if err := <-sent; err != nil {
		t.Logf("A's send after decode's abort: %v", err) // the abort may reach prefill first
	}
	waitFor(t, "A's batch completed", func() bool { m := p.Stats(); return m.Succeeded+m.FailedDefinite+m.InDoubt > 0 })
	run.landed = p.Stats().Succeeded > 0
	waitFor(t, "A released", rv.Released)
	if !run.early {
		waitFor(t, "C admitted", func() bool { _, err := c.InitAt(idx, ranks); return err == nil })
	}
	run.lateKV, run.lateLanding = holding(d, mem, idx, snd)
	c.Abort()
	waitFor(t, "C released", c.Released)
	run.stats = d.Stats()
	return run
}

// holding counts the pages of idx (engine pages in mem, landing pages)
// that hold snd's page.
func holding(d *Decode, mem *sdk.SharedMemory, idx []int, snd *KVSender) (kv, landing int) {
	for i, pg := range idx {
		if pg < 32 && bytes.Equal(mem.Bytes()[pg*4096:(pg+1)*4096], snd.Page(i)) {
			kv++
		}
		if pg >= 32 && bytes.Equal(d.slotMem(uint32(pg)), snd.Page(i)) {
			landing++
		}
	}
	return kv, landing
}

// TestDirectHostLandingAbortInFlight: a request aborted while its batch
// (engine pages and a landing page) is in flight keeps every page held —
// the same pages asked for by another request are refused — until the
// batch landed and the rank drained; then the other request gets them
// with none of the aborted request's bytes. The known-unsafe core that
// releases at abort is caught by the same late write
// (direct_host_unsafe_test.go).
func TestDirectHostLandingAbortInFlight(t *testing.T) {
	run := landingAbort(t)
	t.Logf("early admission %v, batch landed after abort %v, aborted bytes in the next owner's engine pages %d and landing pages %d, free writes %d, corrupt %d",
		run.early, run.landed, run.lateKV, run.lateLanding, run.stats.FreeWrites, run.stats.CorruptPages)
	switch {
	case run.early:
		t.Fatal("a page of an aborted request with a batch in flight was lent to another request")
	case !run.landed:
		t.Fatal("the aborted request's batch did not land after the abort: the test had no write in flight")
	case run.lateKV+run.lateLanding != 0 || run.stats.FreeWrites != 0 || run.stats.CorruptPages != 0:
		t.Fatal("the aborted request's bytes reached pages lent to the next request")
	}
	if s := run.stats.Core; s.AssignedSlots+s.HeldSlots+s.HandedSlots != 0 {
		t.Fatalf("pages still lent at the end: %+v", s)
	}
}
