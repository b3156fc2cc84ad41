package main

// #include "abi.h"
import "C"

import (
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
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	return errorOut(e, codeOf(err), msg)
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
