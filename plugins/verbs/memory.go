package verbs

// This file: registered memory. A region is shared host memory
// (sdk.MapMemory) or a dma-buf, registered once for local access: the
// source of writes and the target of reads.

import (
	"context"
	"os"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

type region struct {
	desc    sdk.MemoryDesc
	mapping *sdk.Mapping // host memory
	dmabuf  *os.File     // dma-buf memory
	base    uintptr      // host memory: address of the region's first byte
	mr      *mr          // local access (source of writes, target of reads)
	inUse   int          // operations of pending batches that use it locally
	grants  map[sdk.Key]bool
}

func (t *Transport) RegisterMemory(ctx context.Context, desc sdk.MemoryDesc) (sdk.RegionID, error) {
	if desc.Size == 0 || desc.Size > 1<<40 {
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "verbs: region size %d", desc.Size)
	}
	r := &region{desc: desc, grants: map[sdk.Key]bool{}}
	var err error
	switch desc.Kind {
	case sdk.MemoryHostShared:
		if r.mapping, err = sdk.MapMemory(desc); err != nil {
			return 0, err
		}
		r.base = uintptr(unsafe.Pointer(unsafe.SliceData(r.mapping.Bytes())))
		r.mr, err = t.d.regMR(r.base, desc.Size, uint64(r.base), accLocalWrite)
	case sdk.MemoryDMABuf:
		if r.dmabuf, err = sdk.ImportDMABuf(desc); err != nil { // SCM_RIGHTS (sdk/fdpass.go); held until release
			return 0, err
		}
		// iova = the offset into the dma-buf: SGEs address the buffer by offset.
		r.mr, err = t.d.regDMABuf(int(r.dmabuf.Fd()), desc.Offset, desc.Size, desc.Offset, accLocalWrite)
	default:
		return 0, errdefs.Errorf(errdefs.InvalidArgument, "verbs: memory kind %v", desc.Kind)
	}
	if err != nil {
		r.release()
		return 0, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		r.release()
		return 0, errdefs.Errorf(errdefs.Unavailable, "verbs: closed")
	}
	t.nextReg++
	t.regions[t.nextReg] = r
	return t.nextReg, nil
}

// localAddr is the SGE address of byte off of the region.
func (r *region) localAddr(off uint64) uint64 {
	if r.dmabuf != nil {
		return r.desc.Offset + off
	}
	return uint64(r.base) + off
}

func (r *region) release() {
	if r.mr != nil {
		_ = r.mr.dereg()
		r.mr = nil
	}
	if r.mapping != nil {
		_ = r.mapping.Close()
	}
	if r.dmabuf != nil {
		_ = r.dmabuf.Close()
	}
}

func (t *Transport) DeregisterMemory(ctx context.Context, id sdk.RegionID) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.regions[id]
	if !ok {
		return errdefs.Errorf(errdefs.NotFound, "verbs: region %d", id)
	}
	if r.inUse > 0 {
		return errdefs.Errorf(errdefs.FailedPrecondition, "verbs: region %d is used by %d pending operations", id, r.inUse)
	}
	for k := range r.grants {
		if err := t.revokeLocked(k); err != nil {
			return err
		}
	}
	delete(t.regions, id)
	r.release()
	return nil
}
