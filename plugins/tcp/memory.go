package tcp

import (
	"sync"

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

// inBounds reports whether [off, off+n) lies within a buffer of size, without
// overflow.
func inBounds(off, n, size uint64) bool {
	return n <= size && off <= size-n
}

// use pins the region while an unsent operation will read it; release unpins.
func (r *region) use()     { r.mu.Lock(); r.users++; r.mu.Unlock() }
func (r *region) release() { r.mu.Lock(); r.users--; r.mu.Unlock() }
