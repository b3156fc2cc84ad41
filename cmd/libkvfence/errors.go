package main

// #include "abi.h"
import "C"

import (
	"unsafe"

	"github.com/kvfence/kvfence/errdefs"
)

// codeOf is the C code of err: its errdefs class plus one, 0 for nil.
func codeOf(err error) C.int {
	if err == nil {
		return 0
	}
	return C.int(errdefs.ClassOf(err)) + 1
}

// fail fills e (when not NULL) with err's code and message and returns the
// code. A nil err clears e.
func fail(e *C.kvfence_error, err error) C.int {
	code := codeOf(err)
	if e == nil {
		return code
	}
	e.code = C.int32_t(code)
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&e.message[0])), len(e.message))
	n := copy(buf[:len(buf)-1], msg)
	buf[n] = 0
	return code
}

// guard turns a panic in an exported call into an Internal error: a Go
// panic must never unwind into C.
func guard(e *C.kvfence_error, code *C.int) {
	if r := recover(); r != nil {
		*code = fail(e, errdefs.Errorf(errdefs.Internal, "kvfence: panic: %v", r))
	}
}

func invalid(format string, args ...any) error {
	return errdefs.Errorf(errdefs.InvalidArgument, format, args...)
}
