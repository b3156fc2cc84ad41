package agent

import (
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/sdk"
	"github.com/kvfence/kvfence/sdk/sdktest"
)

// fakeRank is a prefill rank driven by the test: its own control link and
// its own TCP plugin process, whose data identity it announces.
type fakeRank struct {
	rank   core.RankID
	l      *link
	tr     sdk.Transport
	src    *sdk.SharedMemory
	region sdk.RegionID
	peer   sdk.PeerID
}

func newFakeRank(t *testing.T, d *Decode, rank core.RankID, shard int64) *fakeRank {
	return newFakeRankAnnouncing(t, d, rank, shard, true)
}

// newFakeRankAnnouncing is newFakeRank whose Hello names its data identity
// only if announce.
func newFakeRankAnnouncing(t *testing.T, d *Decode, rank core.RankID, shard int64, announce bool) *fakeRank {
	t.Helper()
	ctx := context.Background()
	r := &fakeRank{rank: rank, tr: sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{}).Transport()}
	ep, err := r.tr.LocalEndpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	writer := ep.Address
	if !announce {
		writer = ""
	}
	if r.l, _, err = dial(ctx, d.Addr(), nil, identity{RoleDecode, uint32(d.cfg.Rank)}, peerHello{Role: RolePrefill, Rank: uint32(rank), Version: ControlVersion,
		Caps: peerCaps{Quiesce: true}, ShardBytes: shard, Writer: writer}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.l.close)
	waitFor(t, "the rank's link", func() bool { return writerTail(t, d.Metrics, uint32(rank)) > 0 })
	if r.src, err = sdk.NewSharedMemory("writer-src", uint64(shard)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.src.Close() })
	if r.region, err = r.tr.RegisterMemory(ctx, r.src.Desc()); err != nil {
		t.Fatal(err)
	}
	if r.peer, err = r.tr.Connect(ctx, sdk.Endpoint{Transport: r.l.peer.DataTransport, Address: r.l.peer.DataAddress}); err != nil {
		t.Fatal(err)
	}
	return r
}

// assign waits for the Assign of tag on the rank's link.
func (r *fakeRank) assign(t *testing.T, tag core.Tag) (core.Message, []keyRef) {
	t.Helper()
	for {
		f, err := r.l.recv(nil)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := core.DecodeMessage(f.Core); err == nil && m.Kind == core.KindAssign && m.Tag == tag {
			return m, f.Keys
		}
	}
}

// write posts one shard filled with fill under k.Key at offset off under
// the key (k.Base: the rank's own shard of the page) through this rank's
// transport and returns how it completed.
func (r *fakeRank) write(t *testing.T, id sdk.BatchID, k keyRef, off uint64, fill byte) sdk.Completion {
	t.Helper()
	b := r.src.Bytes()
	for i := range b {
		b[i] = fill
	}
	n := uint64(len(b))
	err := r.tr.Post(context.Background(), sdk.Batch{ID: id, Peer: r.peer, Ops: []sdk.Op{{Kind: sdk.OpWrite,
		LocalRegion: r.region, RemoteKey: sdk.Key(k.Key), RemoteOffset: off, Length: n}}})
	if err != nil {
		return sdk.Completion{Batch: id, Status: sdk.FailedDefinite, Detail: "refused at Post: " + err.Error()}
	}
	select {
	case c := <-r.tr.Completions():
		return c
	case <-time.After(30 * time.Second):
		t.Fatal("no completion")
	}
	return sdk.Completion{}
}

// warmUp runs a first request (room 1) with a write from each rank: until
// then no rank has a data connection open at the decode's plugin, so the
// first request's keys cannot be bound to the ranks' identities.
func warmUp(t *testing.T, d *Decode, rs ...*fakeRank) {
	t.Helper()
	var ranks []core.RankID
	for _, r := range rs {
		ranks = append(ranks, r.rank)
	}
	warm, err := d.NewReceiver(core.RequestKey{Room: 1, Gen: 1}).Init(1, ranks)
	if err != nil {
		t.Fatal(err)
	}
	for pos, r := range rs {
		_, keys := r.assign(t, warm)
		if c := r.write(t, sdk.BatchID(10+pos), keys[0], keys[0].Base, 0x11); c.Status != sdk.Succeeded {
			t.Fatalf("rank %d's write under its first key: %+v", r.rank, c)
		}
	}
}

// TestWriterBoundKeysRefuseAnotherRank (issue 15, item 3): decode grants
// each prefill rank keys bound to the data identity it announced, so rank
// 2's transport, holding rank 1's key, is refused by the receiving plugin
// and lands nothing in rank 1's shard. The control arm grants unbound keys
// (as before) and the same write lands: the test can fail.
func TestWriterBoundKeysRefuseAnotherRank(t *testing.T) {
	const shard = 4096
	for _, arm := range []struct {
		name    string
		unbound bool
	}{{"bound", false}, {"unbound-control", true}} {
		t.Run(arm.name, func(t *testing.T) {
			plug := sdktest.Subprocess(t, pluginBin, sdk.OpenOptions{})
			d, err := NewDecode(context.Background(), DecodeConfig{Rank: 0, Slots: 2, ShardBytes: shard, Shards: 2,
				Lease: 10 * time.Second, MaxHold: 20 * time.Second, Fence: true, UnboundKeys: arm.unbound,
				ControlAddr: "127.0.0.1:0"}, plug.Transport())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Close)
			a, b := newFakeRank(t, d, 1, shard), newFakeRank(t, d, 2, shard)
			ranks := []core.RankID{1, 2}
			warmUp(t, d, a, b)

			tag, err := d.NewReceiver(core.RequestKey{Room: 2, Gen: 1}).Init(1, ranks)
			if err != nil {
				t.Fatal(err)
			}
			m, keysA := a.assign(t, tag)
			_, keysB := b.assign(t, tag)
			st := d.Stats()
			if bound := st.BoundGrants >= 2; bound == arm.unbound || keysA[0].Key == keysB[0].Key {
				t.Fatalf("bound grants %d (unbound arm: %v); rank keys %#x %#x (each rank has its own, issue 19)", st.BoundGrants, arm.unbound, keysA[0].Key, keysB[0].Key)
			}
			shardA := d.mem.Bytes()[int64(m.Slots[0])*2*shard:][:shard]

			// Rank 2's transport writes into rank 1's shard with rank 1's key.
			c := b.write(t, 30, keysA[0], keysA[0].Base, 0xEE)
			landed := shardA[0] == 0xEE || shardA[shard-1] == 0xEE
			t.Logf("rank 2 under rank 1's key: %v (%s), landed %v", c.Status, c.Detail, landed)
			if arm.unbound {
				if c.Status != sdk.Succeeded || !landed {
					t.Fatalf("control arm: with unbound keys the other rank's write should land: %+v, landed %v", c, landed)
				}
				return
			}
			if c.Status == sdk.Succeeded || landed {
				t.Fatalf("another rank's write under a writer-bound key: %+v, landed %v", c, landed)
			}
			// The key's own writer is served.
			if c := a.write(t, 31, keysA[0], keysA[0].Base, 0xAA); c.Status != sdk.Succeeded || shardA[0] != 0xAA {
				t.Fatalf("rank 1 under its own bound key: %+v, byte %#x", c, shardA[0])
			}
		})
	}
}
