package agent

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// layerPageBytes is a 4 KiB page split across three engine buffers, the
// way an engine keeps one KV buffer per layer (uneven, so that a piece
// written into the wrong buffer or at the wrong page shows).
var layerPageBytes = []int64{1024, 2048, 1024}

// engineBuffers is 32 engine pages split across len(layerPageBytes)
// buffers the engine owns (host memory here: the TCP plugin maps each).
func engineBuffers(t *testing.T) ([]*sdk.SharedMemory, func(*DecodeConfig)) {
	t.Helper()
	var mems []*sdk.SharedMemory
	var bufs []EngineBuffer
	for _, pb := range layerPageBytes {
		mem, err := sdk.NewSharedMemory("engine-layer", uint64(32*pb))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mem.Close() })
		mems = append(mems, mem)
		bufs = append(bufs, EngineBuffer{Desc: mem.Desc(), PageBytes: pb})
	}
	return mems, func(c *DecodeConfig) {
		c.Slots, c.Check = 8, nil // content checks read one range per page: refused split
		c.Engine = &EngineMemory{Pages: 32, Buffers: bufs}
	}
}

// TestDirectSplitAcrossBuffers: with the engine's pages split across
// several buffers, each piece of a request's page lands in its buffer at
// the engine page's offset there, and nothing else of any buffer is
// touched — with the fence (keys bound to shards as pieces, as windows, or
// whole pages) and without it (one key per buffer).
func TestDirectSplitAcrossBuffers(t *testing.T) {
	for _, arm := range keyArms {
		t.Run(arm.name, func(t *testing.T) {
			mems, tweak := engineBuffers(t)
			d, p := startPair(t, func(c *DecodeConfig) {
				tweak(c)
				c.Fence, c.keyBounds = arm.fence, arm.bounds
			}, nil, nil)
			key := core.RequestKey{Room: 9, Gen: 1}
			idx := []int{17, 2, 30}
			rv := d.NewReceiver(key)
			if _, err := rv.InitAt(idx, []core.RankID{1}); err != nil {
				t.Fatal(err)
			}
			snd := transfer(t, p, rv, key, len(idx))
			defer snd.Close()
			checkSplitPages(t, mems, idx, snd.Page)
			rv.Finish()
			waitFor(t, "exposure released", rv.Released)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// keyArms are the ways decode keys a page in direct mode: with the fence,
// bound to shards as pieces, windows or whole pages; without it, one key
// per region.
var keyArms = []struct {
	name   string
	fence  bool
	bounds *sdk.Bounds
}{
	{"fence pieces", true, nil},
	{"fence window", true, ptr(sdk.BoundsWindow)},
	{"fence none", true, ptr(sdk.BoundsNone)},
	{"no fence", false, nil},
}

// checkSplitPages: engine page idx[i] holds request page i's pieces, in
// buffer order, and every other page of every buffer is untouched.
func checkSplitPages(t *testing.T, mems []*sdk.SharedMemory, idx []int, page func(int) []byte) {
	t.Helper()
	lent := map[int]int{}
	for i, pg := range idx {
		lent[pg] = i
	}
	var lo int64
	for b, mem := range mems {
		pb, view := layerPageBytes[b], mem.Bytes()
		for pg := range 32 {
			got := view[int64(pg)*pb : int64(pg+1)*pb]
			want := make([]byte, pb)
			if i, ok := lent[pg]; ok {
				want = page(i)[lo : lo+pb]
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("buffer %d, engine page %d (lent %v): not the request's piece", b, pg, lent)
			}
		}
		lo += pb
	}
}

// TestDirectSplitRefusesOldPrefill: a decode rank whose pages are split
// across engine buffers refuses a prefill rank that cannot write split
// pages (it would write its whole shard under the first buffer's key), at
// connect, with the reason; one that can is accepted.
func TestDirectSplitRefusesOldPrefill(t *testing.T) {
	d, err := splitDecode(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	hello := peerHello{Role: RolePrefill, Rank: 1, ShardBytes: 4096, Version: ControlVersion, Caps: peerCaps{Quiesce: true}}
	_, _, err = dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, hello)
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("prefill without split pages: %v, want FailedPrecondition", err)
	}
	hello.KeyParts = true
	l, _, err := dial(ctx, d.Addr(), nil, identity{RoleDecode, 0}, hello)
	if err != nil {
		t.Fatalf("prefill that writes split pages: %v", err)
	}
	l.close()
}

// TestDirectSplitRefusedLayouts: buffers whose pages do not add up to a
// page, a page not divisible among the shards, and content checks (which
// read a page as one range) are refused before anything is registered.
func TestDirectSplitRefusedLayouts(t *testing.T) {
	for _, c := range []struct {
		name  string
		tweak func(*DecodeConfig)
		want  errdefs.Class
	}{
		{"sum", func(c *DecodeConfig) { c.Engine.Buffers = c.Engine.Buffers[:2] }, errdefs.InvalidArgument},
		{"shards", func(c *DecodeConfig) { c.Shards, c.ShardBytes = 3, 4096/3+1 }, errdefs.InvalidArgument},
		{"check", func(c *DecodeConfig) { c.Checksums = true }, errdefs.FailedPrecondition},
		{"small", func(c *DecodeConfig) { c.Engine.Pages = 64 }, errdefs.InvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := splitDecode(t, c.tweak)
			if err == nil {
				d.Close()
			}
			if errdefs.ClassOf(err) != c.want {
				t.Fatalf("%v, want %s", err, c.want)
			}
		})
	}
}

// splitDecode starts a decode rank on split engine buffers, its config
// changed by tweak.
func splitDecode(t *testing.T, tweak func(*DecodeConfig)) (*Decode, error) {
	t.Helper()
	_, split := engineBuffers(t)
	cfg := DecodeConfig{Rank: 0, Slots: 16, ShardBytes: 4096, Shards: 1, Lease: time.Second, MaxHold: 2 * time.Second, Fence: true, ControlAddr: "127.0.0.1:0"}
	split(&cfg)
	if tweak != nil {
		tweak(&cfg)
	}
	dp, err := sdk.Open(pluginBin, sdk.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dp.Close() })
	return NewDecode(context.Background(), cfg, dp.Transport())
}

// TestDirectSplitTwoShards: two prefill ranks share each page (shards 2)
// over split engine buffers: the rank at shard position pos writes the
// pos-th half of every buffer's page, and nothing else — with keys bound
// to shards as pieces, as windows, and whole pages with each rank told its
// offset.
func TestDirectSplitTwoShards(t *testing.T) {
	for _, arm := range []struct {
		name   string
		bounds sdk.Bounds
	}{{"pieces", sdk.BoundsPieces}, {"window", sdk.BoundsWindow}, {"none", sdk.BoundsNone}} {
		t.Run(arm.name, func(t *testing.T) {
			mems, split := engineBuffers(t)
			d, p1 := startPair(t, func(c *DecodeConfig) {
				split(c)
				c.ShardBytes, c.Shards, c.keyBounds = 2048, 2, &arm.bounds
			}, func(c *PrefillConfig) { c.ShardBytes = 2048 }, nil)
			p2 := startPrefill(t, d.Addr(), func(c *PrefillConfig) { c.Rank, c.ShardBytes = 2, 2048 })
			waitFor(t, "prefill rank 2 linked", p2.Linked)
			// The first request's keys may be unbound (the writers' data
			// connections are not up yet); the second's are bound to them.
			for room, idx := range [][]int{{20, 6}, {7, 21, 0}} {
				splitShardsRequest(t, d, mems, []*Prefill{p1, p2}, core.RequestKey{Room: uint64(room + 11), Gen: 1}, idx)
			}
		})
	}
}

// splitShardsRequest runs one request whose pages idx two prefill ranks
// share, and checks every buffer.
func splitShardsRequest(t *testing.T, d *Decode, mems []*sdk.SharedMemory, ps []*Prefill, key core.RequestKey, idx []int) {
	t.Helper()
	rv := d.NewReceiver(key)
	if _, err := rv.InitAt(idx, []core.RankID{1, 2}); err != nil {
		t.Fatal(err)
	}
	var shards [2]*KVSender
	for pos, p := range ps {
		shards[pos] = sendShards(t, p, key, len(idx), byte(pos+1+int(key.Room)))
	}
	waitFor(t, "request final", func() bool { return rv.Poll().Final() })
	if st := rv.Poll(); st != PollSuccess {
		t.Fatalf("request %v: %v (%v)", key, st, rv.Err())
	}
	// The page as a slot: each buffer's piece is rank 1's half then rank 2's.
	page := func(i int) []byte {
		var out []byte
		var lo int64
		for _, pb := range layerPageBytes {
			for _, s := range shards {
				out = append(out, s.Page(i)[lo:lo+pb/2]...)
			}
			lo += pb / 2
		}
		return out
	}
	checkSplitPages(t, mems, idx, page)
	rv.Finish()
	waitFor(t, "exposure released", rv.Released)
	for _, mem := range mems {
		clear(mem.Bytes()) // the engine reuses the pages
	}
}

// sendShards sends n pages of a pattern (seeded by fill) from p.
func sendShards(t *testing.T, p *Prefill, key core.RequestKey, n int, fill byte) *KVSender {
	t.Helper()
	snd := p.NewSender(key)
	t.Cleanup(func() { snd.Close() })
	waitFor(t, "prefill source pages", func() bool { return snd.Init(n) == nil })
	for i := range n {
		for j := range snd.Page(i) {
			snd.Page(i)[j] = fill + byte(i*31+j*7)
		}
	}
	if err := snd.Send(n); err != nil {
		t.Fatal(err)
	}
	if err := snd.Finish(n); err != nil {
		t.Fatal(err)
	}
	return snd
}

// TestPartsMustCoverTheShard: a prefill rank writes a split page piece by
// piece from its shard's start, so parts that do not add up to exactly
// one shard (it would read past its source page, or leave KV unwritten)
// make the Assign malformed.
func TestPartsMustCoverTheShard(t *testing.T) {
	for _, c := range []struct {
		parts []keyPart
		ok    bool
	}{
		{nil, true},
		{[]keyPart{{Len: 1024}, {Len: 3072}}, true},
		{[]keyPart{{Len: 1024}, {Len: 1024}}, false},
		{[]keyPart{{Len: 4096}, {Len: 4096}}, false},
		{[]keyPart{{Len: 0}, {Len: 4096}}, false},
		{[]keyPart{{Len: 1 << 63}, {Len: 1 << 63}, {Len: 4096}}, false}, // wraps around to 4096
	} {
		if got := partsCoverShard(c.parts, 4096); got != c.ok {
			t.Errorf("parts %v: %v, want %v", c.parts, got, c.ok)
		}
	}
}
