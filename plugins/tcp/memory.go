package tcp

import (
	"sync"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/sdk"
)

// region is registered memory: a shared mapping of host memory. The same
// region may be a source (sender) and hold exposures (receiver).
type region struct {
	id      sdk.RegionID
	mapping *sdk.Mapping
	mem     []byte

	mu    sync.Mutex
	users int                   // sender operations that will still read mem
	keys  map[sdk.Key]*exposure // receiver exposures inside mem
}

// mapRegion maps memory to register. The plugin moves bytes with the CPU,
// so it takes host-shared memory and, for direct mode, a dma-buf only
// where the CPU can map it (udmabuf, the fake CUDA driver's memfd): a real
// GPU's dma-buf usually cannot be mapped, and is refused FailedPrecondition
// with the reason (docs/gpu-direct.md). Nothing is kept on a refusal.
func mapRegion(desc sdk.MemoryDesc) (*sdk.Mapping, error) {
	switch desc.Kind {
	case sdk.MemoryHostShared:
		return sdk.MapMemory(desc)
	case sdk.MemoryDMABuf:
		return sdk.MapDMABuf(desc)
	}
	return nil, errdefs.Errorf(errdefs.Unimplemented, "RegisterMemory: %v memory is not supported by tcp", desc.Kind)
}

// inBounds reports whether [off, off+n) lies within a buffer of size, without
// overflow.
func inBounds(off, n, size uint64) bool {
	return n <= size && off <= size-n
}

// use pins the region while an unsent operation will read it; release unpins.
func (r *region) use()     { r.mu.Lock(); r.users++; r.mu.Unlock() }
func (r *region) release() { r.mu.Lock(); r.users--; r.mu.Unlock() }
