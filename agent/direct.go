package agent

// This file: direct mode on decode (docs/gpu-direct.md). The engine's own
// KV memory — a GPU buffer exported as a dma-buf (gpumem.DirectBuffer) —
// is registered with the transport instead of a pool of the agent's, and
// a request's pages land at the engine's page indices (InitAt): engine
// page p is the slot p, at p × slot bytes in the registered region. The
// core keeps the account (core.ReceiverConfig.EnginePages): a page lent
// to an exposure, live or held, is refused until the core released it.

import (
	"context"
	"fmt"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// EngineMemory is the engine's KV memory in direct mode.
type EngineMemory struct {
	// Desc is what the transport registers (a dma-buf: MemoryDMABuf, or
	// host-shared memory the engine owns). Engine page p starts at
	// p × ShardBytes × Shards within it: one page is one slot.
	Desc sdk.MemoryDesc
	// Pages is how many engine pages Desc holds (the page indices InitAt
	// may name). DecodeConfig.Slots is then the most of them lent to
	// exposures at once, live or held.
	Pages int
	// View is the host's view of the same bytes, where there is one (a
	// test's fake driver, host memory); nil for GPU memory. ContentCheck
	// and Checksums read it, and refuse to start without it.
	View []byte
	// Buffers, when set, are the engine's KV buffers, one per layer (or
	// per layer's K and V), in place of Desc and View: engine page p is
	// split across them (direct_layers.go); their PageBytes add up to
	// ShardBytes × Shards.
	Buffers []EngineBuffer
	// HostPages, when set, are host landing pages past the engine's:
	// indices Pages..Pages+HostPages-1 name pages of host memory the agent
	// maps and registers (direct_host.go), for the rows a request carries
	// after its KV pages (SGLang's aux and state rows). The engine reads
	// them through KVReceiver.Pages after Success.
	HostPages int
}

// checkEngine refuses a direct-mode configuration that cannot keep its
// promise, before anything is registered.
func (d *Decode) checkEngine() error {
	e, cfg := d.cfg.Engine, d.cfg
	need := int64(e.Pages) * d.slotB
	split := len(e.Buffers) > 0
	switch {
	case cfg.Restart != nil:
		return errdefs.Errorf(errdefs.InvalidArgument, "decode: direct mode (Engine) and the restart fence cannot be combined: the fence restarts instances over the agent's own pool")
	case e.Pages <= 0 || e.HostPages < 0 || int64(e.Pages)+int64(e.HostPages) > 1<<31:
		return errdefs.Errorf(errdefs.InvalidArgument, "decode: direct mode needs 1..2^31 engine pages and host landing pages together, got %d and %d", e.Pages, e.HostPages)
	case split:
		return d.checkBuffers()
	case e.Desc.Size < uint64(need):
		return errdefs.Errorf(errdefs.InvalidArgument, "decode: engine memory of %d bytes cannot hold %d pages of %d bytes (shard bytes × shards)", e.Desc.Size, e.Pages, d.slotB)
	case (cfg.Check != nil || cfg.Checksums) && int64(len(e.View)) < need:
		return errdefs.Errorf(errdefs.FailedPrecondition, "decode: content checks and checksums read the pages, and direct mode's engine memory has no host view of %d bytes", need)
	}
	return nil
}

// registerEngine registers the engine's memory in place of the pool;
// without the fence, one key covers all of it.
func (d *Decode) registerEngine(ctx context.Context) error {
	if err := d.checkEngine(); err != nil {
		return err
	}
	if err := d.mapLanding(ctx); err != nil {
		return err
	}
	if len(d.cfg.Engine.Buffers) > 0 {
		return d.registerBuffers(ctx)
	}
	var err error
	if d.region, err = d.tr.RegisterMemory(ctx, d.cfg.Engine.Desc); err != nil {
		return fmt.Errorf("decode: register the engine's memory (direct mode): %w", err)
	}
	if !d.fence {
		size := uint64(int64(d.cfg.Engine.Pages) * d.slotB)
		if d.poolKey, err = d.granter.Grant(ctx, sdk.Window{Region: d.region, Length: size}); err != nil {
			return fmt.Errorf("decode: grant the engine memory's key: %w", err)
		}
	}
	return nil
}

// enginePages is the core's EnginePages: zero unless in direct mode.
func (cfg DecodeConfig) enginePages() int {
	if cfg.Engine == nil {
		return 0
	}
	return cfg.Engine.Pages + cfg.Engine.HostPages
}

// memBytes is the host's view of the slots: the pool, or in direct mode
// the engine memory's View (nil where there is none).
func (d *Decode) memBytes() []byte {
	if d.mem == nil {
		if d.cfg.Engine != nil {
			return d.cfg.Engine.View
		}
		return nil
	}
	return d.mem.Bytes()
}

// InitAt is Init in direct mode: the request's pages land at the engine's
// page indices idx, in order. A page still lent to another request's
// exposure (not yet drained, fenced or timed out) is refused with
// errdefs.FailedPrecondition and nothing is exposed; out of range or
// repeated, InvalidArgument; beyond the capacity (Slots; holds count),
// ResourceExhausted. Without DecodeConfig.Engine it is FailedPrecondition.
func (r *KVReceiver) InitAt(idx []int, ranks []core.RankID) (core.Tag, error) {
	slots := make([]uint32, len(idx))
	for i, p := range idx {
		if p < 0 || int64(p) > 1<<31 {
			return core.Tag{}, errdefs.Errorf(errdefs.InvalidArgument, "request %d/%d: engine page index %d", r.key.Room, r.key.Gen, p)
		}
		slots[i] = uint32(p)
	}
	var err error
	if !r.d.lp.call(func() { r.tag, err = r.d.admit(r.key, len(idx), slots, ranks, r) }) {
		return core.Tag{}, errClosed
	}
	return r.tag, err
}
