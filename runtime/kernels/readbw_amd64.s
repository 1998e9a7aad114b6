//go:build !purego

#include "textflag.h"

// func streamReadAVX2(p *byte, n int) uint64
// ORs the n bytes at p (n a multiple of 256, n ≥ 256) as 32-byte words
// into two ymm accumulators, eight loads per 256 bytes and nothing else:
// the read-bandwidth ceiling of one core that BenchmarkGEMVDRAM compares
// the GEMVs with. Returns the low 64 bits of the OR so that the loads
// have a use.
TEXT ·streamReadAVX2(SB), NOSPLIT, $0-24
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	SHRQ $8, CX
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1

readLoop:
	VPOR (SI), Y0, Y0
	VPOR 32(SI), Y1, Y1
	VPOR 64(SI), Y0, Y0
	VPOR 96(SI), Y1, Y1
	VPOR 128(SI), Y0, Y0
	VPOR 160(SI), Y1, Y1
	VPOR 192(SI), Y0, Y0
	VPOR 224(SI), Y1, Y1
	ADDQ $256, SI
	DECQ CX
	JNZ  readLoop
	VPOR Y1, Y0, Y0
	VMOVQ X0, AX
	MOVQ AX, ret+16(FP)
	VZEROUPPER
	RET
