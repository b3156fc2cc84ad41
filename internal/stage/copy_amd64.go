package stage

import "unsafe"

// streamCopy copies n bytes (a multiple of 64) to a 16-byte aligned dst
// with non-temporal stores (copy_amd64.s).
//
//go:noescape
func streamCopy(dst, src unsafe.Pointer, n uintptr)

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
