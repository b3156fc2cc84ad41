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

// Host copies host memory: runs of StreamMin bytes and more with
// non-temporal stores (amd64), shorter ones with Go's memmove.
//
// Why: a gather writes tens of MiB that no cache holds; memmove's ordinary
// stores first read every destination line (read for ownership), a third
// more memory traffic than the copy. Go's and libc's memmove stream only
// copies of about a MiB or more, so one plain copy of a request streamed
// while its 2-32 KiB runs did not. Streaming pays only while the sources
// arrive ahead of the stores (non-temporal stores take the line fill
// buffers that source cache misses need): Host asks for the first lines of
// the runs ahead. Scattered 2 KiB items streamed without that were slower
// than memmove (bench_test.go). The stores are fenced before Copy returns,
// so whoever takes the pages next (another thread, through a channel) sees
// every byte.
type Host struct{}

// useAVX2 and useAVX512 let the tests and the benchmark take the narrower
// paths where the CPU has the wider ones.
var useAVX2, useAVX512 = true, true

// StreamMin is the shortest run Host streams.
const StreamMin = 1 << 10

// streamPiece bounds one assembly call, so a long run still reaches a
// preemption point every few microseconds.
const streamPiece = 64 << 10

// prefetchAhead runs ahead of the one being copied, Host asks for the first
// prefetchBytes of the source: the hardware prefetcher follows a run once
// its first lines came, not before (whole runs asked for were slower: the
// prefetches took the fill buffers).
const prefetchAhead, prefetchBytes = 16, 128

// Copy implements Copier.
func (Host) Copy(runs []Run) error {
	hostCopy(runs, StreamMin, prefetchAhead, prefetchBytes)
	return nil
}

// CopySpan copies runs[from:to] as Copy does, prefetching from the runs
// after to as well: a long plan copied span by span (KVSender.FillRange's
// steps) keeps its sources asked for ahead across the spans' edges.
func (Host) CopySpan(runs []Run, from, to int) {
	hostCopySpan(runs, from, to, StreamMin, prefetchAhead, prefetchBytes)
}

// hostCopy copies runs, streaming those of at least least bytes (0: none)
// and prefetching pfBytes of the source of the run ahead runs on (0: none).
func hostCopy(runs []Run, least, ahead, pfBytes int) {
	hostCopySpan(runs, 0, len(runs), least, ahead, pfBytes)
}

// hostCopySpan is hostCopy of runs[from:to], prefetching up to runs' end.
func hostCopySpan(runs []Run, from, to, least, ahead, pfBytes int) {
	streamed := false
	for i := from; i < to; i++ {
		r := runs[i]
		if ahead > 0 && i+ahead < len(runs) {
			p := runs[i+ahead]
			prefetchRange(p.Src, uintptr(max(min(p.N, pfBytes), 0)))
		}
		if r.N <= 0 {
			continue
		}
		if least <= 0 || !haveStream || r.N < least {
			memmove(r.Dst, r.Src, r.N)
			continue
		}
		streamRun(r)
		streamed = true
	}
	if streamed {
		storeFence()
	}
}

func memmove(dst, src unsafe.Pointer, n int) {
	copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(src), n))
}

// streamRun copies r (N >= StreamMin): memmove up to dst's first 16-byte
// boundary (32 with AVX2), whole 64-byte blocks streamed, memmove of the
// rest. Offsets stay below N, so no pointer past the run's end is formed.
// AVX2's 32-byte stores took a buffer-by-buffer 64 MiB gather from 0.85 to
// 0.97 of a plain copy's CPU time (bench_test.go, one run at load ~7);
// AVX-512's 64-byte ones gained another 7-8% over AVX2 (page 1 scattered
// 1.02 -> 1.10, contiguous 1.15 -> 1.25, page 16 1.29 -> 1.34; load ~13),
// which the C ABI's page-1 scattered gather needed against glibc's
// memmove (docs/sglang.md).
func streamRun(r Run) {
	align, width := uintptr(15), 16
	switch {
	case haveAVX512 && useAVX512:
		align, width = 63, 64
	case haveAVX2 && useAVX2:
		align, width = 31, 32
	}
	head := int(-uintptr(r.Dst) & align)
	memmove(r.Dst, r.Src, head)
	off := head
	for body := (r.N - head) &^ 63; body > 0; {
		n := min(body, streamPiece)
		d, s := unsafe.Add(r.Dst, off), unsafe.Add(r.Src, off)
		switch width {
		case 64:
			streamCopyAVX512(d, s, uintptr(n))
		case 32:
			streamCopyAVX2(d, s, uintptr(n))
		default:
			streamCopy(d, s, uintptr(n))
		}
		off += n
		body -= n
	}
	if off < r.N {
		memmove(unsafe.Add(r.Dst, off), unsafe.Add(r.Src, off), r.N-off)
	}
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
