package core

// SlotPool hands out decode KV slots. A slot that was handed out comes back
// only through a Receiver's release; nothing else can free it.
type SlotPool struct {
	free []uint32
	size int
}

// NewSlotPool makes a pool of slots 0..n-1.
func NewSlotPool(n int) *SlotPool {
	p := &SlotPool{free: make([]uint32, n), size: n}
	for i := range p.free {
		// Hand out low slots first; freed slots go on top, so a freed slot
		// is reused at once — the worst case for late writes, on purpose.
		p.free[i] = uint32(n - 1 - i)
	}
	return p
}

// Free is the number of slots that can be taken now.
func (p *SlotPool) Free() int { return len(p.free) }

// Size is the number of slots the pool was made with.
func (p *SlotPool) Size() int { return p.size }

func (p *SlotPool) take(dst []uint32, n int) []uint32 {
	k := len(p.free) - n
	dst = append(dst, p.free[k:]...)
	// Take in ascending order for readable traces.
	for i, j := len(dst)-n, len(dst)-1; i < j; i, j = i+1, j-1 {
		dst[i], dst[j] = dst[j], dst[i]
	}
	p.free = p.free[:k]
	return dst
}

func (p *SlotPool) give(slots []uint32) {
	for i := len(slots) - 1; i >= 0; i-- {
		p.free = append(p.free, slots[i])
	}
}
