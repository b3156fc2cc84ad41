package agent

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/internal/demo/oracle"
	"github.com/kvfence/kvfence/sdk"
)

// The agents' message handling end to end, fuzzed: each input is the raw
// bytes of one control-plane frame as it arrives on a live, authenticated
// link (JSON, then the core encoding inside), handled by the same code a
// received frame goes through — decoding, the agent's bounds and checks,
// the core, and what the agent then does with the transport. Whatever the
// bytes, the agent must not panic, must keep serving, and nothing may be
// written into free memory.

// frameBytes is the wire form of a frame carrying m (and keys).
func frameBytes(m core.Message, keys []keyRef) []byte {
	b, _ := frameCodec{}.Marshal(&frame{Type: frameCore, Seq: 2, Core: core.AppendMessage(nil, &m), Keys: keys})
	return b
}

func FuzzDecodeControl(f *testing.F) {
	const inst = 7 // a fixed instance, so seeds can name live tags
	tag := func(room uint64) core.Tag { return core.Tag{Instance: inst, Room: room, Gen: 1} }
	lease := core.Time(time.Now().Add(time.Hour).UnixNano())
	// Finding 4: room 3 admitted for three ranks in two-shard slots, then
	// rank 1 (the third) commits: its shard lies past the pool's end.
	f.Add(frameBytes(core.Message{Kind: core.KindCommit, Tag: tag(3), Rank: 1, Coverage: 12, Checksum: 1}, nil), uint8(12), uint8(3))
	for _, m := range []core.Message{
		{Kind: core.KindCommit, Tag: tag(1), Rank: 1, Coverage: 2},
		{Kind: core.KindDrainAck, Tag: tag(2), Rank: 1, Evidence: core.EvidenceCompleted},
		{Kind: core.KindFail, Tag: tag(1), Rank: 1, Reason: core.ReasonSendFailed},
		{Kind: core.KindHeartbeat, Rank: 1, Session: 5, Seq: 1, Full: true, Tags: []core.Tag{tag(1), tag(2), tag(99)}, Count: 3,
			Digest: core.TagHash(tag(1)) + core.TagHash(tag(2)) + core.TagHash(tag(99)), Outstanding: 3},
		{Kind: core.KindHeartbeat, Rank: 1, Session: 5, Seq: 2, Tags: []core.Tag{tag(3)}, Ended: []core.Tag{tag(99)}, Count: 3, Outstanding: 1},
		{Kind: core.KindAssign, Tag: tag(1), Rank: 1, LeaseUntil: lease, Ranks: []core.RankID{1, 2, 3}, Slots: []uint32{0, 15, 16}},
	} {
		f.Add(frameBytes(m, nil), uint8(2), uint8(1))
	}
	f.Add([]byte(`{"t":4,"s":2,"c":"AQ=="}`), uint8(0), uint8(0))
	f.Add([]byte(`{"t":5,"p":{"op":"admit"}}`), uint8(200), uint8(2))

	dp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = dp.Close() })
	d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Instance: inst, Slots: 16, ShardBytes: 4096, Shards: 2,
		Lease: time.Second, MaxHold: 2 * time.Second, Fence: true, Revoke: RevokeAtAbort, Checksums: true, Check: oracle.Check{}, ControlAddr: "127.0.0.1:0"}, dp.Transport())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(d.Close)
	peer := linkedPeer(f, d, peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion,
		Caps: peerCaps{Quiesce: true}, Checksums: true})

	// Each input is a router's admission (room 3: pages, written by ranks
	// nranks..1) and then one frame from rank 1.
	f.Fuzz(func(t *testing.T, data []byte, pages, nranks uint8) {
		// Rooms 1 and 2 are exposed to rank 1 (again, once a frame ended them).
		for room := uint64(1); room <= 2; room++ {
			_, _ = d.NewReceiver(core.RequestKey{Room: room, Gen: 1}).Init(2, []core.RankID{1})
		}
		ranks := make([]core.RankID, nranks)
		for i := range ranks {
			ranks[i] = core.RankID(int(nranks) - i)
		}
		rv := d.NewReceiver(core.RequestKey{Room: 3, Gen: 1})
		if _, err := rv.Init(int(pages), ranks); err == nil {
			defer rv.Abort()
		}
		fr := new(frame)
		if (frameCodec{}).Unmarshal(data, fr) != nil {
			return
		}
		d.onFrame(peer, fr)
		// The loop ran the frame and still serves; nothing landed in
		// free memory. (A rank may lie that it wrote what it did not: the
		// oracle then counts the handed-off pages as corrupt, which only
		// checksums at commit catch; that is no write out of place.)
		if s := d.Stats(); s.FreeWrites != 0 {
			t.Fatalf("%d writes into free memory after frame %q", s.FreeWrites, data)
		}
	})
}

func FuzzPrefillControl(f *testing.F) {
	tag := func(room uint64) core.Tag { return core.Tag{Instance: 7, Room: room, Gen: 1} }
	lease := core.Time(time.Now().Add(time.Hour).UnixNano())
	for _, tc := range []struct {
		m    core.Message
		keys []keyRef
	}{
		{core.Message{Kind: core.KindAssign, Tag: tag(1), Rank: 1, LeaseUntil: lease, Ranks: []core.RankID{1}, Slots: []uint32{0, 1}},
			[]keyRef{{Key: 1}, {Key: 1, Base: 4096}}},
		{core.Message{Kind: core.KindAssign, Tag: tag(2), Rank: 1, LeaseUntil: lease, Ranks: []core.RankID{2, 1}, Slots: []uint32{3}},
			[]keyRef{{Key: 9, Base: 1 << 40}}},
		{core.Message{Kind: core.KindAssign, Tag: tag(3), Rank: 1, LeaseUntil: lease, Ranks: []core.RankID{1}, Slots: []uint32{4}},
			[]keyRef{{Key: 2, Parts: []keyPart{{Key: 2, Len: 1024}, {Key: 3, Base: 8192, Len: 3072}}}}}, // split across buffers
		{core.Message{Kind: core.KindGrant, Tag: tag(1), Rank: 1, LeaseUntil: lease}, nil},
		{core.Message{Kind: core.KindLease, Tag: core.Tag{Instance: 7}, Rank: 1, Session: 3, Seq: 1, LeaseUntil: lease, Tags: []core.Tag{tag(2)}}, nil},
		{core.Message{Kind: core.KindLease, Tag: core.Tag{Instance: 7}, Rank: 1, Session: 3, Seq: 2, Full: true}, nil},
		{core.Message{Kind: core.KindAbort, Tag: tag(1), Rank: 1, Reason: core.ReasonDecodeAbort}, nil},
		{core.Message{Kind: core.KindReject, Tag: tag(2), Rank: 1, Reason: core.ReasonRejected}, nil},
	} {
		f.Add(frameBytes(tc.m, tc.keys))
	}

	// A real data endpoint behind the fake decode, so accepted Assigns are
	// posted through the transport (and refused there: the keys are made up).
	dp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		f.Fatal(err)
	}
	ep, err := dp.Transport().LocalEndpoint(context.Background())
	if err != nil {
		f.Fatal(err)
	}
	addr := fakeDecode(f, peerHello{Role: RoleDecode, Rank: 0, Version: ControlVersion, SlotBytes: 8192, ShardBytes: 4096,
		DataTransport: ep.Transport, DataAddress: ep.Address}, nil)
	p := startPrefill(f, addr)
	// Cleanups run last first: the data endpoint goes before the prefill
	// plugin, whose Close otherwise waits on batches still open to it.
	f.Cleanup(func() { _ = dp.Close() })
	waitFor(f, "prefill linked", p.Linked)
	var l *link
	p.lp.call(func() { l = p.link })

	f.Fuzz(func(t *testing.T, data []byte) {
		// Rooms 1 and 2 are computed and waiting for their Assigns.
		for room := uint64(1); room <= 2; room++ {
			s := p.NewSender(core.RequestKey{Room: room, Gen: 1})
			if s.Init(2) == nil {
				_ = s.Send(2)
				_ = s.Finish(2)
				go func() { <-s.Done(); s.Close() }()
			}
		}
		fr := new(frame)
		if (frameCodec{}).Unmarshal(data, fr) != nil {
			return
		}
		p.onFrame(l, fr)
		p.Stats() // the loop ran the frame and still serves
	})
}

// linkedPeer links a client as hello to d and returns decode's side of the
// link (what its reader hands frames from); the client drains what decode
// sends back.
func linkedPeer(tb testing.TB, d *Decode, hello peerHello) *link {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, hello)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(cl.close)
	go func() {
		for {
			if _, err := cl.recv(nil); err != nil {
				return
			}
		}
	}()
	var l *link
	waitFor(tb, "decode's side of the link", func() bool {
		d.lp.call(func() { l = d.links[core.RankID(hello.Rank)] })
		return l != nil
	})
	return l
}
