package main

// #include "abi.h"
import "C"

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/gpumem"
	"github.com/kvfence/kvfence/internal/stage"
)

// State rows: SGLang's hybrid-model state (Mamba, SWA, DSA) carried as one
// row per request in the pages after the aux row. The engine's state
// buffers are described once (kvfence_state_layout_new); per request the
// caller passes only its index arrays, one per state type, and Go expands
// the row (every buffer's item at each index, SWA/DSA headers, zero room)
// and copies it into a sender's source pages or out of a handed-off
// receiver's slots on the handle's staging goroutine, in order with its
// gathers, writes and scatters. The scheduler thread's cost is O(types)
// plus copying the index arrays, whatever the row's size.
//
// Row layout (kvfence/sglang_state.py defines it; read_row is the
// reference): the types in order; a type's block is [header (paged types
// only): uint32 count of indices, uint32 bytes per index, little-endian]
// then bound x per bytes: index k's items at k x per, buffer after buffer;
// unused room is zero.

// stateHeader is a paged type's header: count, bytes per index.
const stateHeader = 8

// maxStateBufs bounds a state layout's buffers, all types together.
const maxStateBufs = 1 << 16

type stateBuf struct {
	p    unsafe.Pointer
	item int64 // bytes per index, > 0
}

// stateType is one state type's buffers (those with items of > 0 bytes).
type stateType struct {
	paged bool  // SWA/DSA: up to bound indices, a header; else exactly bound
	bound int64 // indices a request carries (exactly, or at most)
	per   int64 // bytes per index: the buffers' items together
	limit int64 // indices [0, limit) lie inside every buffer
	off   int64 // the block's offset in the row
	bufs  []stateBuf
}

// stateLayoutObj is a registered state layout.
type stateLayoutObj struct {
	types    []stateType
	rowBytes int64
}

// kvfence_state_layout_new describes an engine's state buffers once: n
// state types; type t is paged[t] != 0 (SWA/DSA: a header, then room for
// at most bounds[t] indices) or not (Mamba: exactly bounds[t] indices), and
// has nbufs[t] buffers, taken in order from the flat arrays ptrs, lens
// (bytes of the buffer) and items (bytes per index; 0: the buffer carries
// nothing). Host memory only; every array naturally aligned (4 bytes for
// paged and nbufs, 8 for the rest), else InvalidArgument. Close it with
// kvfence_close.
//
//export kvfence_state_layout_new
func kvfence_state_layout_new(n C.int, paged *C.int32_t, bounds *C.int64_t, nbufs *C.int32_t, ptrs *unsafe.Pointer, lens, items *C.int64_t, out *C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	if n <= 0 || n > 64 || paged == nil || bounds == nil || nbufs == nil || out == nil {
		return fail(e, invalid("a state layout takes 1..64 types (%d) and non-NULL arrays", n))
	}
	if !aligned(unsafe.Pointer(paged), 4) || !aligned(unsafe.Pointer(nbufs), 4) || !aligned(unsafe.Pointer(bounds), 8) ||
		!aligned(unsafe.Pointer(ptrs), 8) || !aligned(unsafe.Pointer(lens), 8) || !aligned(unsafe.Pointer(items), 8) {
		return fail(e, invalid("state layout arrays at %p, %p, %p, %p, %p, %p: not naturally aligned", paged, bounds, nbufs, ptrs, lens, items))
	}
	pg, bd, nb := make([]int32, n), make([]int64, n), make([]int32, n)
	if err := touch("state layout arrays", func() {
		copy(pg, unsafe.Slice((*int32)(unsafe.Pointer(paged)), int(n)))
		copy(bd, unsafe.Slice((*int64)(unsafe.Pointer(bounds)), int(n)))
		copy(nb, unsafe.Slice((*int32)(unsafe.Pointer(nbufs)), int(n)))
	}); err != nil {
		return fail(e, err)
	}
	total := 0
	for t, k := range nb {
		if k < 0 || total+int(k) > maxStateBufs {
			return fail(e, invalid("state type %d: %d buffers (0..%d in all)", t, k, maxStateBufs))
		}
		total += int(k)
	}
	if total > 0 && (ptrs == nil || lens == nil || items == nil) {
		return fail(e, invalid("%d state buffers and NULL arrays", total))
	}
	ps, ls, is := make([]unsafe.Pointer, total), make([]int64, total), make([]int64, total)
	if total > 0 {
		if err := touch("state buffer arrays", func() {
			loadPointers(ps, ptrs)
			copy(ls, unsafe.Slice((*int64)(unsafe.Pointer(lens)), total))
			copy(is, unsafe.Slice((*int64)(unsafe.Pointer(items)), total))
		}); err != nil {
			return fail(e, err)
		}
	}
	sl := &stateLayoutObj{types: make([]stateType, n)}
	j := 0
	for t := range sl.types {
		ty := stateType{paged: pg[t] != 0, bound: bd[t], limit: math.MaxInt64, off: sl.rowBytes}
		if ty.bound < 0 || (!ty.paged && ty.bound == 0) || ty.bound > math.MaxUint32 {
			return fail(e, invalid("state type %d: a bound of %d indices (paged: 0..2^32-1, else 1..)", t, ty.bound))
		}
		for range nb[t] {
			p, size, item := ps[j], ls[j], is[j]
			j++
			if size < 0 || item < 0 || (size > 0 && p == nil) {
				return fail(e, invalid("state type %d: a buffer of %d bytes at %p, %d bytes per index", t, size, p, item))
			}
			if size > 0 {
				if _, dev := gpumem.DeviceOf(uintptr(p)); dev {
					return fail(e, invalid("state type %d: a buffer at %p in device memory (state rows are copied on the host)", t, p))
				}
			}
			if item == 0 {
				continue
			}
			if ty.per += item; ty.per > 1<<40 {
				return fail(e, invalid("state type %d: %d bytes per index or more", t, ty.per))
			}
			ty.limit = min(ty.limit, size/item)
			ty.bufs = append(ty.bufs, stateBuf{p, item})
		}
		if ty.paged && ty.per > math.MaxUint32 {
			return fail(e, invalid("state type %d: %d bytes per index (a header holds 2^32-1)", t, ty.per))
		}
		block := ty.bound * ty.per // both below 2^41
		if ty.paged {
			block += stateHeader
		}
		if sl.rowBytes += block; block > 1<<48 || sl.rowBytes > 1<<48 {
			return fail(e, invalid("a state row of %d bytes or more", sl.rowBytes))
		}
		sl.types[t] = ty
	}
	h := register(sl)
	if err := setHandle(out, h); err != nil {
		unregister(h)
		return fail(e, err)
	}
	return fail(e, nil)
}

// stateIndices copies a request's index arrays from C (idx[t]: counts[t]
// int64 indices of type t) and checks each against the layout: a count of
// exactly (Mamba) or at most (paged) the bound, every index inside every
// buffer of its type.
func stateIndices(sl *stateLayoutObj, idx *unsafe.Pointer, counts *C.int64_t, n C.int) ([][]int64, error) {
	if int(n) != len(sl.types) || idx == nil || counts == nil {
		return nil, invalid("%d index arrays at %p, %p for a layout of %d state types", n, idx, counts, len(sl.types))
	}
	if !aligned(unsafe.Pointer(idx), 8) || !aligned(unsafe.Pointer(counts), 8) {
		return nil, invalid("index arrays at %p, counts at %p: not 8-byte aligned", idx, counts)
	}
	ps, ns := make([]unsafe.Pointer, n), make([]int64, n)
	if err := touch("state index arrays", func() {
		loadPointers(ps, idx)
		copy(ns, unsafe.Slice((*int64)(unsafe.Pointer(counts)), int(n)))
	}); err != nil {
		return nil, err
	}
	out := make([][]int64, n)
	for t, ty := range sl.types {
		k := ns[t]
		if k < 0 || k > ty.bound || (!ty.paged && k != ty.bound) || (k > 0 && (ps[t] == nil || !aligned(ps[t], 8))) {
			return nil, invalid("state type %d: %d indices at %p (bound %d, paged %v; int64 arrays, 8-byte aligned)", t, k, ps[t], ty.bound, ty.paged)
		}
		out[t] = make([]int64, k)
		if k > 0 {
			if err := touch("state indices", func() { copy(out[t], unsafe.Slice((*int64)(ps[t]), int(k))) }); err != nil {
				return nil, err
			}
		}
		for _, i := range out[t] {
			if i < 0 || i >= ty.limit {
				return nil, invalid("state type %d: index %d outside its buffers (%d indices fit)", t, i, ty.limit)
			}
		}
	}
	return out, nil
}

// eachPiece calls put with the row's pieces in order: an engine item, a
// header (gather: its bytes; scatter: nil, skipped) or unused room (nil:
// zeros, or skipped).
func (sl *stateLayoutObj) eachPiece(idx [][]int64, gather bool, put func(p unsafe.Pointer, n int64) error) error {
	for t, ty := range sl.types {
		ix := idx[t]
		if ty.paged {
			var h unsafe.Pointer
			if gather {
				hb := make([]byte, stateHeader)
				binary.LittleEndian.PutUint32(hb, uint32(len(ix)))
				binary.LittleEndian.PutUint32(hb[4:], uint32(ty.per))
				h = unsafe.Pointer(&hb[0])
			}
			if err := put(h, stateHeader); err != nil {
				return err
			}
		}
		for _, i := range ix {
			for _, b := range ty.bufs {
				if err := put(unsafe.Add(b.p, i*b.item), b.item); err != nil {
					return err
				}
			}
		}
		if err := put(nil, (ty.bound-int64(len(ix)))*ty.per); err != nil {
			return err
		}
	}
	return nil
}

// checkHeaders raises FailedPrecondition unless each paged type's header
// in row (read with read) says as many indices as idx has, of ty.per bytes.
func (sl *stateLayoutObj) checkHeaders(idx [][]int64, read func(off int64, dst []byte) error) error {
	hb := make([]byte, stateHeader)
	for t, ty := range sl.types {
		if !ty.paged {
			continue
		}
		if err := read(ty.off, hb); err != nil {
			return err
		}
		got, per := binary.LittleEndian.Uint32(hb), binary.LittleEndian.Uint32(hb[4:])
		if int64(got) != int64(len(idx[t])) || int64(per) != ty.per {
			return errdefs.Errorf(errdefs.FailedPrecondition, "prefill sent %d state indices of %d bytes each, decode expects %d of %d bytes (state type %d)",
				got, per, len(idx[t]), ty.per, t)
		}
	}
	return nil
}

// kvfence_sender_gather_state_queued queues the copy of the request's state
// row (layout: kvfence_state_layout_new; idx[t]: counts[t] int64 indices of
// type t, every array 8-byte aligned, copied and checked at the call: InvalidArgument and nothing
// queued if one lies outside its buffers) into the sender's source pages
// [first, first+count), zero-padded to the end of the last page, after the
// sender's queued gathers and writes; kvfence_sender_gather_wait reports
// it, and the request is finished (Success on both sides) only by a later
// gather, after it. The state buffers must keep the request's items until
// the copy ran (SGLang frees a prefill request's state only once its poll
// is Success or Failed).
//
//export kvfence_sender_gather_state_queued
func kvfence_sender_gather_state_queued(s C.kvfence_handle, first, count C.int, layout C.kvfence_handle, idx *unsafe.Pointer, counts *C.int64_t, n C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := senderRange(s, first, count)
	if err != nil {
		return fail(e, err)
	}
	sl, err := lookup[*stateLayoutObj](uint64(layout), "state layout")
	if err != nil {
		return fail(e, err)
	}
	if sl.rowBytes > int64(count)*o.a.pageBytes {
		return fail(e, invalid("a state row of %d bytes in %d pages of %d", sl.rowBytes, count, o.a.pageBytes))
	}
	ix, err := stateIndices(sl, idx, counts, n)
	if err != nil {
		return fail(e, err)
	}
	queue(uint64(s), func() error {
		return o.s.FillRange(int(first), int(count), func(pages [][]byte, step func() error) error {
			return safeRun(func() error {
				return fillRow(pages, func(put func(unsafe.Pointer, int64) error) error { return sl.eachPiece(ix, true, put) }, step)
			})
		})
	})
	return fail(e, nil)
}

// fillRow writes the pieces each gives (nil: zeros), then zeros, across
// pages, calling step before each piece of at most agent.FillPiece bytes.
func fillRow(pages [][]byte, each func(put func(unsafe.Pointer, int64) error) error, step func() error) error {
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
				if int64(k) < n { // never one past the piece's end: that may be another object
					src = unsafe.Add(src, k)
				}
			}
			off, budget, n = off+k, budget-k, n-int64(k)
		}
		return nil
	}
	if err := each(put); err != nil {
		return err
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

// kvfence_receiver_scatter_state queues the copy of the request's state row,
// which shard 0 (the first shard bytes) of the handed-off request's slots
// [first, first+count) hold, into the engine's state buffers (layout,
// idx and counts as kvfence_sender_gather_state_queued's; headers and
// unused room skipped), after the receiver's queued scatters;
// kvfence_receiver_scatter_done reports it, and the receiver's finish and
// close wait for it. At the call, before anything is queued: the indices
// are checked (InvalidArgument) and so is each SWA/DSA header against them
// (FailedPrecondition: prefill sent another number of indices or other
// items). In direct mode the slots must be host landing pages. The state
// buffers must stay the engine's until the copy ended.
//
//export kvfence_receiver_scatter_state
func kvfence_receiver_scatter_state(r C.kvfence_handle, first, count, shard C.int, layout C.kvfence_handle, idx *unsafe.Pointer, counts *C.int64_t, n C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	work, err := scatterStateWork(r, first, count, shard, layout, idx, counts, n)
	if err != nil {
		return fail(e, err)
	}
	queue(uint64(r), work)
	return fail(e, nil)
}

// scatterStateWork checks kvfence_receiver_scatter_state's arguments and
// the row's headers and returns the copy, not yet queued.
func scatterStateWork(r C.kvfence_handle, first, count, shard C.int, layout C.kvfence_handle, idx *unsafe.Pointer, counts *C.int64_t, n C.int) (func() error, error) {
	o, pages, err := handedOff(r, first, count, "kvfence_receiver_scatter_state")
	if err != nil {
		return nil, err
	}
	if shard <= 0 || int64(shard) > o.a.pageBytes {
		return nil, invalid("shards of %d bytes (slots of %d)", shard, o.a.pageBytes)
	}
	sl, err := lookup[*stateLayoutObj](uint64(layout), "state layout")
	if err != nil {
		return nil, err
	}
	if sl.rowBytes > int64(count)*int64(shard) {
		return nil, invalid("a state row of %d bytes in %d shards of %d", sl.rowBytes, count, shard)
	}
	ix, err := stateIndices(sl, idx, counts, n)
	if err != nil {
		return nil, err
	}
	rows := make([][]byte, count)
	for i := range rows {
		rows[i] = pages[int(first)+i][:shard]
	}
	if err := sl.checkHeaders(ix, func(off int64, dst []byte) error {
		return touch("slots", func() {
			i, o := int(off/int64(shard)), int(off%int64(shard))
			for dst := dst; len(dst) > 0; i, o = i+1, 0 {
				dst = dst[copy(dst, rows[i][o:]):]
			}
		})
	}); err != nil {
		return nil, err
	}
	return func() error {
		return safeRun(func() error {
			runs := make([]stage.Run, 0, 1024)
			pg, off := 0, 0
			err := sl.eachPiece(ix, false, func(dst unsafe.Pointer, n int64) error {
				for n > 0 {
					if off == len(rows[pg]) {
						pg, off = pg+1, 0
					}
					k := int(min(n, int64(len(rows[pg])-off)))
					if dst != nil {
						runs = append(runs, stage.Run{Dst: dst, Src: unsafe.Pointer(&rows[pg][off]), N: k})
						if int64(k) < n { // never one past the piece's end
							dst = unsafe.Add(dst, k)
						}
						if len(runs) == cap(runs) { // a bounded list: an SWA window is 100,000s of items
							stage.Host{}.Copy(runs)
							runs = runs[:0]
						}
					}
					off, n = off+k, n-int64(k)
				}
				return nil
			})
			stage.Host{}.Copy(runs)
			return err
		})
	}, nil
}

// aligned: p may be read as values of the given alignment. A misaligned
// array is refused rather than read: x86 would read it, but a Go conversion
// of it is undefined (checkptr, under -race, aborts the process), and a bulk
// copy of misaligned pointers throws in the GC's write barrier.
func aligned(p unsafe.Pointer, align uintptr) bool { return uintptr(p)%align == 0 }

// loadPointers fills dst from the caller's pointer array at src (aligned,
// read inside touch), one load each: a bulk copy of pointers runs the GC's
// bulk write barrier while a GC is marking, which throws on memory it does
// not expect (a CI run died so on kvfence_state_layout_new's misaligned
// test array: "bulkBarrierPreWrite: unaligned arguments").
func loadPointers(dst []unsafe.Pointer, src *unsafe.Pointer) {
	for i := range dst {
		dst[i] = *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(src), uintptr(i)*unsafe.Sizeof(unsafe.Pointer(nil))))
	}
}
