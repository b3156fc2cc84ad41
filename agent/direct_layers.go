package agent

// This file: direct mode over several engine buffers (EngineMemory.Buffers):
// SGLang and vLLM keep one KV buffer per layer (K and V, or one MLA
// buffer), so engine page p is PageBytes(b) at p × PageBytes(b) in each
// buffer b. Each buffer is registered as its own region, and a page's
// keys are one per buffer (keyRef.Parts, a control-protocol change both
// sides declare in their Hello: compatible refuses a prefill rank that
// cannot write split pages). The slot's bytes are the buffers' pages in
// order; the rank at shard position pos writes the pos-th
// PageBytes(b)/Shards of each buffer's page — its shard is those pieces,
// concatenated in buffer order.

import (
	"context"
	"fmt"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// EngineBuffer is one of the engine's KV buffers in direct mode.
type EngineBuffer struct {
	// Desc is what the transport registers (a dma-buf, or host-shared
	// memory the engine owns).
	Desc sdk.MemoryDesc
	// PageBytes is one engine page in this buffer: page p is at
	// p × PageBytes.
	PageBytes int64
}

// maxEngineBuffers bounds the buffers one page is split across: every page
// becomes that many writes and keys (a 128-layer model with K and V is 256).
const maxEngineBuffers = 4096

// checkBuffers refuses a split layout that cannot hold the slots.
func (d *Decode) checkBuffers() error {
	e, shards := d.cfg.Engine, int64(d.cfg.Shards)
	var sum int64
	for i, b := range e.Buffers {
		switch {
		case b.PageBytes <= 0 || b.PageBytes%shards != 0:
			return errdefs.Errorf(errdefs.InvalidArgument, "decode: engine buffer %d: page bytes %d must be a positive multiple of the %d shards (each rank writes its share of every buffer's page)", i, b.PageBytes, shards)
		case b.Desc.Size < uint64(int64(e.Pages)*b.PageBytes):
			return errdefs.Errorf(errdefs.InvalidArgument, "decode: engine buffer %d of %d bytes cannot hold %d pages of %d bytes", i, b.Desc.Size, e.Pages, b.PageBytes)
		}
		sum += b.PageBytes
	}
	switch {
	case len(e.Buffers) > maxEngineBuffers:
		return errdefs.Errorf(errdefs.InvalidArgument, "decode: %d engine buffers, at most %d", len(e.Buffers), maxEngineBuffers)
	case sum != d.slotB:
		return errdefs.Errorf(errdefs.InvalidArgument, "decode: the engine buffers' pages add up to %d bytes, and a page is %d (shard bytes × shards)", sum, d.slotB)
	case d.cfg.Check != nil || d.cfg.Checksums:
		return errdefs.Errorf(errdefs.FailedPrecondition, "decode: content checks and checksums read a page as one range; with the engine's pages split across %d buffers there is none", len(e.Buffers))
	}
	return nil
}

// registerBuffers registers every engine buffer (a region each); without
// the fence, one key covers each.
func (d *Decode) registerBuffers(ctx context.Context) error {
	e := d.cfg.Engine
	for i, b := range e.Buffers {
		region, err := d.tr.RegisterMemory(ctx, b.Desc)
		if err != nil {
			return fmt.Errorf("decode: register engine buffer %d (direct mode): %w", i, err)
		}
		l := engineLayer{layout: layout{region: region, slotB: b.PageBytes, shardB: b.PageBytes / int64(d.cfg.Shards)}}
		if !d.fence {
			w := sdk.Window{Region: region, Length: uint64(int64(e.Pages) * b.PageBytes)}
			if l.key, err = d.granter.Grant(ctx, w); err != nil {
				return fmt.Errorf("decode: grant engine buffer %d's key: %w", i, err)
			}
		}
		d.layers = append(d.layers, l)
	}
	return nil
}

// engineLayer is one registered engine buffer and, without the fence, the
// key over all of it.
type engineLayer struct {
	layout
	key sdk.Key
}

// layouts are the regions a slot lives in: the pool or the one engine
// region, or every engine buffer in order.
func (d *Decode) layouts() []layout {
	if len(d.layers) == 0 {
		return []layout{{d.region, d.slotB, d.cfg.ShardBytes}}
	}
	out := make([]layout, len(d.layers))
	for i, l := range d.layers {
		out[i] = l.layout
	}
	return out
}

// poolRef is a page's key without the fence: the pool key at the slot, or
// one part per engine buffer, or the host landing pages' key
// (direct_host.go); keysFor adds the rank's shard.
func (d *Decode) poolRef(s uint32) keyRef {
	if d.isLanding(s) {
		return d.landingRef(s)
	}
	if len(d.layers) == 0 {
		return keyRef{Key: uint64(d.poolKey), Base: uint64(int64(s) * d.slotB)}
	}
	parts := make([]keyPart, len(d.layers))
	for i, l := range d.layers {
		parts[i] = keyPart{Key: uint64(l.key), Base: uint64(int64(s) * l.slotB), Len: uint64(l.shardB)}
	}
	return withParts(parts)
}

func withParts(parts []keyPart) keyRef {
	return keyRef{Key: parts[0].Key, Base: parts[0].Base, Parts: parts}
}

// shiftToShard moves a whole-page key to the rank at pos's shard: in each
// part by its buffer's share.
func (d *Decode) shiftToShard(k keyRef, pos int) keyRef {
	if len(k.Parts) == 0 {
		off, _ := d.shardRange(pos)
		k.Base += uint64(off)
		return k
	}
	parts := make([]keyPart, len(k.Parts))
	for i, p := range k.Parts {
		p.Base += uint64(int64(pos) * d.layers[i].shardB)
		parts[i] = p
	}
	return withParts(parts)
}

// pageWindows is the windows over the rank at pos's shards of slots (or,
// from pos 0 unshifted, every rank's) in every layout, and each page's
// window and base per layout, layout by layout — moved to the rank's shard
// where the windows are whole slots (shift). Engine pages come first, in
// each engine layout; host landing pages last, in theirs (joinLayers).
func (d *Decode) pageWindows(slots []uint32, pos int, shift bool) ([]sdk.Window, []pageKey) {
	var ws []sdk.Window
	var pages []pageKey
	add := func(lay layout, ss []uint32) {
		if len(ss) == 0 {
			return
		}
		w, p := d.rankWindowsIn(lay, ss, pos)
		for i := range p {
			p[i].win += len(ws)
			if shift {
				p[i].base += uint64(int64(pos) * lay.shardB)
			}
		}
		ws, pages = append(ws, w...), append(pages, p...)
	}
	kv, host := d.splitLanding(slots)
	for _, lay := range d.layouts() {
		add(lay, kv)
	}
	if d.landing != nil {
		add(d.landing.layout, host)
	}
	return ws, pages
}

// joinLayers turns the page keys pageWindows laid out (engine layout by
// layout, its engine pages each, then the host landing pages) into one
// key per page of slots, in order: an engine page's with a part per
// engine buffer (with one region, its one key), a landing page's whole.
func (d *Decode) joinLayers(refs []keyRef, slots []uint32) []keyRef {
	if len(d.layers) == 0 && d.landing == nil {
		return refs
	}
	kv, _ := d.splitLanding(slots)
	nl, n := max(1, len(d.layers)), len(kv)
	out := make([]keyRef, len(slots))
	k, h := 0, nl*n
	for i, s := range slots {
		switch {
		case d.isLanding(s):
			out[i], h = refs[h], h+1
			continue
		case len(d.layers) == 0:
			out[i] = refs[k]
		default:
			parts := make([]keyPart, len(d.layers))
			for l, lay := range d.layers {
				r := refs[l*n+k]
				parts[l] = keyPart{Key: r.Key, Base: r.Base, Len: uint64(lay.shardB)}
			}
			out[i] = withParts(parts)
		}
		k++
	}
	return out
}
