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

// streamCopyAVX512 is streamCopy with 64-byte registers (dst 64-byte
// aligned).
//
//go:noescape
func streamCopyAVX512(dst, src unsafe.Pointer, n uintptr)

// haveAVX2 picks streamCopyAVX2, haveAVX512 streamCopyAVX512: only where
// the CPU also has AVX512-VBMI (Ice Lake, Sapphire Rapids, Zen 4 on), as
// glibc's memmove does not use 64-byte registers on Skylake-SP and Cascade
// Lake either, where they lower the core's clock for the engine's own
// threads too.
var haveAVX2, haveAVX512 = cpu.X86.HasAVX2, cpu.X86.HasAVX512F && cpu.X86.HasAVX512VBMI

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
