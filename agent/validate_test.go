package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// Finding 4 (issue 15): a router naming more prefill ranks than a slot has
// shards was admitted; with a fence the decode later panicked, without one
// rank i wrote shard i past its slot — into the next slot. The admission is
// refused now, classified, and the pool is untouched.
func TestAdmissionBeyondShardsIsRefused(t *testing.T) {
	for _, fence := range []bool{true, false} {
		d, _ := startPair(t, func(c *DecodeConfig) { c.Shards = 1; c.Fence = fence }, nil, nil)
		for _, tc := range []struct {
			what  string
			pages int
			ranks []core.RankID
		}{
			{"more ranks than shards", 2, []core.RankID{1, 2}},
			{"four ranks, one shard", 1, []core.RankID{1, 2, 3, 4}},
			{"more pages than the pool has slots", 17, []core.RankID{1}},
			{"decode itself as a writer", 1, []core.RankID{0}},
			{"no rank", 1, nil},
			{"no page", 0, []core.RankID{1}},
		} {
			_, err := d.NewReceiver(core.RequestKey{Room: 9, Gen: 1}).Init(tc.pages, tc.ranks)
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("fence=%v, %s: admitted or misclassified: %v", fence, tc.what, err)
			}
		}
		if s := d.Stats(); s.Core.Admitted != 0 || s.LiveTags != 0 {
			t.Fatalf("fence=%v: a refused admission exposed memory: admitted %d live %d", fence, s.Core.Admitted, s.LiveTags)
		}
		// The agent still serves a well-formed request.
		if _, err := d.NewReceiver(core.RequestKey{Room: 10, Gen: 1}).Init(2, []core.RankID{1}); err != nil {
			t.Fatalf("fence=%v: a valid admission after refusals: %v", fence, err)
		}
	}
}

// Both sides declare their shard size and refuse a peer that disagrees: a
// prefill rank with another shard size would write across shard borders.
func TestShardSizeMismatchIsRefusedBothWays(t *testing.T) {
	d := startDecode(t) // shards of 4096
	ctx := context.Background()
	_, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 8192, Version: ControlVersion, Caps: peerCaps{Quiesce: true}})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "shards of 8192 bytes") {
		t.Fatalf("decode took a prefill rank with 8 KiB shards: %v", err)
	}
	// The prefill side: a decode answering with 2 KiB shards is not linked.
	fake := fakeDecode(t, peerHello{Role: RoleDecode, Rank: 0, Version: ControlVersion, SlotBytes: 2048, ShardBytes: 2048}, nil)
	p := startPrefill(t, fake)
	time.Sleep(300 * time.Millisecond)
	if p.Linked() {
		t.Fatal("prefill linked to a decode whose shards are smaller than its own")
	}
}

// A decode (buggy, or hostile with a valid certificate) that assigns this
// rank a shard position past the slot it declared, or fewer keys than
// slots, is refused at prefill: nothing is posted for it.
func TestAssignOutsideTheSlotIsRefusedAtPrefill(t *testing.T) {
	p, l := prefillOnFakeDecode(t)
	// The engine has both requests computed: any accepted Assign is posted.
	for _, room := range []uint64{5, 6} {
		snd := p.NewSender(core.RequestKey{Room: room, Gen: 1})
		if err := snd.Init(2); err != nil {
			t.Fatal(err)
		}
		if err := snd.Send(2); err != nil {
			t.Fatal(err)
		}
	}
	tag := core.Tag{Instance: 1, Room: 5, Gen: 1}
	send := func(m core.Message, keys []keyRef) {
		l.send(&frame{Type: frameCore, Core: core.AppendMessage(nil, &m), Keys: keys})
	}
	lease := core.Time(time.Now().Add(time.Minute).UnixNano())
	// Rank 1 at position 1 of a one-shard slot: it would write the next slot.
	send(core.Message{Kind: core.KindAssign, Tag: tag, Rank: 1, Decode: 0, LeaseUntil: lease, Ranks: []core.RankID{2, 1}, Slots: []uint32{0, 1}},
		[]keyRef{{Key: 1}, {Key: 1, Base: 4096}})
	// Two slots, one key.
	tag2 := core.Tag{Instance: 1, Room: 6, Gen: 1}
	send(core.Message{Kind: core.KindAssign, Tag: tag2, Rank: 1, Decode: 0, LeaseUntil: lease, Ranks: []core.RankID{1}, Slots: []uint32{0, 1}},
		[]keyRef{{Key: 1}})
	waitFor(t, "oversized", func() bool { return counter(t, p.Metrics, "kvfence_rejected_messages_total", "oversized") == 1 })
	waitFor(t, "malformed", func() bool { return counter(t, p.Metrics, "kvfence_rejected_messages_total", "malformed") == 1 })
	if s := p.Stats(); s.Posted != 0 {
		t.Fatalf("prefill posted %d batches for refused assignments", s.Posted)
	}
}

// prefillOnFakeDecode starts prefill rank 1 linked to a fake decode with
// one-shard slots of 4 KiB, and gives the fake decode's side of the link.
func prefillOnFakeDecode(t *testing.T) (*Prefill, *link) {
	t.Helper()
	links := make(chan *link, 1)
	fake := fakeDecode(t, peerHello{Role: RoleDecode, Rank: 0, Version: ControlVersion, SlotBytes: 4096, ShardBytes: 4096,
		DataTransport: "tcp", DataAddress: "127.0.0.1:1"}, links)
	p := startPrefill(t, fake)
	return p, <-links
}

// fakeDecode serves the control plane as a decode would, answering every
// Hello with welcome; each prefill link is handed to links (if set) and
// kept until the test ends. It is the peer a hostile decode would be.
func fakeDecode(t testing.TB, welcome peerHello, links chan<- *link) string {
	t.Helper()
	done := make(chan struct{})
	srv, err := newServer("127.0.0.1:0", nil, Limits{}.withDefaults(16), func(peerHello) (peerHello, error) { return welcome, nil }, func(l *link) {
		if links != nil {
			links <- l
		}
		select {
		case <-done:
		case <-l.closed():
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(done); srv.Stop() })
	return srv.Addr()
}

// startPrefill starts prefill rank 1 (4 KiB shards) on a real plugin,
// pointed at a decode control address; tweaks adjust its config.
func startPrefill(t testing.TB, decodeAddr string, tweaks ...func(*PrefillConfig)) *Prefill {
	t.Helper()
	pp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pp.Close() })
	cfg := PrefillConfig{Rank: 1, DecodeAddr: decodeAddr, SourcePages: 16, ShardBytes: 4096, Lanes: 1,
		MaxInflight: 16, MaxBatchPages: 4, Heartbeat: 100 * time.Millisecond, SkewMargin: 50 * time.Millisecond,
		RequestTombstone: 5 * time.Second, BootstrapTimeout: 5 * time.Second, Events: pp.Events()}
	for _, tw := range tweaks {
		tw(&cfg)
	}
	p, err := NewPrefill(context.Background(), cfg, pp.Transport())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// A decode (hostile, or one whose router never opens what it admits) that
// sends Assigns for requests this rank never opened cannot grow the rank's
// memory: past maxAssignedTags they are refused and counted, and neither
// the agent nor the core keeps them.
func TestUnopenedAssignsAreBounded(t *testing.T) {
	p, l := prefillOnFakeDecode(t)
	limit := maxAssignedTags(16)
	lease := core.Time(time.Now().Add(time.Minute).UnixNano())
	for room := 0; room < limit+100; room++ {
		m := core.Message{Kind: core.KindAssign, Tag: core.Tag{Instance: 1, Room: uint64(room), Gen: 1}, Rank: 1, Decode: 0,
			LeaseUntil: lease, Ranks: []core.RankID{1}, Slots: []uint32{0}}
		for !l.send(&frame{Type: frameCore, Core: core.AppendMessage(nil, &m), Keys: []keyRef{{Key: 1}}}) {
			time.Sleep(time.Millisecond) // the link's queue is full: wait for the writer
		}
	}
	waitFor(t, "excess assigns refused", func() bool {
		return counter(t, p.Metrics, "kvfence_rejected_messages_total", "excess-assigns") == 100
	})
	var kept int
	p.lp.call(func() { kept = len(p.keys) })
	if kept != limit {
		t.Fatalf("prefill keeps keys of %d assigns, want the bound %d", kept, limit)
	}
}
