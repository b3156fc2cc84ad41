package core

import (
	"slices"

	"github.com/kvfence/kvfence/errdefs"
)

// SlotPool hands out decode KV slots. A slot that was handed out comes back
// only through a Receiver's release; nothing else can free it.
//
// It has two modes. A pool made by NewSlotPool picks the slots itself. One
// made by NewEnginePool (direct mode: the NIC writes into the engine's own
// pages) takes the slots the engine names — its page indices — and only
// keeps account: which pages are lent to an exposure, live or held, and how
// many, against a capacity. A page still lent is never lent again.
type SlotPool struct {
	free []uint32
	size int

	lent  []bool // engine-chosen mode only: page i is lent to an exposure (or quarantined)
	nLent int
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

// NewEnginePool makes an engine-chosen pool over engine pages
// 0..pages-1, of which at most capacity may be lent at once.
func NewEnginePool(pages, capacity int) *SlotPool {
	return &SlotPool{size: capacity, lent: make([]bool, pages)}
}

// EngineChosen reports whether the engine names the slots (NewEnginePool).
func (p *SlotPool) EngineChosen() bool { return p.lent != nil }

// Free is the number of slots that can be taken now.
func (p *SlotPool) Free() int {
	if p.lent != nil {
		return max(0, p.size-p.nLent)
	}
	return len(p.free)
}

// Size is the number of slots the pool was made with (the capacity of an
// engine-chosen pool).
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

// takeAll takes every slot that is free: the restart quarantine. In an
// engine-chosen pool that is every page not lent, whatever the capacity.
func (p *SlotPool) takeAll() []uint32 {
	if p.lent == nil {
		return p.take(nil, p.Free())
	}
	var dst []uint32
	for i, l := range p.lent {
		if !l {
			dst = append(dst, uint32(i))
		}
	}
	for _, s := range dst {
		p.lent[s] = true
	}
	p.nLent += len(dst)
	return dst
}

// takeAt lends the engine pages idx, all or none: nil when it did. A page
// out of range or named twice is InvalidArgument; a page still lent is
// FailedPrecondition (owner names who holds it, for the message); more
// than the capacity is ResourceExhausted.
func (p *SlotPool) takeAt(idx []uint32, owner func(page uint32) string) error {
	for i, s := range idx {
		var err error
		switch {
		case int(s) >= len(p.lent):
			err = errorf(errdefs.InvalidArgument, "engine page %d out of range: the engine registered %d pages", s, len(p.lent))
		case p.lent[s] && slices.Contains(idx[:i], s):
			err = errorf(errdefs.InvalidArgument, "engine page %d named twice", s)
		case p.lent[s]:
			err = errorf(errdefs.FailedPrecondition,
				"engine page %d is still lent to %s: it may be written until drained, fenced or timed out; wait until its pages are free", s, owner(s))
		}
		if err == nil && p.nLent+i+1 > p.size {
			err = errorf(errdefs.ResourceExhausted, "%d engine pages asked for, %d of %d may be lent now (holds count)", len(idx), p.Free(), p.size)
		}
		if err != nil {
			for _, t := range idx[:i] {
				p.lent[t] = false
			}
			return err
		}
		p.lent[s] = true
	}
	p.nLent += len(idx)
	return nil
}

func (p *SlotPool) give(slots []uint32) {
	if p.lent != nil {
		for _, s := range slots {
			p.lent[s] = false
		}
		p.nLent -= len(slots)
		return
	}
	for i := len(slots) - 1; i >= 0; i-- {
		p.free = append(p.free, slots[i])
	}
}
