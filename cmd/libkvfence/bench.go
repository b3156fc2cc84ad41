package main

// #include "abi.h"
import "C"

import (
	"time"

	"github.com/kvfence/kvfence/errdefs"
)

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

// kvfence_page_bytes_go_ns does what kvfence_page_bytes does (a registry
// lookup, no event loop) n times from Go and returns the mean nanoseconds
// per call: against it, the same call made from C or Python measures the
// crossing itself.
//
//export kvfence_page_bytes_go_ns
func kvfence_page_bytes_go_ns(h C.kvfence_handle, n C.int64_t) (ns C.double) {
	if n <= 0 {
		return -C.double(errdefs.InvalidArgument + 1)
	}
	start := time.Now()
	var sink int64
	for i := C.int64_t(0); i < n; i++ {
		if a, err := lookup[*agentObj](uint64(h), "agent"); err == nil {
			sink += a.pageBytes
		}
	}
	_ = sink
	return C.double(time.Since(start).Nanoseconds()) / C.double(n)
}
