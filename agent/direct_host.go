package agent

// This file: host landing pages in direct mode (EngineMemory.HostPages).
// A request's pages past its KV pages — SGLang's aux row (metadata
// buffers) and state rows (Mamba) — have no engine page to land in: the
// engine's allocator owns every KV page. Engine indices Pages ..
// Pages+HostPages-1 therefore name pages of host memory this agent maps
// and registers like its staged pool (one slot each, rank pos's shard at
// pos × ShardBytes, as in staged mode), lent, held and released by the
// same core account as the engine's pages: a held landing page is never
// lent again until the core released it, so it has one writer at a time.
// The engine reads them (KVReceiver.Pages) after Success and copies the
// rows into its own buffers.

import (
	"context"
	"fmt"
	"time"

	"github.com/kvfence/kvfence/sdk"
)

// landing is the registered host landing pages and, without the fence,
// the key over all of them.
type landing struct {
	layout
	mem *sdk.SharedMemory
	key sdk.Key
}

// mapLanding maps and registers the host landing pages (direct mode with
// HostPages); without the fence one key covers them all.
func (d *Decode) mapLanding(ctx context.Context) error {
	n := d.cfg.Engine.HostPages
	if n == 0 {
		return nil
	}
	size := uint64(int64(n) * d.slotB)
	mem, err := sdk.NewSharedMemory(fmt.Sprintf("decode-%d-landing", d.cfg.Rank), size)
	if err != nil {
		return err
	}
	l := &landing{mem: mem, layout: layout{slotB: d.slotB, shardB: d.cfg.ShardBytes}}
	if l.region, err = d.tr.RegisterMemory(ctx, mem.Desc()); err != nil {
		mem.Close()
		return fmt.Errorf("decode: register the host landing pages (direct mode): %w", err)
	}
	if !d.fence {
		if l.key, err = d.granter.Grant(ctx, sdk.Window{Region: l.region, Length: size}); err != nil {
			mem.Close()
			return fmt.Errorf("decode: grant the host landing pages' key: %w", err)
		}
	}
	d.landing = l
	return nil
}

// releaseLanding deregisters and unmaps the host landing pages once no
// write can land in them any more: when the core lends none of the
// exposures' pages for writing (none assigned, held or quarantined — what
// was lent has drained, been fenced or timed out, as for a page lent
// again), or after the transport they were registered with is closed
// (transportClosed: nothing of it can write, and the region went with it).
// Otherwise they stay mapped: a late write lands in them, never in memory
// the process reused. Close only (the loop has stopped); false when they
// stay mapped.
func (d *Decode) releaseLanding(transportClosed bool) bool {
	l := d.landing
	if l == nil || l.mem.Bytes() == nil {
		return true
	}
	if !transportClosed {
		m := d.core.Metrics()
		if n := m.AssignedSlots + m.HeldSlots + m.QuarantinedSlots; n != 0 {
			d.log.Warn("host landing pages kept mapped at close: exposures could still write them; ReleaseHostPages after the transport is closed",
				"lent_for_writing", n)
			return false
		}
		// No write can land: the keys go with the region (DeregisterMemory
		// revokes them first), so the plugin lets go of its mapping too.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := d.tr.DeregisterMemory(ctx, l.region); err != nil {
			d.log.Warn("deregister the host landing pages", "error", err)
		}
		cancel()
	}
	if err := l.mem.Close(); err != nil {
		d.log.Warn("unmap the host landing pages", "error", err)
	}
	return true
}

// ReleaseHostPages unmaps the host landing pages (EngineMemory.HostPages)
// that Close kept because an exposure could still write them. Call it
// after Close, once the transport this Decode ran on is closed (its
// plugin process gone): then nothing can write them. Without landing
// pages, or once released, it does nothing. KVReceiver.Pages' landing
// pages are invalid afterwards.
func (d *Decode) ReleaseHostPages() {
	if !d.lp.stopped() {
		d.log.Error("ReleaseHostPages before Close: ignored (the agent could still lend them)")
		return
	}
	d.releaseLanding(true)
}

// isLanding: engine index s names a host landing page.
func (d *Decode) isLanding(s uint32) bool {
	return d.landing != nil && int64(s) >= int64(d.cfg.Engine.Pages)
}

// splitLanding is slots' engine pages and, renumbered from 0, its host
// landing pages, each in the request's order.
func (d *Decode) splitLanding(slots []uint32) (kv, host []uint32) {
	if d.landing == nil {
		return slots, nil
	}
	for _, s := range slots {
		if d.isLanding(s) {
			host = append(host, s-uint32(d.cfg.Engine.Pages))
		} else {
			kv = append(kv, s)
		}
	}
	return kv, host
}

// landingRef is a host landing page's key without the fence: one range
// in the host region (keysFor moves it to the rank's shard).
func (d *Decode) landingRef(s uint32) keyRef {
	h := int64(s) - int64(d.cfg.Engine.Pages)
	return keyRef{Key: uint64(d.landing.key), Base: uint64(h * d.slotB)}
}

// slotMem is slot s's bytes as the host sees them: the pool's slot, a
// host landing page, or the engine page in the engine memory's View; nil
// where the host cannot see it (an engine page in GPU memory).
func (d *Decode) slotMem(s uint32) []byte {
	mem, off := d.memBytes(), int64(s)*d.slotB
	if d.isLanding(s) {
		mem, off = d.landing.mem.Bytes(), (int64(s)-int64(d.cfg.Engine.Pages))*d.slotB
	}
	if int64(len(mem)) < off+d.slotB {
		return nil
	}
	return mem[off : off+d.slotB : off+d.slotB]
}
