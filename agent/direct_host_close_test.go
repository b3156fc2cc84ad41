package agent

import (
	"bytes"
	"sync"
	"testing"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/sdk"
)

// TestDirectHostLandingReleasedAtClose: once every exposure over the host
// landing pages was released, Close deregisters and unmaps them (the
// agent mapped them; nothing else would) — with the fence and without it.
func TestDirectHostLandingReleasedAtClose(t *testing.T) {
	for _, fence := range []bool{true, false} {
		t.Run(map[bool]string{true: "fence", false: "no-fence"}[fence], func(t *testing.T) {
			_, tweak := engineMemory(t)
			d, p := startPair(t, func(c *DecodeConfig) {
				tweak(c)
				c.Engine.HostPages, c.Slots, c.Fence = hostPages, 8+hostPages, fence
			}, nil, nil)
			key := core.RequestKey{Room: 3, Gen: 1}
			idx := []int{5, 33}
			rv := d.NewReceiver(key)
			if _, err := rv.InitAt(idx, []core.RankID{1}); err != nil {
				t.Fatal(err)
			}
			snd := transfer(t, p, rv, key, len(idx))
			defer snd.Close()
			checkLanding(t, d, idx, snd.Page)
			rv.Finish()
			waitFor(t, "exposure released", rv.Released)
			mem := d.landing.mem
			d.Close()
			if mem.Bytes() != nil {
				t.Fatal("host landing pages still mapped after Close, with no exposure left that could write them")
			}
			d.Close() // twice: nothing left to release
			d.ReleaseHostPages()
		})
	}
}

// TestDirectHostLandingKeptWhileWritable: Close while an aborted request's
// batch to a landing page is in flight (held: not drained) keeps the
// landing pages mapped — the late write lands in them after Close, in
// memory still theirs — and ReleaseHostPages unmaps them only after
// decode's transport is closed. A Close that unmapped at once (the old
// leak fixed the wrong way) fails the first check.
func TestDirectHostLandingKeptWhileWritable(t *testing.T) {
	_, tweak := engineMemory(t)
	g := &gatedPost{posted: make(chan struct{}), open: make(chan struct{})}
	d, p, dp := startPairPlugin(t, func(c *DecodeConfig) {
		tweak(c)
		c.Engine.HostPages, c.Slots, c.Fence = hostPages, 8+hostPages, false
	}, func(c *PrefillConfig) { c.MaxBatchPages = 4 }, func(tr sdk.Transport) sdk.Transport { g.Transport = tr; return g })
	var once sync.Once
	open := func() { once.Do(func() { close(g.open) }) }
	t.Cleanup(open)
	idx, key := []int{3, 34}, core.RequestKey{Room: 1, Gen: 1}
	rv := d.NewReceiver(key)
	if _, err := rv.InitAt(idx, []core.RankID{1}); err != nil {
		t.Fatal(err)
	}
	snd := p.NewSender(key)
	t.Cleanup(func() { open(); snd.Close() }) // prefill's loop may be in the gated Post
	waitFor(t, "prefill source pages", func() bool { return snd.Init(len(idx)) == nil })
	for i := range idx {
		oracle.FillShard(snd.Page(i), oracle.PageIdentity{Room: 1, Gen: 1, Page: uint32(i), Rank: 1})
	}
	go func() { _ = snd.Send(len(idx)) }() // waits in the gated Post
	<-g.posted
	rv.Abort()
	mem := d.landing.mem
	d.Close()
	if mem.Bytes() == nil {
		t.Fatal("Close unmapped the host landing pages while an aborted request's batch to them was in flight")
	}
	open()
	waitFor(t, "the batch completed", func() bool { m := p.Stats(); return m.Succeeded+m.FailedDefinite+m.InDoubt > 0 })
	if p.Stats().Succeeded > 0 && !bytes.Equal(mem.Bytes()[(34-32)*4096:(35-32)*4096], snd.Page(1)) {
		t.Fatal("the late write succeeded but is not in the landing page it was aimed at")
	}
	_ = dp.Close() // decode's plugin process gone: nothing can write them
	d.ReleaseHostPages()
	if mem.Bytes() != nil {
		t.Fatal("host landing pages still mapped after the transport closed and ReleaseHostPages")
	}
}
