package main

// #include "abi.h"
import "C"

import (
	"bytes"
	"encoding/json"
	"time"
	"unsafe"

	"github.com/prometheus/common/expfmt"

	"github.com/kvfence/kvfence/core"
	"github.com/kvfence/kvfence/errdefs"
)

// kvfence_decode_open starts a decode rank (config: a JSON object, see
// config.go) with its transport plugin and control plane.
//
//export kvfence_decode_open
func kvfence_decode_open(config *C.char, out *C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	return openAgent(config, out, e, openDecode)
}

// kvfence_prefill_open starts a prefill rank that links to the decode rank
// named in its config.
//
//export kvfence_prefill_open
func kvfence_prefill_open(config *C.char, out *C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	return openAgent(config, out, e, openPrefill)
}

func openAgent(config *C.char, out *C.kvfence_handle, e *C.kvfence_error, open func(string) (*agentObj, error)) C.int {
	text, err := goString("config", config, maxConfigBytes)
	if err == nil {
		err = setHandle(out, 0) // out must be writable before a rank starts
	}
	if err != nil {
		return fail(e, err)
	}
	a, err := open(text)
	if err != nil {
		return fail(e, err)
	}
	return fail(e, setHandle(out, register(a)))
}

// kvfence_close closes any handle. An agent stops (exposed memory is not
// released by it: a restarted rank quarantines it; decode's host landing
// pages, direct_host_pages, are unmapped once its plugin process is
// closed and nothing can write them); a receiver or sender
// handle is dropped (SGLang's clear: a hold is never dropped with it).
//
//export kvfence_close
func kvfence_close(h C.kvfence_handle, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	settleJobs(uint64(h)) // no staging copy outlives its handle
	v, ok := unregister(uint64(h))
	if !ok {
		return fail(e, errdefs.Errorf(errdefs.NotFound, "no object with handle %d", h))
	}
	switch o := v.(type) {
	case *agentObj:
		o.close()
	case *receiverObj:
		// SGLang's receiver clear(): dropping the handle releases nothing;
		// the hold stays in the agent until drained, fenced or timeout.
	case *senderObj:
		o.s.Close()
	}
	return fail(e, nil)
}

// kvfence_agent_addr writes the rank's control address (decode: where
// prefill ranks connect) into buf.
//
//export kvfence_agent_addr
func kvfence_agent_addr(h C.kvfence_handle, buf *C.char, size C.size_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	a, err := lookup[*agentObj](uint64(h), "agent")
	if err != nil {
		return fail(e, err)
	}
	addr := ""
	if a.dec != nil {
		addr = a.dec.Addr()
	} else {
		addr = a.pre.Addr()
	}
	return fail(e, copyOut([]byte(addr), buf, size, nil))
}

// kvfence_prefill_linked is 1 once the prefill rank's link to decode is up,
// 0 while not, or a negated error code.
//
//export kvfence_prefill_linked
func kvfence_prefill_linked(h C.kvfence_handle) (code C.int) {
	defer guard(nil, &code)
	a, err := lookup[*agentObj](uint64(h), "agent")
	if err == nil && a.pre == nil {
		err = invalid("handle %d is a decode rank", h)
	}
	if err != nil {
		return -codeOf(err)
	}
	if a.pre.Linked() {
		return 1
	}
	return 0
}

// kvfence_prefill_quiesce asks decode whether this prefill rank's idle link
// may close (the close handshake, agent/link_quiesce.go): 1 when decode
// agreed and no Assign is held here (the caller then closes the agent or
// calls kvfence_prefill_resume), 0 when busy or unanswered within
// timeout_ms, or a negated error code.
//
//export kvfence_prefill_quiesce
func kvfence_prefill_quiesce(h C.kvfence_handle, timeoutMs C.int64_t) (code C.int) {
	defer guard(nil, &code)
	a, err := prefillAgent(h)
	if err != nil {
		return -codeOf(err)
	}
	if a.pre.QuiesceLink(time.Duration(timeoutMs) * time.Millisecond) {
		return 1
	}
	return 0
}

// kvfence_prefill_resume undoes an agreed kvfence_prefill_quiesce: decode
// may expose requests to this rank again. 0 or a negated error code.
//
//export kvfence_prefill_resume
func kvfence_prefill_resume(h C.kvfence_handle) (code C.int) {
	defer guard(nil, &code)
	a, err := prefillAgent(h)
	if err != nil {
		return -codeOf(err)
	}
	a.pre.ResumeLink()
	return 0
}

func prefillAgent(h C.kvfence_handle) (*agentObj, error) {
	a, err := lookup[*agentObj](uint64(h), "agent")
	if err == nil && a.pre == nil {
		err = invalid("handle %d is a decode rank", h)
	}
	return a, err
}

// kvfence_agent_metrics writes the rank's Prometheus metrics (text
// exposition format) into buf; *needed (when not NULL) gets the length.
// A buffer too small is RESOURCE_EXHAUSTED.
//
//export kvfence_agent_metrics
func kvfence_agent_metrics(h C.kvfence_handle, buf *C.char, size C.size_t, needed *C.size_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	a, err := lookup[*agentObj](uint64(h), "agent")
	if err != nil {
		return fail(e, err)
	}
	fams, err := a.metrics().Registry.Gather()
	if err != nil {
		return fail(e, errdefs.Errorf(errdefs.Internal, "gather metrics: %v", err))
	}
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return fail(e, errdefs.Errorf(errdefs.Internal, "encode metrics: %v", err))
		}
	}
	return fail(e, copyOut(b.Bytes(), buf, size, needed))
}

// kvfence_agent_stats writes the rank's figures as JSON: decode's
// agent.DecodeStats (release paths, hold durations, corrupt pages) or
// prefill's core.SenderMetrics.
//
//export kvfence_agent_stats
func kvfence_agent_stats(h C.kvfence_handle, buf *C.char, size C.size_t, needed *C.size_t, e *C.kvfence_error) (code C.int) {
	defer guard(e, &code)
	a, err := lookup[*agentObj](uint64(h), "agent")
	if err != nil {
		return fail(e, err)
	}
	var v any
	if a.dec != nil {
		v = a.dec.Stats()
	} else {
		v = a.pre.Stats()
	}
	js, err := json.Marshal(v)
	if err != nil {
		return fail(e, errdefs.Errorf(errdefs.Internal, "stats: %v", err))
	}
	return fail(e, copyOut(js, buf, size, needed))
}

// copyOut copies b and a NUL into C memory of size bytes; *needed (when not
// NULL) gets len(b)+1 either way.
func copyOut(b []byte, buf *C.char, size C.size_t, needed *C.size_t) error {
	if needed != nil {
		if err := touch("needed", func() { *needed = C.size_t(len(b) + 1) }); err != nil {
			return err
		}
	}
	if buf == nil || uint64(size) < uint64(len(b)+1) {
		return errdefs.Errorf(errdefs.ResourceExhausted, "buffer of %d bytes, %d needed", uint64(size), len(b)+1)
	}
	return touch("buf", func() {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(b)+1)
		copy(dst, b)
		dst[len(b)] = 0
	})
}

// kvfence_decode_linked is 1 while prefill rank's control link to this
// decode rank is up, 0 while not, or a negated error code. A request
// exposed before its ranks are linked fails (their Assign is lost).
//
//export kvfence_decode_linked
func kvfence_decode_linked(h C.kvfence_handle, rank C.uint32_t) (code C.int) {
	defer guard(nil, &code)
	a, err := lookup[*agentObj](uint64(h), "agent")
	if err == nil && a.dec == nil {
		err = invalid("handle %d is a prefill rank", h)
	}
	if err != nil {
		return -codeOf(err)
	}
	if a.dec.Linked(core.RankID(rank)) {
		return 1
	}
	return 0
}
