package gpumem

// This file: direct mode (opt-in): the engine's GPU buffers exported as
// dma-bufs, handed to the plugin process over SCM_RIGHTS (sdk.ShareDMABuf)
// and registered with it, so that the NIC writes straight into the
// engine's pages, addressed by the engine's page index; and the hold that
// then moves into the engine (DirectReceiver): an engine page lent to a
// request's exposure goes back to the engine only when the agent let the
// exposure go (drained, fenced or timed out), never at abort.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// DirectBuffer is one engine KV buffer exported as a dma-buf and offered
// to plugin processes: engine page p is PageBytes at PageOffset(p) within
// the region Desc describes.
type DirectBuffer struct {
	buf   Buffer
	pages int
	share *sdk.FDShare
}

// ExportBuffer exports pages engine pages of b (cuMemGetHandleForAddressRange)
// and offers the dma-buf over SCM_RIGHTS. The real driver wants the range
// aligned to the host page size; a driver or GPU without dma-buf export is
// FailedPrecondition (use staged mode).
func (d *Device) ExportBuffer(b Buffer, pages int) (*DirectBuffer, error) {
	size := int64(pages) * b.PageBytes
	host := uintptr(os.Getpagesize())
	switch {
	case b.Base == 0 || b.PageBytes <= 0 || pages <= 0:
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "direct mode: buffer %#x with %d pages of %d bytes", b.Base, pages, b.PageBytes)
	case b.Base%host != 0 || uintptr(size)%host != 0:
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "direct mode: buffer [%#x,+%d) is not aligned to the host page size %d (cuMemGetHandleForAddressRange needs it)", b.Base, size, host)
	case !d.IsDevice(b.Base):
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "direct mode: %#x is not device memory of %s", b.Base, d.Library())
	}
	fd, off, err := d.drv.exportDMABuf(b.Base, size)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd) // the share holds its own duplicate
	share, err := sdk.ShareDMABuf(fd, off, uint64(size), d.DeviceID())
	if err != nil {
		return nil, err
	}
	return &DirectBuffer{buf: b, pages: pages, share: share}, nil
}

// DeviceID names the GPU for a MemoryDesc and for topology: its PCI bus id
// (cuDeviceGetPCIBusId), else "cuda:<ordinal>" where the driver cannot say.
func (d *Device) DeviceID() string {
	if id := d.drv.pciBusID(d.opts.Ordinal); id != "" {
		return id
	}
	return fmt.Sprintf("cuda:%d", d.opts.Ordinal)
}

// Desc is what the plugin's RegisterMemory takes.
func (x *DirectBuffer) Desc() sdk.MemoryDesc { return x.share.Desc() }

// PageOffset is where engine page p starts within the registered region:
// writes are addressed by the engine's page index.
func (x *DirectBuffer) PageOffset(p int) (uint64, error) {
	if p < 0 || p >= x.pages {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "direct mode: engine page %d of %d", p, x.pages)
	}
	return uint64(int64(p) * x.buf.PageBytes), nil
}

// EngineMemory is what decode's agent runs on in direct mode
// (agent.DecodeConfig.Engine): this buffer's pages, one slot each — its
// PageBytes must be the agent's shard bytes × shards. It has no host view.
func (x *DirectBuffer) EngineMemory() *agent.EngineMemory {
	return &agent.EngineMemory{Desc: x.Desc(), Pages: x.pages}
}

// EngineBuffers is what decode's agent runs on in direct mode when the
// engine keeps one KV buffer per layer (K and V, or one MLA buffer), as
// SGLang and vLLM do: engine page p is split across bufs, in order, at
// PageOffset(p) in each; their PageBytes add up to the agent's shard bytes
// × shards. Every buffer must hold the same number of pages.
func EngineBuffers(bufs []*DirectBuffer) (*agent.EngineMemory, error) {
	if len(bufs) == 0 {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "direct mode: no engine buffers")
	}
	mem := &agent.EngineMemory{Pages: bufs[0].pages}
	for i, x := range bufs {
		if x.pages != mem.Pages {
			return nil, errdefs.Errorf(errdefs.InvalidArgument, "direct mode: engine buffer %d holds %d pages, buffer 0 holds %d: a page index names the same page in every buffer", i, x.pages, mem.Pages)
		}
		mem.Buffers = append(mem.Buffers, agent.EngineBuffer{Desc: x.Desc(), PageBytes: x.buf.PageBytes})
	}
	return mem, nil
}

// Close stops offering the buffer. A plugin that registered it keeps its
// own reference until it deregisters: deregister first, then free the GPU
// memory (the NIC may write until the plugin deregistered).
func (x *DirectBuffer) Close() error { return x.share.Close() }

// CheckDirect refuses direct mode on a transport that does not declare the
// dmabuf memory kind (TCP reference plugin, Mooncake, NIXL and MORI today:
// their plugin processes cannot import VRAM), at start-up, with the reason.
func CheckDirect(info sdk.Info) error {
	if slices.Contains(info.Capabilities.MemoryKinds, sdk.MemoryDMABuf) {
		return nil
	}
	return errdefs.Errorf(errdefs.FailedPrecondition,
		"direct mode: transport %q declares memory kinds %v, not dmabuf: it cannot write into GPU memory; use staged mode (the default)",
		info.Name, info.Capabilities.MemoryKinds)
}

// RegisterDirect checks the transport (CheckDirect) and registers every
// buffer with it, in order; on a failure the regions already registered
// are deregistered and nothing is left behind.
func RegisterDirect(ctx context.Context, tr sdk.Transport, bufs []*DirectBuffer) ([]sdk.RegionID, error) {
	info, err := tr.Info(ctx)
	if err != nil {
		return nil, err
	}
	if err := CheckDirect(info); err != nil {
		return nil, err
	}
	var ids []sdk.RegionID
	for i, x := range bufs {
		id, err := tr.RegisterMemory(ctx, x.Desc())
		if err != nil {
			for _, done := range ids {
				_ = tr.DeregisterMemory(ctx, done)
			}
			return nil, fmt.Errorf("direct mode: register buffer %d: %w", i, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// DirectReceiver is decode's hold in direct mode, in front of an agent
// KVReceiver: the engine pages lent to the request's exposure are where
// the NIC writes, so they go back to the engine (PagesFree) only once the
// agent released the exposure — after it drained, was fenced, or timed
// out — exactly the rule the agent's own slots follow. Abort never gives
// them back by itself.
type DirectReceiver struct {
	rv  *agent.KVReceiver
	mu  sync.Mutex
	idx []int
	// aborted: Abort was called (the known-unsafe control arm frees here).
	aborted bool
}

// NewDirectReceiver holds engine pages for rv's exposure.
func NewDirectReceiver(rv *agent.KVReceiver) *DirectReceiver { return &DirectReceiver{rv: rv} }

// Init lends the engine pages idx to the request and exposes them to
// ranks: their writes land in those pages (agent KVReceiver.InitAt; the
// decode agent runs on the engine's memory, DecodeConfig.Engine). A page
// still lent to an exposure that was not released is refused
// (FailedPrecondition): wait for the earlier request's PagesFree.
func (r *DirectReceiver) Init(idx []int, ranks []core.RankID) (core.Tag, error) {
	tag, err := r.rv.InitAt(idx, ranks)
	if err == nil {
		r.mu.Lock()
		r.idx = append([]int(nil), idx...)
		r.mu.Unlock()
	}
	return tag, err
}

// Pages are the engine pages lent to the request.
func (r *DirectReceiver) Pages() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idx
}

// Poll is the agent receiver's state: in direct mode the bytes are already
// in the engine's pages when it says Success.
func (r *DirectReceiver) Poll() agent.PollState { return r.rv.Poll() }

// Err is why the request failed.
func (r *DirectReceiver) Err() error { return r.rv.Err() }

// Abort stops the request; its engine pages stay held until PagesFree.
// An abort that lost the race with success (the request was handed off:
// every write landed) lets the exposure go at once, as Finish does;
// otherwise the agent ends the hold when it is safe.
func (r *DirectReceiver) Abort() {
	r.mu.Lock()
	r.aborted = true
	r.mu.Unlock()
	r.rv.Abort()
	if r.rv.Poll() == agent.PollSuccess { // Abort ran in the agent's loop: no later success
		r.rv.Finish()
	}
}

// Finish ends a successful request: the engine keeps using its pages (they
// hold the KV), and the agent lets the exposure go.
func (r *DirectReceiver) Finish() { r.rv.Finish() }

// PagesFree reports whether the engine may reuse the request's pages for
// another request: no exposure of them is open any more, so no write of
// this request can reach them. Before Init nothing was lent.
func (r *DirectReceiver) PagesFree() bool {
	r.mu.Lock()
	lent, aborted := r.idx != nil, r.aborted
	r.mu.Unlock()
	return !lent || r.rv.Released() || (freesAtAbort && aborted)
}
