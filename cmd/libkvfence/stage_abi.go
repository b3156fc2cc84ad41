package main

// #include "abi.h"
import "C"

import (
	"sync"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/internal/stage"
)

// kvfence_sender_gather queues the copy of n engine pages (page indices idx
// of layout, slice part of parts of every token: SGLang's contiguous head
// split when decode TP > prefill TP, else 0 of 1) into the sender's source
// pages [first, first+n), then marks pages [0, upto) sendable (upto > 0)
// and the request produced with total pages (total > 0). It returns at
// once: the copy runs on a Go thread, after the sender's earlier gathers;
// kvfence_sender_gather_wait reports it. The engine's pages must stay
// allocated until then (SGLang frees them only after the request ends).
//
//export kvfence_sender_gather
func kvfence_sender_gather(s, layout C.kvfence_handle, idx *C.int32_t, n, part, parts, first, upto, total C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*senderObj](uint64(s), "sender")
	if err != nil {
		return fail(e, err)
	}
	lo, err := lookup[*layoutObj](uint64(layout), "layout")
	if err != nil {
		return fail(e, err)
	}
	l, sl := lo.l, stage.Slice{Part: int(part), Parts: int(parts)}
	if err := l.Check(sl); err != nil {
		return fail(e, err)
	}
	if sb := l.ShardBytes(sl); sb > o.a.pageBytes {
		return fail(e, invalid("a page of this layout is %d bytes, a source page %d", sb, o.a.pageBytes))
	}
	if first < 0 || n < 0 || int(first)+int(n) > o.s.Pages() || upto < 0 || total < 0 {
		return fail(e, invalid("pages [%d, %d) of a %d-page request, upto %d, total %d (init first)", first, first+n, o.s.Pages(), upto, total))
	}
	pages, err := indices(l, idx, n)
	if err != nil {
		return fail(e, err)
	}
	cp, err := copierFor(lo, false)
	if err != nil {
		return fail(e, err)
	}
	queue(uint64(s), func() error { return gather(o, l, sl, cp, pages, int(first), int(upto), int(total)) })
	return fail(e, nil)
}

func gather(o *senderObj, l *stage.Layout, sl stage.Slice, cp stage.Copier, pages []int32, first, upto, total int) error {
	var err error
	if _, dev := cp.(deviceCopier); dev {
		err = gatherDevice(o, l, sl, cp, pages, first)
	} else {
		err = fillHost(o, l, sl, pages, first)
	}
	if err == nil && upto > 0 {
		err = o.s.Send(upto)
	}
	if err == nil && total > 0 {
		err = o.s.Finish(total)
	}
	return err
}

// fillHost copies host engine pages straight into the source pages: the
// whole gather planned buffer by buffer (stage.GatherPages: far fewer TLB
// misses at scattered page indices than page by page), copied in steps of
// at most agent.FillPiece bytes, each after KVSender.FillRange's check
// that the request still owns its pages.
func fillHost(o *senderObj, l *stage.Layout, sl stage.Slice, pages []int32, first int) error {
	return o.s.FillRange(first, len(pages), func(dst [][]byte, step func() error) error {
		ptrs := make([]unsafe.Pointer, len(dst))
		for i, d := range dst {
			ptrs[i] = unsafe.Pointer(&d[0])
		}
		plan := runPool.Get().(*[]stage.Run)
		defer runPool.Put(plan)
		runs := l.GatherPages((*plan)[:0], pages, sl, ptrs)
		*plan = runs
		defer clear(runs) // no engine address outlives the call
		return safeRun(func() error {
			for at := 0; at < len(runs); {
				end, n := at, 0
				for end < len(runs) && (end == at || n+runs[end].N <= agent.FillPiece) {
					n += runs[end].N
					end++
				}
				if err := step(); err != nil {
					return err
				}
				stage.Host{}.CopySpan(runs, at, end)
				at = end
			}
			return nil
		})
	})
}

// kvfence_sender_write_queued copies size bytes at src (at most count
// pages: the caller may reuse src once it returns) and queues their write,
// zero-padded to count whole pages, into the source pages from first on,
// after the sender's queued gathers; kvfence_sender_gather_wait reports it,
// and a later gather's send covers the pages only after it. SGLang's last
// send() writes its aux row so: a synchronous kvfence_sender_write of a
// whole page (128 KiB for Llama-3-8B) on the scheduler thread took
// 80-120 µs of its CPU, competing with the running gather for memory
// bandwidth; a row is tens of bytes.
//
//export kvfence_sender_write_queued
func kvfence_sender_write_queued(s C.kvfence_handle, first, count C.int, src unsafe.Pointer, size C.size_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := senderRange(s, first, count)
	if err != nil {
		return fail(e, err)
	}
	if limit := int64(count) * o.a.pageBytes; uint64(size) > uint64(limit) {
		return fail(e, invalid("src: %d bytes do not fit %d pages of %d bytes", uint64(size), count, o.a.pageBytes))
	}
	in, err := bytesAt("src", src, size, int64(size))
	data := make([]byte, len(in))
	if err == nil {
		err = touch("src", func() { copy(data, in) })
	}
	if err != nil {
		return fail(e, err)
	}
	shard := int(o.a.pageBytes)
	queue(uint64(s), func() error {
		return o.s.FillRange(int(first), int(count), func(pages [][]byte, step func() error) error {
			for i, page := range pages {
				if err := step(); err != nil {
					return err
				}
				clear(page[copy(page, data[min(i*shard, len(data)):]):])
			}
			return nil
		})
	})
	return fail(e, nil)
}

// kvfence_receiver_read_row copies the first size bytes of the row that
// shard 0 (its first shard bytes) of the handed-off request's slots [first,
// first+count) hold, in order, to dst: SGLang's aux row and state row, which
// writer 0 sends after the KV pages. Only the row's bytes are read: reading
// whole 128 KiB slots that another process just wrote cost decode's poll()
// ~160 µs of CPU for a row of tens of bytes.
//
//export kvfence_receiver_read_row
func kvfence_receiver_read_row(r C.kvfence_handle, first, count, shard C.int, dst unsafe.Pointer, size C.size_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	return fail(e, readRow(r, first, count, shard, 0, dst, size, "kvfence_receiver_read_row"))
}

func readRow(r C.kvfence_handle, first, count, shard C.int, offset int64, dst unsafe.Pointer, size C.size_t, call string) error {
	o, pages, err := handedOff(r, first, count, call)
	if err != nil {
		return err
	}
	if shard <= 0 || int64(shard) > o.a.pageBytes || offset < 0 || uint64(size) > uint64(count)*uint64(shard) ||
		uint64(offset) > uint64(count)*uint64(shard)-uint64(size) {
		return invalid("bytes [%d, +%d) of a row from %d shards of %d bytes (slots of %d)", offset, uint64(size), count, shard, o.a.pageBytes)
	}
	out, err := bytesAt("dst", dst, size, int64(size))
	if err != nil {
		return err
	}
	return touch("dst", func() {
		i, off := int(offset/int64(shard)), int(offset%int64(shard))
		for ; len(out) > 0; i, off = i+1, 0 {
			out = out[copy(out, pages[int(first)+i][off:shard]):]
		}
	})
}

// runPool keeps gather plans between gathers: a 64 MiB request at page
// size 1 is 32768 runs (768 KiB), and a fresh slice each time cost more in
// allocation and page faults (2-14 ms measured on a loaded host) than its
// copy saves against a plain memcpy.
var runPool = sync.Pool{New: func() any { return new([]stage.Run) }}

// kvfence_sender_gather_wait waits up to timeout_ms (0: not at all) for the
// sender's queued gathers: 1 while one runs, 0 once all ended well, else
// the negated code of the first that failed (e says why).
//
//export kvfence_sender_gather_wait
func kvfence_sender_gather_wait(s C.kvfence_handle, timeoutMs C.int64_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	if _, err := lookup[*senderObj](uint64(s), "sender"); err != nil {
		return -fail(e, err)
	}
	return waitJobs(uint64(s), clampMs(timeoutMs), e)
}

// kvfence_receiver_scatter queues the copy of a handed-off request's first
// n pages into the engine's pages idx of layout: shards prefill shards per
// slot, shard k holding part k of every token (SGLang's head split); with
// mla every shard holds the whole page and shard 0 is taken. It returns at
// once; kvfence_receiver_scatter_done reports it, and the receiver's finish
// and close wait for it.
//
//export kvfence_receiver_scatter
func kvfence_receiver_scatter(r, layout C.kvfence_handle, idx *C.int32_t, n, shards, mla C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	work, err := scatterWork(r, layout, idx, n, shards, mla)
	if err != nil {
		return fail(e, err)
	}
	queue(uint64(r), work)
	return fail(e, nil)
}

// scatterWork checks kvfence_receiver_scatter's arguments and returns the
// copy, not yet queued.
func scatterWork(r, layout C.kvfence_handle, idx *C.int32_t, n, shards, mla C.int) (func() error, error) {
	o, err := lookup[*receiverObj](uint64(r), "receiver")
	if err != nil {
		return nil, err
	}
	lo, err := lookup[*layoutObj](uint64(layout), "layout")
	if err != nil {
		return nil, err
	}
	l := lo.l
	if shards <= 0 || int64(shards) > o.a.pageBytes {
		return nil, invalid("%d shards per slot", shards)
	}
	shardB := o.a.pageBytes / int64(shards)
	if err := l.CheckShards(int(shards), mla != 0); err != nil {
		return nil, err
	}
	if sb := l.ShardBytes(stage.Slice{Part: 0, Parts: scatterParts(int(shards), mla != 0)}); sb > shardB {
		return nil, invalid("a shard of this layout is %d bytes, a slot's shard %d", sb, shardB)
	}
	pages, err := indices(l, idx, n)
	if err != nil {
		return nil, err
	}
	if err := notDirect(o.a, "kvfence_receiver_scatter"); err != nil {
		return nil, err
	}
	slots := o.rv.Pages()
	if slots == nil || len(pages) > len(slots) {
		return nil, errdefs.Errorf(errdefs.FailedPrecondition, "%d pages to scatter from a request with %d handed-off pages (state %s)", len(pages), len(slots), o.rv.Poll())
	}
	cp, err := copierFor(lo, true)
	if err != nil {
		return nil, err
	}
	return func() error {
		var runs []stage.Run
		for i, p := range pages {
			runs = l.ScatterPage(runs[:0], unsafe.Pointer(&slots[i][0]), int(shards), shardB, mla != 0, p)
			if err := safeCopy(cp, runs); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// kvfence_receiver_handoff is decode's whole handoff in one call (one
// lookup of the request's pages, one job): it checks the state row's copy
// (as kvfence_receiver_scatter_state; skipped when state_layout is 0) and
// the KV scatter (as kvfence_receiver_scatter), then reads the aux row (as
// kvfence_receiver_read_row; skipped when aux_size is 0) into aux_dst, and
// only then queues the state row's copy followed by the KV scatter as one
// job: nothing is queued or read when a check fails, and the copies do not
// compete with the caller's thread for memory while it checks.
// kvfence_receiver_scatter_done reports the job.
//
//export kvfence_receiver_handoff
func kvfence_receiver_handoff(r, layout C.kvfence_handle, idx *C.int32_t, n, shards, mla C.int,
	stateFirst, stateCount, stateShard C.int, stateLayout C.kvfence_handle, stateIdx *unsafe.Pointer, stateCounts *C.int64_t, stateN C.int,
	auxFirst, auxCount, auxShard C.int, auxDst unsafe.Pointer, auxSize C.size_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	var state func() error
	if stateLayout != 0 {
		var err error
		if state, err = scatterStateWork(r, stateFirst, stateCount, stateShard, stateLayout, stateIdx, stateCounts, stateN); err != nil {
			return fail(e, err)
		}
	}
	kv, err := scatterWork(r, layout, idx, n, shards, mla)
	if err != nil {
		return fail(e, err)
	}
	if auxSize > 0 {
		if err := readRow(r, auxFirst, auxCount, auxShard, 0, auxDst, auxSize, "kvfence_receiver_handoff"); err != nil {
			return fail(e, err)
		}
	}
	queue(uint64(r), func() error {
		if state != nil {
			if err := state(); err != nil {
				return err
			}
		}
		return kv()
	})
	return fail(e, nil)
}

func scatterParts(shards int, mla bool) int {
	if mla {
		return 1
	}
	return shards
}

// kvfence_receiver_scatter_done is kvfence_sender_gather_wait for a
// receiver's scatters.
//
//export kvfence_receiver_scatter_done
func kvfence_receiver_scatter_done(r C.kvfence_handle, timeoutMs C.int64_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	if _, err := lookup[*receiverObj](uint64(r), "receiver"); err != nil {
		return -fail(e, err)
	}
	return waitJobs(uint64(r), clampMs(timeoutMs), e)
}

// kvfence_handles_live is how many handles are open (agents, requests,
// layouts): a leak check for engines and tests.
//
//export kvfence_handles_live
func kvfence_handles_live() C.int64_t {
	registry.RLock()
	defer registry.RUnlock()
	return C.int64_t(len(registry.objs))
}

// clampMs is timeout_ms as a duration: negative is 0, at most an hour.
func clampMs(ms C.int64_t) time.Duration {
	return time.Duration(min(max(int64(ms), 0), 3600_000)) * time.Millisecond
}
