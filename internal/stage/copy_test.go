package stage

import (
	"bytes"
	"runtime/debug"
	"syscall"
	"testing"
	"unsafe"
)

// TestHostCopyExact: every run length around the streaming threshold, the
// 64-byte block and the assembly call's piece, at dst misalignments up to
// 65 and src ones up to 16, with 16-, 32- and 64-byte streaming stores, copies
// exactly its bytes: a dropped head or tail, a block too many or a write
// past the run fails here. With 64-byte stores too where the CPU has them.
func TestHostCopyExact(t *testing.T) {
	defer func(a2, a5 bool) { useAVX2, useAVX512 = a2, a5 }(useAVX2, useAVX512)
	for _, w := range [][2]bool{{false, false}, {true, false}, {true, true}} {
		useAVX2, useAVX512 = w[0], w[1]
		hostCopyExact(t)
	}
}

func hostCopyExact(t *testing.T) {
	lens := []int{0, 1, 63, StreamMin - 1, StreamMin, StreamMin + 1, 2048, 2048 + 17, streamPiece + 100, 3*streamPiece + 65}
	const guard = 64
	for _, n := range lens {
		src := make([]byte, n+2*guard)
		for i := range src {
			src[i] = byte(i*7 + i>>8 + 1)
		}
		for da := 0; da <= 65; da += 3 {
			for sa := 0; sa <= 16; sa += 5 {
				dst := make([]byte, n+2*guard)
				var runs []Run
				if n > 0 {
					runs = []Run{{Dst: unsafe.Pointer(&dst[guard+da]), Src: unsafe.Pointer(&src[guard+sa]), N: n}}
				}
				if err := (Host{}).Copy(runs); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(dst[guard+da:guard+da+n], src[guard+sa:guard+sa+n]) {
					t.Fatalf("len %d, dst+%d, src+%d, avx2 %v, avx512 %v: bytes differ", n, da, sa, useAVX2, useAVX512)
				}
				for i, b := range dst {
					if (i < guard+da || i >= guard+da+n) && b != 0 {
						t.Fatalf("len %d, dst+%d, src+%d: byte %d outside the run written", n, da, sa, i-guard-da)
					}
				}
			}
		}
	}
}

// TestStreamFaultIsRecoverable: a streamed run from memory that is not
// readable faults inside the assembly; with SetPanicOnFault (as the C ABI
// copies) that is a panic the caller recovers, not a crash of the process.
func TestStreamFaultIsRecoverable(t *testing.T) {
	mem, err := syscall.Mmap(-1, 0, 2*StreamMin, syscall.PROT_NONE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skip("mmap:", err)
	}
	defer syscall.Munmap(mem)
	dst := make([]byte, 2*StreamMin)
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	faulted := func() (r any) {
		defer func() { r = recover() }()
		_ = (Host{}).Copy([]Run{{Dst: unsafe.Pointer(&dst[0]), Src: unsafe.Pointer(&mem[0]), N: len(dst)}})
		return nil
	}()
	if faulted == nil {
		t.Fatal("a copy from PROT_NONE memory did not fault")
	}
}
