package stage

import (
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

// Run is one contiguous copy of N bytes from Src to Dst.
type Run struct {
	Dst, Src unsafe.Pointer
	N        int
}

// Copier performs runs. Host copies host memory; a device copier (CUDA,
// later) takes the same runs for device buffers.
type Copier interface {
	Copy(runs []Run) error
}

// Host copies host memory with Go's memmove.
type Host struct{}

// Copy implements Copier.
func (Host) Copy(runs []Run) error {
	for _, r := range runs {
		if r.N <= 0 {
			continue
		}
		copy(unsafe.Slice((*byte)(r.Dst), r.N), unsafe.Slice((*byte)(r.Src), r.N))
	}
	return nil
}

// Buffer is one engine buffer: Len bytes at Addr, Item bytes per page index.
// Device marks device memory, for a device Copier.
type Buffer struct {
	Addr   unsafe.Pointer
	Len    int64
	Item   int64
	Device bool
}

// Layout is an engine's KV buffers and their page size in tokens.
type Layout struct {
	Bufs     []Buffer
	PageSize int
}

// NewLayout checks that every item is whole tokens and returns the layout.
func NewLayout(bufs []Buffer, pageSize int) (*Layout, error) {
	if len(bufs) == 0 || pageSize <= 0 {
		return nil, errdefs.Errorf(errdefs.InvalidArgument, "a layout has buffers (%d given) and a page size > 0 (%d)", len(bufs), pageSize)
	}
	for i, b := range bufs {
		if b.Addr == nil || b.Item <= 0 || b.Len < b.Item || b.Item%int64(pageSize) != 0 {
			return nil, errdefs.Errorf(errdefs.InvalidArgument, "buffer %d: addr %#x, %d bytes, item %d: not whole items of %d tokens", i, b.Addr, b.Len, b.Item, pageSize)
		}
	}
	return &Layout{Bufs: append([]Buffer(nil), bufs...), PageSize: pageSize}, nil
}

// Slice is the part of every token a side moves: part Part of Parts equal
// parts (heads split contiguously, as SGLang splits them). {0, 1} is whole.
type Slice struct{ Part, Parts int }

func (s Slice) check(l *Layout) error {
	if s.Parts <= 0 || s.Part < 0 || s.Part >= s.Parts {
		return errdefs.Errorf(errdefs.InvalidArgument, "part %d of %d", s.Part, s.Parts)
	}
	for i, b := range l.Bufs {
		if (b.Item/int64(l.PageSize))%int64(s.Parts) != 0 {
			return errdefs.Errorf(errdefs.InvalidArgument, "buffer %d: %d bytes per token do not split in %d parts", i, b.Item/int64(l.PageSize), s.Parts)
		}
	}
	return nil
}

// ShardBytes is the bytes one page of a Slice takes in kvfence's pages.
func (l *Layout) ShardBytes(s Slice) int64 {
	var n int64
	for _, b := range l.Bufs {
		n += b.Item / int64(s.Parts)
	}
	return n
}

// CheckIndices refuses a page index outside any buffer (one pass over the
// indices against the smallest buffer's page count).
func (l *Layout) CheckIndices(idx []int32) error {
	pages := l.Bufs[0].Len / l.Bufs[0].Item
	for _, b := range l.Bufs[1:] {
		pages = min(pages, b.Len/b.Item)
	}
	for _, i := range idx {
		if i < 0 || int64(i) >= pages {
			return errdefs.Errorf(errdefs.InvalidArgument, "page index %d outside the engine's buffers (%d pages)", i, pages)
		}
	}
	return nil
}

// appendRun adds r, merging it into the last run when both sides continue it.
func appendRun(runs []Run, r Run) []Run {
	if n := len(runs); n > 0 {
		last := &runs[n-1]
		if uintptr(last.Src)+uintptr(last.N) == uintptr(r.Src) && uintptr(last.Dst)+uintptr(last.N) == uintptr(r.Dst) {
			last.N += r.N
			return runs
		}
	}
	return append(runs, r)
}
