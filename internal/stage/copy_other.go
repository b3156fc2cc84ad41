//go:build !amd64

package stage

import "unsafe"

func streamCopy(dst, src unsafe.Pointer, n uintptr) {
	copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(src), n))
}

func storeFence() {}

const haveStream = false

func prefetchRange(p unsafe.Pointer, n uintptr) {}

const haveAVX2 = false

func streamCopyAVX2(dst, src unsafe.Pointer, n uintptr) { streamCopy(dst, src, n) }

const haveAVX512 = false

func streamCopyAVX512(dst, src unsafe.Pointer, n uintptr) { streamCopy(dst, src, n) }
