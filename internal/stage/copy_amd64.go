package stage

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// streamCopy copies n bytes (a multiple of 64) to a 16-byte aligned dst
// with non-temporal stores (copy_amd64.s).
//
//go:noescape
func streamCopy(dst, src unsafe.Pointer, n uintptr)

// streamCopyAVX2 is streamCopy with 32-byte registers (dst 32-byte
// aligned).
//
//go:noescape
func streamCopyAVX2(dst, src unsafe.Pointer, n uintptr)

// haveAVX2 picks streamCopyAVX2.
var haveAVX2 = cpu.X86.HasAVX2

// storeFence orders the non-temporal stores before any later store (the
// channel or lock that hands the pages to another thread).
//
//go:noescape
func storeFence()

const haveStream = true

// prefetchRange hints every cache line of [p, p+n) into the caches.
//
//go:noescape
func prefetchRange(p unsafe.Pointer, n uintptr)
