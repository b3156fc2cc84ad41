package main

// #include "abi.h"
import "C"

// kvfence_poll_go_ns polls a receiver or sender n times from Go itself and
// returns the mean nanoseconds per call (or a negated error code; n is
// 1..2^24 and the loop stops after about a second of work): the
// baseline that the C and Python boundary costs are measured against in the
// same run (bindings/c's test and python/tests/test_boundary.py).
//
//export kvfence_poll_go_ns
func kvfence_poll_go_ns(h C.kvfence_handle, n C.int64_t) (ns C.double) {
	defer func() {
		if recover() != nil {
			ns = -C.double(9)
		}
	}()
	r, err := lookup[hasReq](uint64(h), "receiver or sender")
	if err == nil {
		err = timingCount(n)
	}
	if err != nil {
		return -C.double(codeOf(err))
	}
	req := r.req()
	return timed(int64(n), func() { req.Poll() })
}

// kvfence_page_bytes_go_ns does what kvfence_page_bytes does (a registry
// lookup, no event loop) n times from Go and returns the mean nanoseconds
// per call (n and the work bounded as for kvfence_poll_go_ns): against
// it, the same call made from C or Python measures the crossing itself.
//
//export kvfence_page_bytes_go_ns
func kvfence_page_bytes_go_ns(h C.kvfence_handle, n C.int64_t) (ns C.double) {
	if err := timingCount(n); err != nil {
		return -C.double(codeOf(err))
	}
	var sink int64
	ns = timed(int64(n), func() {
		if a, err := lookup[*agentObj](uint64(h), "agent"); err == nil {
			sink += a.pageBytes
		}
	})
	_ = sink
	return ns
}
