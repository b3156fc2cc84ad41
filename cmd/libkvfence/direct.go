package main

// #include "abi.h"
import "C"

import (
	"slices"
	"unsafe"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/gpumem"
)

// Direct mode on decode (docs/gpu-direct.md): the engine's KV buffers are
// exported as dma-bufs at open and registered by the plugin in place of
// the pool — one buffer whose page p is one slot (direct_buffer; page =
// shard_bytes × shards), or one buffer per layer (direct_buffers, as SGLang
// and vLLM keep their KV), a page split across them at p ×
// direct_page_bytes[b] in buffer b; kvfence_receiver_init_at names the
// engine pages a request lands in. The engine may reuse a page only once
// kvfence_receiver_released says 1. direct_host_pages adds host landing
// pages at indices direct_pages.. (the agent maps them): a request's aux
// and state rows land there, and kvfence_receiver_read copies them out
// after SUCCESS, under the same hold as the engine's pages.

// directEngine exports the config's engine buffers for decode's agent (nil
// in staged mode). The exports stay with a until it closes.
func (j decodeJSON) directEngine(a *agentObj) (*agent.EngineMemory, error) {
	if j.GPUMode != "direct" {
		if j.DirectBuffer != 0 || j.DirectPages != 0 || j.DirectBuffers != nil || j.DirectPageBytes != nil || j.DirectHostPages != 0 {
			return nil, invalid("config: direct_buffer(s), direct_page_bytes, direct_pages and direct_host_pages need gpu_mode \"direct\"")
		}
		return nil, nil
	}
	bufs, err := j.directLayout()
	if err != nil {
		return nil, err
	}
	if j.DirectHostPages < 0 || j.DirectHostPages > maxPages-j.DirectPages {
		return nil, invalid("config: direct_host_pages must be 0..%d (with direct_pages %d), got %d", maxPages-j.DirectPages, j.DirectPages, j.DirectHostPages)
	}
	dev, err := gpumem.Shared()
	if err != nil {
		return nil, err
	}
	for _, b := range bufs {
		x, err := dev.ExportBuffer(b, j.DirectPages)
		if err != nil {
			return nil, err // a.close closes those already exported
		}
		a.direct = append(a.direct, x)
	}
	mem := a.direct[0].EngineMemory()
	if len(a.direct) > 1 || j.DirectBuffers != nil {
		if mem, err = gpumem.EngineBuffers(a.direct); err != nil {
			return nil, err
		}
	}
	mem.HostPages = j.DirectHostPages
	return mem, nil
}

// maxDirectBuffers bounds direct_buffers (a 128-layer model with K and V
// is 256; the agent refuses more than 4096).
const maxDirectBuffers = 4096

// directLayout is the engine buffers the config names: direct_buffer (one
// page per slot), or direct_buffers with direct_page_bytes (default: the
// page split evenly), which must add up to shard_bytes × shards.
func (j decodeJSON) directLayout() ([]gpumem.Buffer, error) {
	pageB := j.ShardBytes * int64(orInt(j.Shards, 1))
	switch {
	case j.DirectBuffers == nil && j.DirectBuffer == 0:
		return nil, invalid("config: gpu_mode \"direct\" on decode needs direct_buffer (the engine's KV buffer, a device pointer) or direct_buffers (one per layer), and direct_pages; got neither buffer")
	case j.DirectPages <= 0 || j.DirectPages > maxPages:
		return nil, invalid("config: gpu_mode \"direct\" on decode needs direct_pages (1..%d), got %d", maxPages, j.DirectPages)
	case j.DirectBuffers == nil && j.DirectPageBytes != nil:
		return nil, invalid("config: direct_page_bytes goes with direct_buffers")
	case j.DirectBuffers == nil:
		return []gpumem.Buffer{{Base: uintptr(j.DirectBuffer), PageBytes: pageB}}, nil
	case j.DirectBuffer != 0:
		return nil, invalid("config: direct_buffer and direct_buffers both set: name the engine's buffers once")
	case len(j.DirectBuffers) == 0 || len(j.DirectBuffers) > maxDirectBuffers:
		return nil, invalid("config: direct_buffers: 1..%d buffers, got %d", maxDirectBuffers, len(j.DirectBuffers))
	}
	sizes := j.DirectPageBytes
	if sizes == nil {
		n := int64(len(j.DirectBuffers))
		if pageB%n != 0 {
			return nil, invalid("config: a page of %d bytes does not split evenly across %d direct_buffers: give direct_page_bytes", pageB, n)
		}
		sizes = slices.Repeat([]int64{pageB / n}, int(n))
	}
	if len(sizes) != len(j.DirectBuffers) {
		return nil, invalid("config: %d direct_page_bytes for %d direct_buffers", len(sizes), len(j.DirectBuffers))
	}
	var sum int64
	out := make([]gpumem.Buffer, len(sizes))
	for i, pb := range sizes {
		if pb <= 0 || pb > pageB {
			return nil, invalid("config: direct_page_bytes[%d] = %d, want 1..%d", i, pb, pageB)
		}
		sum += pb
		out[i] = gpumem.Buffer{Base: uintptr(j.DirectBuffers[i]), PageBytes: pb}
	}
	if sum != pageB {
		return nil, invalid("config: direct_page_bytes add up to %d, and a page is %d bytes (shard_bytes × shards)", sum, pageB)
	}
	return out, nil
}

// kvfence_receiver_init_at is kvfence_receiver_init in direct mode: the
// request's n pages land in the engine's pages idx (in order) of the
// decode rank's direct_buffer. FAILED_PRECONDITION: a page is still lent
// to an earlier request whose writes may still land (wait until its
// kvfence_receiver_released is 1), or the rank is not in direct mode;
// RESOURCE_EXHAUSTED: more pages lent than slots (holds count), retry.
//
//export kvfence_receiver_init_at
func kvfence_receiver_init_at(r C.kvfence_handle, idx *C.int32_t, n C.int, ranks *C.uint32_t, nranks C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*receiverObj](uint64(r), "receiver")
	if err == nil {
		err = pageCount("pages", n, true)
	}
	if err == nil && idx == nil {
		err = invalid("NULL page indices")
	}
	var xs []uint32
	if err == nil {
		xs, err = ranksAt(ranks, nranks, o.a.shards)
	}
	pages := make([]int32, max(0, int(n)))
	if err == nil {
		err = touch("page indices", func() { copy(pages, unsafe.Slice((*int32)(unsafe.Pointer(idx)), int(n))) })
	}
	if err != nil {
		return fail(e, err)
	}
	ps := make([]int, len(pages))
	for i, p := range pages {
		ps[i] = int(p)
	}
	rs := make([]core.RankID, len(xs))
	for i, x := range xs {
		rs[i] = core.RankID(x)
	}
	_, err = o.rv.InitAt(ps, rs)
	return fail(e, err)
}

// notDirect refuses a call that reads the agent's pool on a direct-mode
// rank: its KV is already in the engine's own pages.
func notDirect(a *agentObj, call string) error {
	if len(a.direct) == 0 {
		return nil
	}
	return errdefs.Errorf(errdefs.FailedPrecondition, "%s: direct mode: the request's KV is already in the engine's own pages", call)
}

// landingOnly refuses, on a direct-mode rank, a read of pages that are not
// all host landing pages (the agent's Pages has no bytes for an engine
// page): the KV is already in the engine's own pages; only the rows past
// it (direct_host_pages) are read out.
func landingOnly(a *agentObj, call string, pages [][]byte, first int) error {
	if len(a.direct) == 0 {
		return nil
	}
	for i, p := range pages {
		if p == nil {
			return errdefs.Errorf(errdefs.FailedPrecondition, "%s: direct mode: page %d of the request is an engine page: its KV is already in the engine's own pages (only host landing pages, direct_host_pages, are read)", call, first+i)
		}
	}
	return nil
}
