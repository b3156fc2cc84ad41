package main

// #include "abi.h"
import "C"

import (
	"time"
	"unsafe"

	"github.com/kvfence/kvfence/agent"
	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

type receiverObj struct {
	a  *agentObj
	rv *agent.KVReceiver
}

type senderObj struct {
	a *agentObj
	s *agent.KVSender
}

// request is what receivers and senders share for polling.
type request interface {
	Poll() agent.PollState
	Done() <-chan struct{}
	Err() error
}

func (r *receiverObj) req() request { return r.rv }
func (s *senderObj) req() request   { return s.s }

type hasReq interface {
	req() request
	agent() *agentObj
}

func (r *receiverObj) agent() *agentObj { return r.a }
func (s *senderObj) agent() *agentObj   { return s.a }

// kvfence_page_bytes is the bytes of one page on this rank (decode: a slot,
// one shard per prefill rank; prefill: one shard), or a negated error code.
//
//export kvfence_page_bytes
func kvfence_page_bytes(h C.kvfence_handle) (n C.int64_t) {
	defer func() {
		if recover() != nil {
			n = -C.int64_t(errdefs.Internal + 1)
		}
	}()
	a, err := lookup[*agentObj](uint64(h), "agent")
	if err != nil {
		return -C.int64_t(codeOf(err))
	}
	return C.int64_t(a.pageBytes)
}

// kvfence_receiver_new makes decode's handle for request (room, gen).
//
//export kvfence_receiver_new
func kvfence_receiver_new(dec C.kvfence_handle, room, gen C.uint64_t, out *C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	a, err := lookup[*agentObj](uint64(dec), "agent")
	if err == nil && a.dec == nil {
		err = invalid("handle %d is a prefill rank; receivers live on decode", dec)
	}
	if err == nil {
		err = setHandle(out, 0)
	}
	if err != nil {
		return fail(e, err)
	}
	rv := a.dec.NewReceiver(core.RequestKey{Room: uint64(room), Gen: uint64(gen)})
	return fail(e, setHandle(out, register(&receiverObj{a: a, rv: rv})))
}

// kvfence_receiver_init exposes pages slots that each of the nranks prefill
// ranks writes (a slot holds one shard per rank, in this order).
// RESOURCE_EXHAUSTED: the pool is full (holds count); retry later.
//
//export kvfence_receiver_init
func kvfence_receiver_init(r C.kvfence_handle, pages C.int, ranks *C.uint32_t, nranks C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*receiverObj](uint64(r), "receiver")
	if err == nil {
		err = pageCount("pages", pages, true)
	}
	var xs []uint32
	if err == nil {
		xs, err = ranksAt(ranks, nranks, o.a.shards) // nranks checked before ranks is read
	}
	if err != nil {
		return fail(e, err)
	}
	rs := make([]core.RankID, len(xs))
	for i, x := range xs {
		rs[i] = core.RankID(x)
	}
	_, err = o.rv.Init(int(pages), rs)
	return fail(e, err)
}

// kvfence_receiver_read copies count pages from first on of a handed-off
// request (state SUCCESS) into dst: count × page_bytes bytes, each page
// holding one shard per prefill rank. Before Success it is
// FAILED_PRECONDITION. In direct mode only host landing pages
// (direct_host_pages) are read; an engine page is FAILED_PRECONDITION.
//
//export kvfence_receiver_read
func kvfence_receiver_read(r C.kvfence_handle, first, count C.int, dst unsafe.Pointer, size C.size_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, pages, err := handedOff(r, first, count, "kvfence_receiver_read")
	if err != nil {
		return fail(e, err)
	}
	out, err := bytesAt("dst", dst, size, int64(count)*o.a.pageBytes)
	if err != nil {
		return fail(e, err)
	}
	return fail(e, touch("dst", func() {
		for i, p := range pages[first : first+count] {
			copy(out[i*int(o.a.pageBytes):], p)
		}
	}))
}

// handedOff is receiver r and its handed-off slots, if [first,
// first+count) are among them; in direct mode only host landing pages are
// (call names the ABI function, for the refusal of an engine page).
func handedOff(r C.kvfence_handle, first, count C.int, call string) (*receiverObj, [][]byte, error) {
	o, err := lookup[*receiverObj](uint64(r), "receiver")
	if err != nil {
		return nil, nil, err
	}
	pages := o.rv.Pages()
	if pages == nil {
		return nil, nil, errdefs.Errorf(errdefs.FailedPrecondition, "request not handed off (state %s)", o.rv.Poll())
	}
	if err := pageRange(first, count, len(pages)); err != nil {
		return nil, nil, err
	}
	return o, pages, landingOnly(o.a, call, pages[first:first+count], int(first))
}

// kvfence_receiver_finish gives a handed-off request's slots back.
//
//export kvfence_receiver_finish
func kvfence_receiver_finish(r C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*receiverObj](uint64(r), "receiver")
	if err != nil {
		return fail(e, err)
	}
	settleJobs(uint64(r)) // the slots go back only after the scatter read them
	o.rv.Finish()
	return fail(e, nil)
}

// kvfence_receiver_abort stops the request; its slots stay held until the
// runtime proves no write can land (drained, fenced or timeout). In direct
// mode an abort that lost the race with success (every write landed: an
// engine dropping a finished request) lets the engine's pages go at once,
// as kvfence_receiver_finish does — else they would stay lent for ever.
//
//export kvfence_receiver_abort
func kvfence_receiver_abort(r C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*receiverObj](uint64(r), "receiver")
	if err != nil {
		return fail(e, err)
	}
	o.rv.Abort()
	if len(o.a.direct) > 0 && o.rv.Poll() == agent.PollSuccess { // Abort ran in the agent's loop: no later success
		settleJobs(uint64(r)) // a queued scatter of the rows still reads the host landing pages
		o.rv.Finish()
	}
	return fail(e, nil)
}

// kvfence_receiver_released is 1 once the runtime gave the request's slots
// back (finished, drained, fenced or timed out), 0 while held.
//
//export kvfence_receiver_released
func kvfence_receiver_released(r C.kvfence_handle) (code C.int) {
	defer guard(nil, &code)
	o, err := lookup[*receiverObj](uint64(r), "receiver")
	if err != nil {
		return -codeOf(err)
	}
	if o.rv.Released() {
		return 1
	}
	return 0
}

// kvfence_sender_new makes prefill's handle for request (room, gen).
//
//export kvfence_sender_new
func kvfence_sender_new(pre C.kvfence_handle, room, gen C.uint64_t, out *C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	a, err := lookup[*agentObj](uint64(pre), "agent")
	if err == nil && a.pre == nil {
		err = invalid("handle %d is a decode rank; senders live on prefill", pre)
	}
	if err == nil {
		err = setHandle(out, 0)
	}
	if err != nil {
		return fail(e, err)
	}
	s := a.pre.NewSender(core.RequestKey{Room: uint64(room), Gen: uint64(gen)})
	return fail(e, setHandle(out, register(&senderObj{a: a, s: s})))
}

// kvfence_sender_init reserves pages source pages (RESOURCE_EXHAUSTED when
// none are free: retry later).
//
//export kvfence_sender_init
func kvfence_sender_init(s C.kvfence_handle, pages C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*senderObj](uint64(s), "sender")
	if err == nil {
		err = pageCount("pages", pages, true)
	}
	if err != nil {
		return fail(e, err)
	}
	return fail(e, o.s.Init(int(pages)))
}

// kvfence_sender_write copies count pages of KV (count × page_bytes bytes
// at src) into source pages from first on, before a send covers them.
// FAILED_PRECONDITION once the request ended and its pages went back.
//
//export kvfence_sender_write
func kvfence_sender_write(s C.kvfence_handle, first, count C.int, src unsafe.Pointer, size C.size_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := senderRange(s, first, count)
	if err != nil {
		return fail(e, err)
	}
	in, err := bytesAt("src", src, size, int64(count)*o.a.pageBytes)
	if err == nil {
		err = probe("src", src, len(in)) // Write's copy below does not catch a fault
	}
	if err != nil {
		return fail(e, err)
	}
	// Write copies on this thread over pinned source pages and refuses once
	// the request's pages went back to the pool (they may be another
	// request's).
	return fail(e, o.s.Write(int(first), in))
}

// senderRange is sender s, if pages [first, first+count) are among its
// reserved pages.
func senderRange(s C.kvfence_handle, first, count C.int) (*senderObj, error) {
	o, err := lookup[*senderObj](uint64(s), "sender")
	if err != nil {
		return nil, err
	}
	if err := pageRange(first, count, o.s.Pages()); err != nil {
		return nil, invalid("%v (init first)", err)
	}
	return o, nil
}

// kvfence_sender_send marks pages [0, upto) computed and sendable.
//
//export kvfence_sender_send
func kvfence_sender_send(s C.kvfence_handle, upto C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*senderObj](uint64(s), "sender")
	if err == nil {
		err = pageCount("upto", upto, false)
	}
	if err != nil {
		return fail(e, err)
	}
	return fail(e, o.s.Send(int(upto)))
}

// kvfence_sender_finish says the request's last page is produced (total
// pages in all).
//
//export kvfence_sender_finish
func kvfence_sender_finish(s C.kvfence_handle, total C.int, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*senderObj](uint64(s), "sender")
	if err == nil {
		err = pageCount("total", total, false)
	}
	if err != nil {
		return fail(e, err)
	}
	return fail(e, o.s.Finish(int(total)))
}

// kvfence_sender_abort cancels the request here: unsent pages are dropped,
// writes in flight drain, and the source pages come back only once no
// write can still read them.
//
//export kvfence_sender_abort
func kvfence_sender_abort(s C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	o, err := lookup[*senderObj](uint64(s), "sender")
	if err != nil {
		return fail(e, err)
	}
	o.s.Abort()
	return fail(e, nil)
}

// kvfence_poll is a receiver's or sender's state (KVFENCE_POLL_*), or a
// negated error code.
//
//export kvfence_poll
func kvfence_poll(h C.kvfence_handle) (code C.int) {
	defer guard(nil, &code)
	r, err := lookup[hasReq](uint64(h), "receiver or sender")
	if err != nil {
		return -codeOf(err)
	}
	return C.int(r.req().Poll())
}

// kvfence_wait waits up to timeout_ms for a receiver or sender to reach
// Success or Failed, then returns its state as kvfence_poll does. It
// returns at once -NOT_FOUND when another thread closes the handle and
// -UNAVAILABLE when its agent closes.
//
//export kvfence_wait
func kvfence_wait(h C.kvfence_handle, timeoutMs C.int64_t) (code C.int) {
	defer guard(nil, &code)
	r, err := lookup[hasReq](uint64(h), "receiver or sender")
	if err != nil {
		return -codeOf(err)
	}
	d, err := waitFor(timeoutMs)
	if err != nil {
		return -codeOf(err)
	}
	closed, agentClosed := goneCh(r), goneCh(r.agent())
	if closed == nil {
		return -codeOf(errdefs.Errorf(errdefs.NotFound, "handle %d closed", h))
	}
	if agentClosed == nil {
		return -codeOf(errdefs.Errorf(errdefs.Unavailable, "agent of handle %d closed", h))
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.req().Done():
	case <-t.C:
	case <-closed:
		return -codeOf(errdefs.Errorf(errdefs.NotFound, "handle %d closed", h))
	case <-agentClosed:
		return -codeOf(errdefs.Errorf(errdefs.Unavailable, "agent of handle %d closed", h))
	}
	return C.int(r.req().Poll())
}

// kvfence_failure fills e with why a failed receiver or sender failed and
// returns its code; 0 when it has not failed.
//
//export kvfence_failure
func kvfence_failure(h C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	r, err := lookup[hasReq](uint64(h), "receiver or sender")
	if err != nil {
		return fail(e, err)
	}
	return fail(e, r.req().Err())
}
