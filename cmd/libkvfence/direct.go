package main

// #include "abi.h"
import "C"

import (
	"unsafe"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/gpumem"
)

// Direct mode on decode (docs/gpu-direct.md): the engine's KV buffer, one
// device buffer whose page p is one slot (page_bytes = shard_bytes ×
// shards), is exported as a dma-buf at open and registered by the plugin
// in place of the pool; kvfence_receiver_init_at names the engine pages a
// request lands in. The engine may reuse a page only once
// kvfence_receiver_released says 1.

// directEngine exports the config's direct_buffer for decode's agent (nil
// in staged mode). The export stays with a until it closes.
func (j decodeJSON) directEngine(a *agentObj) (*agent.EngineMemory, error) {
	if j.GPUMode != "direct" {
		if j.DirectBuffer != 0 || j.DirectPages != 0 {
			return nil, invalid("config: direct_buffer and direct_pages need gpu_mode \"direct\"")
		}
		return nil, nil
	}
	if j.DirectBuffer == 0 || j.DirectPages <= 0 || j.DirectPages > maxPages {
		return nil, invalid("config: gpu_mode \"direct\" on decode needs direct_buffer (the engine's KV buffer, a device pointer) and direct_pages (1..%d), got %#x and %d",
			maxPages, j.DirectBuffer, j.DirectPages)
	}
	dev, err := gpumem.Shared()
	if err != nil {
		return nil, err
	}
	pageB := j.ShardBytes * int64(orInt(j.Shards, 1))
	if a.direct, err = dev.ExportBuffer(gpumem.Buffer{Base: uintptr(j.DirectBuffer), PageBytes: pageB}, j.DirectPages); err != nil {
		return nil, err
	}
	return a.direct.EngineMemory(), nil
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
	if a.direct == nil {
		return nil
	}
	return errdefs.Errorf(errdefs.FailedPrecondition, "%s: direct mode: the request's KV is already in the engine's own pages", call)
}
