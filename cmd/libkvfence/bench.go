package main

// #include "abi.h"
import "C"

import "time"

// kvfence_poll_go_ns polls a receiver or sender n times from Go itself and
// returns the mean nanoseconds per call (or a negated error code): the
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
	if err != nil || n <= 0 {
		return -C.double(codeOf(err))
	}
	req := r.req()
	start := time.Now()
	for i := C.int64_t(0); i < n; i++ {
		req.Poll()
	}
	return C.double(time.Since(start).Nanoseconds()) / C.double(n)
}
