#include "textflag.h"

// func streamCopy(dst, src unsafe.Pointer, n uintptr)
// Copies n bytes (a multiple of 64, dst 16-byte aligned) with
// non-temporal stores: no read-for-ownership of dst's cache lines.
TEXT ·streamCopy(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $6, CX
	JZ   done
loop:
	MOVOU 0(SI), X0
	MOVOU 16(SI), X1
	MOVOU 32(SI), X2
	MOVOU 48(SI), X3
	MOVNTO X0, 0(DI)
	MOVNTO X1, 16(DI)
	MOVNTO X2, 32(DI)
	MOVNTO X3, 48(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ  loop
done:
	RET

// func storeFence()
TEXT ·storeFence(SB), NOSPLIT, $0-0
	SFENCE
	RET

// func prefetchRange(p unsafe.Pointer, n uintptr)
// Asks for every 64-byte line of [p, p+n) in the caches (PREFETCHT0):
// a hint, it never faults.
TEXT ·prefetchRange(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	ADDQ $63, CX
	SHRQ $6, CX
	JZ   pdone
ploop:
	PREFETCHT0 0(SI)
	ADDQ $64, SI
	DECQ CX
	JNZ  ploop
pdone:
	RET

// func streamCopyAVX2(dst, src unsafe.Pointer, n uintptr)
// streamCopy with 32-byte loads and non-temporal stores (dst 32-byte
// aligned, n a multiple of 64).
TEXT ·streamCopyAVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $6, CX
	JZ   vdone
vloop:
	VMOVDQU 0(SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ  vloop
	VZEROUPPER
vdone:
	RET

// func streamCopyAVX512(dst, src unsafe.Pointer, n uintptr)
// streamCopy with one 64-byte load and non-temporal store per block (dst
// 64-byte aligned, n a multiple of 64).
TEXT ·streamCopyAVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $6, CX
	JZ   zdone
zloop:
	VMOVDQU64 0(SI), Z0
	VMOVNTDQ  Z0, 0(DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ  zloop
	VZEROUPPER
zdone:
	RET
