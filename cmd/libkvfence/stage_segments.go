package main

// #include "abi.h"
import "C"

import (
	"unsafe"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/internal/stage"
)

// Segment lists: a row of bytes (SGLang's hybrid-model state row: every
// state buffer's item at each of the request's state indices, with SWA/DSA
// headers and zero room) described as consecutive (address, length)
// segments, copied into a sender's source pages or out of a handed-off
// receiver's slots on the handle's staging goroutine, in order with its
// gathers, writes and scatters. The scheduler thread only hands the list
// over; the copy of the row (one Mamba slot, or an SWA window of many
// pages) runs on a Go thread.

// maxSegments bounds one list (16 bytes each copied at the call).
const maxSegments = 1 << 24

// segment is one (address, length) pair; a nil address is length zero
// bytes (gather) or bytes skipped (scatter).
type segment struct {
	p unsafe.Pointer
	n int64
}

// segmentList copies n segments from C: each length > 0, limit bytes at
// most in all.
func segmentList(addrs *unsafe.Pointer, lens *C.int64_t, n C.int, limit int64) ([]segment, error) {
	if n < 0 || n > maxSegments || (n > 0 && (addrs == nil || lens == nil)) {
		return nil, invalid("%d segments at %p, %p (0..%d, non-NULL arrays)", n, addrs, lens, maxSegments)
	}
	segs := make([]segment, n)
	if n > 0 {
		if err := touch("segment arrays", func() {
			ps, ls := unsafe.Slice(addrs, int(n)), unsafe.Slice((*int64)(unsafe.Pointer(lens)), int(n))
			for i := range segs {
				segs[i] = segment{ps[i], ls[i]}
			}
		}); err != nil {
			return nil, err
		}
	}
	var sum int64
	for i, s := range segs {
		if s.n <= 0 {
			return nil, invalid("segment %d is %d bytes (each must be > 0)", i, s.n)
		}
		if sum += s.n; sum > limit {
			return nil, invalid("segments of %d bytes or more do not fit %d bytes", sum, limit)
		}
	}
	return segs, nil
}

// kvfence_sender_gather_segments_queued queues the copy of n segments
// (segment i: lens[i] > 0 bytes at addrs[i]; a NULL address is that many
// zero bytes) as consecutive bytes into the sender's source pages [first,
// first+count), zero-padded to the end of the last page, after the
// sender's queued gathers and writes; kvfence_sender_gather_wait reports
// it, and the request is finished (Success on both sides) only by a later
// gather, after it. Only the lists are copied at the call: the memory they
// name must stay valid until the copy ran (SGLang frees a prefill request's
// state only once its poll is Success or Failed).
//
//export kvfence_sender_gather_segments_queued
func kvfence_sender_gather_segments_queued(s C.kvfence_handle, first, count C.int, addrs *unsafe.Pointer, lens *C.int64_t, n C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := senderRange(s, first, count)
	if err != nil {
		return fail(e, err)
	}
	segs, err := segmentList(addrs, lens, n, int64(count)*o.a.pageBytes)
	if err != nil {
		return fail(e, err)
	}
	queue(uint64(s), func() error {
		return o.s.FillRange(int(first), int(count), func(pages [][]byte, step func() error) error {
			return safeRun(func() error { return fillSegments(pages, segs, step) })
		})
	})
	return fail(e, nil)
}

// fillSegments writes segs, then zeros, across pages, calling step before
// each piece of at most agent.FillPiece bytes.
func fillSegments(pages [][]byte, segs []segment, step func() error) error {
	var runs []stage.Run
	pg, off, budget := 0, 0, 0
	put := func(src unsafe.Pointer, n int64) error {
		for n > 0 {
			if budget == 0 {
				if len(runs) > 0 {
					stage.Host{}.Copy(runs)
					runs = runs[:0]
				}
				if err := step(); err != nil {
					return err
				}
				budget = agent.FillPiece
			}
			if off == len(pages[pg]) {
				pg, off = pg+1, 0
			}
			dst := pages[pg][off:]
			k := int(min(n, int64(len(dst)), int64(budget)))
			if src == nil {
				clear(dst[:k])
			} else {
				runs = append(runs, stage.Run{Dst: unsafe.Pointer(&dst[0]), Src: src, N: k})
				src = unsafe.Add(src, k)
			}
			off, budget, n = off+k, budget-k, n-int64(k)
		}
		return nil
	}
	for _, sg := range segs {
		if err := put(sg.p, sg.n); err != nil {
			return err
		}
	}
	var rest int64
	for i := pg; i < len(pages); i++ {
		rest += int64(len(pages[i]))
	}
	if err := put(nil, rest-int64(off)); err != nil {
		return err
	}
	stage.Host{}.Copy(runs)
	return nil
}

// kvfence_receiver_scatter_segments queues the copy of the row that shard
// 0 (the first shard bytes) of the handed-off request's slots [first,
// first+count) hold, in order, into n segments (segment i: lens[i] > 0
// bytes to addrs[i]; a NULL address skips that many bytes of the row),
// after the receiver's queued scatters; kvfence_receiver_scatter_done
// reports it, and the receiver's finish and close wait for it. In direct
// mode the slots must be host landing pages. The segments' memory must
// stay the engine's until then.
//
//export kvfence_receiver_scatter_segments
func kvfence_receiver_scatter_segments(r C.kvfence_handle, first, count, shard C.int, addrs *unsafe.Pointer, lens *C.int64_t, n C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, pages, err := handedOff(r, first, count, "kvfence_receiver_scatter_segments")
	if err != nil {
		return fail(e, err)
	}
	if shard <= 0 || int64(shard) > o.a.pageBytes {
		return fail(e, invalid("shards of %d bytes (slots of %d)", shard, o.a.pageBytes))
	}
	segs, err := segmentList(addrs, lens, n, int64(count)*int64(shard))
	if err != nil {
		return fail(e, err)
	}
	rows := make([][]byte, count)
	for i := range rows {
		rows[i] = pages[int(first)+i][:shard]
	}
	queue(uint64(r), func() error {
		return safeRun(func() error {
			var runs []stage.Run
			pg, off := 0, 0
			for _, sg := range segs {
				dst, n := sg.p, sg.n
				for n > 0 {
					if off == len(rows[pg]) {
						pg, off = pg+1, 0
					}
					k := int(min(n, int64(len(rows[pg])-off)))
					if dst != nil {
						runs = append(runs, stage.Run{Dst: dst, Src: unsafe.Pointer(&rows[pg][off]), N: k})
						dst = unsafe.Add(dst, k)
					}
					off, n = off+k, n-int64(k)
				}
			}
			stage.Host{}.Copy(runs)
			return nil
		})
	})
	return fail(e, nil)
}
