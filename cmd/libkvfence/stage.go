package main

// #include "abi.h"
import "C"

import (
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
	"github.com/kvfence/kvfence/gpumem"
	"github.com/kvfence/kvfence/internal/stage"
)

// Staging: an engine's KV pages copied into a sender's source pages
// (gather) and out of a handed-off receiver's slots (scatter) on Go
// threads, so the engine's scheduler thread only queues the work and polls
// for it. Engine memory is read or written only while the call's request
// still owns its kvfence pages: gathers go through KVSender.FillRange (on
// the job's goroutine, over pinned pages; the request's end checked per
// 256 KiB step), and a receiver's finish or close waits for its scatter.

// layoutObj is a layout and, when some of its buffers are device memory,
// the Mover that copies them (stage_gpu.go).
type layoutObj struct {
	l  *stage.Layout
	mv gpumem.Mover
}

// copierFor picks the copier of a layout's buffers: memmove for host
// memory, gpumem for a layout with device buffers (toDevice: a scatter).
func copierFor(lo *layoutObj, toDevice bool) (stage.Copier, error) {
	if cp := gpuCopier(lo, toDevice); cp != nil {
		return cp, nil
	}
	for _, b := range lo.l.Bufs {
		if b.Device {
			return nil, errdefs.Errorf(errdefs.Internal, "device buffer without a device")
		}
	}
	return stage.Host{}, nil
}

// safeCopy performs runs, turning a fault on engine memory (an address
// that is not mapped) into InvalidArgument instead of a crash of the
// process: it may run on a rank's loop goroutine (KVSender.Fill).
func safeCopy(cp stage.Copier, runs []stage.Run) (err error) {
	return safeRun(func() error { return cp.Copy(runs) })
}

// safeRun runs work with a fault on engine memory turned into
// InvalidArgument, as safeCopy does.
func safeRun(work func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			err = errdefs.Errorf(errdefs.InvalidArgument, "staging copy faulted on engine memory: %v", r)
		}
	}()
	return work()
}

// job is the staging work queued on one sender or receiver handle: each new
// job starts after the previous one ended, in the order queued.
type job struct {
	done chan struct{}
	err  error
}

var jobs = struct {
	sync.Mutex
	last map[uint64]*job
}{last: map[uint64]*job{}}

// queue runs work after h's previous job and records it as h's last.
func queue(h uint64, work func() error) {
	j := &job{done: make(chan struct{})}
	jobs.Lock()
	prev := jobs.last[h]
	jobs.last[h] = j
	jobs.Unlock()
	go func() {
		defer close(j.done)
		if prev != nil {
			<-prev.done
			if prev.err != nil {
				j.err = prev.err // a failed gather fails the ones after it: their pages follow its pages
				return
			}
		}
		j.err = work()
	}()
}

// waitJobs waits up to timeout for h's queued work: 1 while it runs, 0 once
// it ended well, else the negated code (e says why).
func waitJobs(h uint64, timeout time.Duration, e *C.kvfence_error) C.int {
	jobs.Lock()
	j := jobs.last[h]
	jobs.Unlock()
	if j == nil {
		return fail(e, nil)
	}
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-j.done:
		case <-t.C:
		}
	}
	select {
	case <-j.done:
		return -fail(e, j.err)
	default:
		fail(e, nil)
		return 1
	}
}

// settleJobs waits for all of h's work and forgets it (finish and close:
// no copy may touch a request's memory after its handle let go of it).
func settleJobs(h uint64) {
	jobs.Lock()
	j := jobs.last[h]
	delete(jobs.last, h)
	jobs.Unlock()
	if j != nil {
		<-j.done
	}
}

// kvfence_layout_new describes an engine's KV buffers: n buffers, buffer i
// lens[i] bytes at ptrs[i] with items[i] bytes per page index, page_size
// tokens per page; the arrays 8-byte aligned, else InvalidArgument. Close it
// with kvfence_close.
//
//export kvfence_layout_new
func kvfence_layout_new(ptrs *unsafe.Pointer, lens, items *C.int64_t, n, pageSize C.int, out *C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	if ptrs == nil || lens == nil || items == nil || out == nil || n <= 0 || n > 1<<16 {
		return fail(e, invalid("a layout takes 1..65536 buffers (%d) and non-NULL arrays", n))
	}
	if !aligned(unsafe.Pointer(ptrs), 8) || !aligned(unsafe.Pointer(lens), 8) || !aligned(unsafe.Pointer(items), 8) {
		return fail(e, invalid("layout arrays at %p, %p, %p: not 8-byte aligned", ptrs, lens, items))
	}
	bufs := make([]stage.Buffer, n)
	if err := touch("layout arrays", func() {
		ps, ls, is := unsafe.Slice(ptrs, int(n)), unsafe.Slice(lens, int(n)), unsafe.Slice(items, int(n))
		for i := range bufs {
			bufs[i] = stage.Buffer{Addr: ps[i], Len: int64(ls[i]), Item: int64(is[i])}
		}
	}); err != nil {
		return fail(e, err)
	}
	mv, err := markDevice(bufs)
	if err != nil {
		return fail(e, err)
	}
	l, err := stage.NewLayout(bufs, int(pageSize))
	if err != nil {
		return fail(e, err)
	}
	h := register(&layoutObj{l: l, mv: mv})
	if err := setHandle(out, h); err != nil {
		unregister(h)
		return fail(e, err)
	}
	return fail(e, nil)
}

// indices copies n page indices from C and checks them against l.
func indices(l *stage.Layout, idx *C.int32_t, n C.int) ([]int32, error) {
	if n < 0 || (n > 0 && idx == nil) {
		return nil, invalid("%d page indices at %p", n, idx)
	}
	if err := pageCount("page indices", n, false); err != nil {
		return nil, err
	}
	out := make([]int32, n)
	if n > 0 {
		if err := touch("page indices", func() { copy(out, unsafe.Slice((*int32)(unsafe.Pointer(idx)), int(n))) }); err != nil {
			return nil, err
		}
	}
	return out, l.CheckIndices(out)
}
