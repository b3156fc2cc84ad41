package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// This file: keys bound to shard positions (issue 19 item 2). A slot holds
// one shard per tensor-parallel prefill rank; the rank at position pos of
// an exposure writes only shardRange(pos) of each slot. With a fence,
// decode grants each rank keys over its own shards only, so a co-rank
// holding any of them cannot write another rank's shard — on its first
// request too, and whichever keys it holds:
//
//   - bounds pieces: one key per rank per run of consecutive slots, a
//     pieced window (sdk.Window.Stride = slot, Piece = shard);
//   - bounds window: one key per rank per slot, over its shard alone;
//   - bounds none (the transport does not confine writes to a key's
//     window, or there is no fence): nothing can bind a key to a shard;
//     keys cover whole slots and each rank is told its shard's offset
//     (DecodeConfig.RequireShardKeys refuses to start instead).
//
// keyRef.Base is where the rank's own shard of the page is under the key
// (control protocol v2): prefill writes exactly there.

// shardRange is the rank at position pos's bytes in every slot.
func (d *Decode) shardRange(pos int) (off, n int64) {
	return int64(pos) * d.cfg.ShardBytes, d.cfg.ShardBytes
}

// layout is one registered region the slots live in: the pool, or one of
// the engine's buffers in direct mode (direct_layers.go), where a slot
// (engine page) is slotB bytes and each rank's shard of it shardB.
type layout struct {
	region        sdk.RegionID
	slotB, shardB int64
}

// chooseShardKeys says how this decode rank binds keys to shard positions
// (at start): as far as its transport enforces, or as the test override.
func (d *Decode) chooseShardKeys() (sdk.Bounds, error) {
	b := d.info.Capabilities.Bounds
	if d.cfg.keyBounds != nil {
		b = min(b, *d.cfg.keyBounds)
	}
	if !d.fence || d.restartFenced() {
		b = sdk.BoundsNone // one pool key per instance: nothing to bind
	}
	if b == sdk.BoundsNone && d.cfg.RequireShardKeys {
		return b, errdefs.Errorf(errdefs.FailedPrecondition,
			"decode: shard keys required, but keys cannot be bound to shard positions here (bound as %s: fence %v, restart fence %v, transport %q declares bounds %s)",
			b,
			d.fence, d.restartFenced(), d.info.Name, d.info.Capabilities.Bounds)
	}
	return b, nil
}

// pageKey is where page i of an exposure is under one of the windows
// rankWindows returns: the window's index and the page's base in it.
type pageKey struct {
	win  int
	base uint64
}

// rankWindows are the windows that give the rank at pos its shards of
// slots (under d.shardKeys), and where each page is under them. With
// bounds none they are whole runs of slots, the same for every rank, and
// the bases are those of position 0.
func (d *Decode) rankWindows(slots []uint32, pos int) ([]sdk.Window, []pageKey) {
	return d.rankWindowsIn(layout{d.region, d.slotB, d.cfg.ShardBytes}, slots, pos)
}

// rankWindowsIn is rankWindows over one layout.
func (d *Decode) rankWindowsIn(lay layout, slots []uint32, pos int) ([]sdk.Window, []pageKey) {
	off, n := int64(pos)*lay.shardB, lay.shardB
	pages := make([]pageKey, len(slots))
	var ws []sdk.Window
	if d.shardKeys == sdk.BoundsWindow {
		for i, s := range slots {
			ws = append(ws, sdk.Window{Region: lay.region, Offset: uint64(int64(s)*lay.slotB + off), Length: uint64(n)})
			pages[i] = pageKey{win: i}
		}
		return ws, pages
	}
	for _, r := range slotRuns(slots) {
		w := sdk.Window{Region: lay.region, Offset: uint64(int64(slots[r.first]) * lay.slotB), Length: uint64(int64(r.n) * lay.slotB)}
		if d.shardKeys == sdk.BoundsPieces {
			w.Offset += uint64(off)
			w.Length = uint64(int64(r.n-1)*lay.slotB + n)
			w.Stride, w.Piece = uint64(lay.slotB), uint64(n)
		}
		for p := 0; p < r.n; p++ {
			pages[r.first+p] = pageKey{win: len(ws), base: uint64(int64(p) * lay.slotB)}
		}
		ws = append(ws, w)
	}
	return ws, pages
}

// grantWindows grants every window for writer ("" = any holder), in
// parallel, and returns the per-page keys and every key granted (to
// revoke, even on error).
func (d *Decode) grantWindows(ws []sdk.Window, pages []pageKey, writer string) ([]keyRef, []sdk.Key, error) {
	keys := make([]sdk.Key, len(ws))
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			w := ws[i]
			w.Writer = writer
			keys[i], errs[i] = d.granter.Grant(ctx, w)
		}()
	}
	wg.Wait()
	var granted []sdk.Key
	for i, k := range keys {
		if errs[i] == nil {
			granted = append(granted, k)
		}
	}
	refs := make([]keyRef, len(pages))
	for i, p := range pages {
		refs[i] = keyRef{Key: uint64(keys[p.win]), Base: p.base}
	}
	return refs, granted, errors.Join(errs...)
}

// grantFenced makes an exposure's per-exposure keys (loop only): each rank
// its own, over its shards, bound to its data identity where the
// transport can; a rank that announces no identity to a transport that
// binds writers gets none.
func (d *Decode) grantFenced(dt *decTag) error {
	dt.rankKeys = map[core.RankID][]keyRef{}
	shared := false
	for pos, rank := range dt.ranks {
		writer := ""
		if l := d.links[rank]; l != nil && d.bindWriters {
			writer = l.peer.Writer
		}
		switch {
		case d.bindWriters && writer == "":
			d.stats.NoWriterKeys++
			d.log.Warn("rank announces no data identity: no keys for it", "tag", dt.tag, "rank", rank)
			dt.rankKeys[rank] = nil // refused: not the shared keys either
			continue
		case d.shardKeys == sdk.BoundsNone && writer == "":
			shared = true
			continue
		}
		refs, err := d.grantRank(dt, pos, writer)
		switch {
		case err != nil:
			return err
		case refs == nil:
			shared = true
		default:
			dt.rankKeys[rank] = refs
		}
	}
	if !shared {
		return nil
	}
	d.stats.UnboundGrants++
	refs, granted, err := d.grantPages(dt.slots, 0, false, "")
	dt.keys = refs
	dt.granted = append(dt.granted, granted...)
	return err
}

// grantRank grants the rank at pos keys of its own. A writer not connected
// to our transport yet (its first request) gets them unbound to its
// identity — but still over its shards only; with bounds none it gets nil
// (the shared keys).
func (d *Decode) grantRank(dt *decTag, pos int, writer string) ([]keyRef, error) {
	shift := d.shardKeys == sdk.BoundsNone // whole-slot keys: Base moves to the shard
	refs, granted, err := d.grantPages(dt.slots, pos, shift, writer)
	dt.granted = append(dt.granted, granted...)
	if writer != "" && errdefs.Is(err, errdefs.FailedPrecondition) {
		d.log.Debug("writer not connected: keys not bound to its identity", "tag", dt.tag, "rank", dt.ranks[pos], "error", err)
		if d.shardKeys == sdk.BoundsNone {
			return nil, nil
		}
		refs, granted, err = d.grantPages(dt.slots, pos, shift, "")
		dt.granted = append(dt.granted, granted...)
		if err == nil {
			d.stats.UnboundGrants++
		}
		return refs, err
	}
	if err == nil && writer != "" {
		d.stats.BoundGrants++
	} else if err == nil {
		d.stats.UnboundGrants++
	}
	return refs, err
}

// keysFor is what the Assign to rank carries: its own keys, or the shared
// ones at its shard's offset; none for a rank refused keys.
func (dt *decTag) keysFor(d *Decode, rank core.RankID) []keyRef {
	if k, ok := dt.rankKeys[rank]; ok {
		return k
	}
	pos := -1
	for i, r := range dt.ranks {
		if r == rank {
			pos = i
		}
	}
	if dt.keys == nil || pos < 0 {
		return nil
	}
	out := make([]keyRef, len(dt.keys))
	for i, k := range dt.keys {
		out[i] = d.shiftToShard(k, pos)
	}
	return out
}
