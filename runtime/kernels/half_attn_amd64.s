//go:build !purego

#include "textflag.h"

// func halfScoresAVX2(q *float32, k *uint16, ldk, n, hd int, s *float32)
// s[j] = Σ_{d<hd} q[d]·k[j·ldk + d] with k binary16 widened by VCVTPH2PS:
// four rows of k per pass (one 8-lane accumulator each, the 8-wide d
// steps in order, q loaded once for the four), then the rows left one at
// a time; every accumulator is reduced ((l0+l1)+(l2+l3)) +
// ((l4+l5)+(l6+l7)). n ≥ 1, hd ≥ 8 a multiple of 8.
TEXT ·halfScoresAVX2(SB), NOSPLIT, $0-48
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), BX
	MOVQ ldk+16(FP), R11
	SHLQ $1, R11
	MOVQ n+24(FP), CX
	MOVQ hd+32(FP), DX
	MOVQ s+40(FP), DI
	CMPQ CX, $4
	JLT  scTail

scRow4:
	LEAQ (BX)(R11*1), R12
	LEAQ (BX)(R11*2), R13
	LEAQ (R13)(R11*1), R14
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	XORQ AX, AX

scLoop4:
	VMOVUPS (SI)(AX*4), Y0
	VCVTPH2PS (BX)(AX*2), Y5
	VCVTPH2PS (R12)(AX*2), Y6
	VCVTPH2PS (R13)(AX*2), Y7
	VCVTPH2PS (R14)(AX*2), Y8
	VFMADD231PS Y5, Y0, Y1
	VFMADD231PS Y6, Y0, Y2
	VFMADD231PS Y7, Y0, Y3
	VFMADD231PS Y8, Y0, Y4
	ADDQ $8, AX
	CMPQ AX, DX
	JLT  scLoop4

	// [r0 r1 r2 r3] in X1: lane pairs, then quads, then the two halves.
	VHADDPS Y2, Y1, Y1
	VHADDPS Y4, Y3, Y3
	VHADDPS Y3, Y1, Y1
	VEXTRACTF128 $1, Y1, X2
	VADDPS X2, X1, X1
	VMOVUPS X1, (DI)
	ADDQ $16, DI
	LEAQ (BX)(R11*4), BX
	SUBQ $4, CX
	CMPQ CX, $4
	JGE  scRow4

scTail:
	TESTQ CX, CX
	JZ    scDone

scRow1:
	VXORPS Y1, Y1, Y1
	XORQ AX, AX

scLoop1:
	VMOVUPS (SI)(AX*4), Y0
	VCVTPH2PS (BX)(AX*2), Y5
	VFMADD231PS Y5, Y0, Y1
	ADDQ $8, AX
	CMPQ AX, DX
	JLT  scLoop1

	VHADDPS Y1, Y1, Y1
	VHADDPS Y1, Y1, Y1
	VEXTRACTF128 $1, Y1, X2
	VADDSS X2, X1, X1
	VMOVSS X1, (DI)
	ADDQ $4, DI
	ADDQ R11, BX
	DECQ CX
	JNZ  scRow1

scDone:
	VZEROUPPER
	RET

// func halfAccumAVX2(p *float32, v *uint16, ldv, n, hd int, out *float32)
// out[d] += Σ_{j<n} p[j]·v[j·ldv + d] with v binary16 widened by
// VCVTPH2PS: 64 columns of out in eight accumulators over the n rows (one
// VFMADD231PS per row and 8 columns, in order of j), then the columns
// left 8 at a time. n ≥ 1, hd ≥ 8 a multiple of 8.
TEXT ·halfAccumAVX2(SB), NOSPLIT, $0-48
	MOVQ v+8(FP), R10
	MOVQ ldv+16(FP), R11
	SHLQ $1, R11
	MOVQ hd+32(FP), DX
	MOVQ out+40(FP), DI
	XORQ AX, AX

acCol64:
	MOVQ DX, R8
	SUBQ AX, R8
	CMPQ R8, $64
	JLT  acCol8
	LEAQ (DI)(AX*4), R9
	VMOVUPS (R9), Y1
	VMOVUPS 32(R9), Y2
	VMOVUPS 64(R9), Y3
	VMOVUPS 96(R9), Y4
	VMOVUPS 128(R9), Y5
	VMOVUPS 160(R9), Y6
	VMOVUPS 192(R9), Y7
	VMOVUPS 224(R9), Y8
	MOVQ p+0(FP), SI
	LEAQ (R10)(AX*2), BX
	MOVQ n+24(FP), CX

acLoop64:
	VBROADCASTSS (SI), Y0
	VCVTPH2PS (BX), Y9
	VCVTPH2PS 16(BX), Y10
	VFMADD231PS Y9, Y0, Y1
	VFMADD231PS Y10, Y0, Y2
	VCVTPH2PS 32(BX), Y11
	VCVTPH2PS 48(BX), Y12
	VFMADD231PS Y11, Y0, Y3
	VFMADD231PS Y12, Y0, Y4
	VCVTPH2PS 64(BX), Y9
	VCVTPH2PS 80(BX), Y10
	VFMADD231PS Y9, Y0, Y5
	VFMADD231PS Y10, Y0, Y6
	VCVTPH2PS 96(BX), Y11
	VCVTPH2PS 112(BX), Y12
	VFMADD231PS Y11, Y0, Y7
	VFMADD231PS Y12, Y0, Y8
	ADDQ $4, SI
	ADDQ R11, BX
	DECQ CX
	JNZ  acLoop64

	VMOVUPS Y1, (R9)
	VMOVUPS Y2, 32(R9)
	VMOVUPS Y3, 64(R9)
	VMOVUPS Y4, 96(R9)
	VMOVUPS Y5, 128(R9)
	VMOVUPS Y6, 160(R9)
	VMOVUPS Y7, 192(R9)
	VMOVUPS Y8, 224(R9)
	ADDQ $64, AX
	JMP  acCol64

acCol8:
	CMPQ AX, DX
	JGE  acDone
	VMOVUPS (DI)(AX*4), Y1
	MOVQ p+0(FP), SI
	LEAQ (R10)(AX*2), BX
	MOVQ n+24(FP), CX

acLoop8:
	VBROADCASTSS (SI), Y0
	VCVTPH2PS (BX), Y9
	VFMADD231PS Y9, Y0, Y1
	ADDQ $4, SI
	ADDQ R11, BX
	DECQ CX
	JNZ  acLoop8

	VMOVUPS Y1, (DI)(AX*4)
	ADDQ $8, AX
	JMP  acCol8

acDone:
	VZEROUPPER
	RET

// func halfScores4AVX2(q *float32, ldq int, k *uint16, ldk, n, hd int, s *float32, lds int)
// halfScoresAVX2 for four query rows (q + i·ldq, s + i·lds, i < 4) and
// two rows of k at a time: each 8-wide chunk of k is widened once for the
// four rows, and every output is summed and reduced exactly as
// halfScoresAVX2 sums it (the same bits). n ≥ 2 even, hd ≥ 8 a multiple
// of 8.
TEXT ·halfScores4AVX2(SB), NOSPLIT, $0-64
	MOVQ q+0(FP), SI
	MOVQ ldq+8(FP), R8
	SHLQ $2, R8
	LEAQ (SI)(R8*2), R10
	LEAQ (R10)(R8*1), R13
	ADDQ SI, R8
	MOVQ k+16(FP), BX
	MOVQ ldk+24(FP), R11
	SHLQ $1, R11
	MOVQ n+32(FP), CX
	MOVQ hd+40(FP), DX
	MOVQ s+48(FP), DI
	MOVQ lds+56(FP), R9
	SHLQ $2, R9

s4Pair:
	LEAQ (BX)(R11*1), R12
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	XORQ AX, AX

s4Loop:
	VMOVUPS (SI)(AX*4), Y0
	VMOVUPS (R8)(AX*4), Y1
	VMOVUPS (R10)(AX*4), Y2
	VMOVUPS (R13)(AX*4), Y3
	VCVTPH2PS (BX)(AX*2), Y4
	VCVTPH2PS (R12)(AX*2), Y5
	VFMADD231PS Y4, Y0, Y6
	VFMADD231PS Y5, Y0, Y7
	VFMADD231PS Y4, Y1, Y8
	VFMADD231PS Y5, Y1, Y9
	VFMADD231PS Y4, Y2, Y10
	VFMADD231PS Y5, Y2, Y11
	VFMADD231PS Y4, Y3, Y12
	VFMADD231PS Y5, Y3, Y13
	ADDQ $8, AX
	CMPQ AX, DX
	JLT  s4Loop

	// [s0j s0j' s1j s1j'] in X6, [s2j s2j' s3j s3j'] in X10.
	VHADDPS Y7, Y6, Y6
	VHADDPS Y9, Y8, Y8
	VHADDPS Y8, Y6, Y6
	VEXTRACTF128 $1, Y6, X7
	VADDPS X7, X6, X6
	VHADDPS Y11, Y10, Y10
	VHADDPS Y13, Y12, Y12
	VHADDPS Y12, Y10, Y10
	VEXTRACTF128 $1, Y10, X11
	VADDPS X11, X10, X10
	VMOVSD X6, (DI)
	VMOVHPS X6, (DI)(R9*1)
	VMOVSD X10, (DI)(R9*2)
	LEAQ (DI)(R9*2), R14
	VMOVHPS X10, (R14)(R9*1)
	ADDQ $8, DI
	LEAQ (BX)(R11*2), BX
	SUBQ $2, CX
	JNZ  s4Pair

	VZEROUPPER
	RET

// func halfAccum4AVX2(p *float32, ldp int, v *uint16, ldv, n, hd int, out *float32, ldo int)
// halfAccumAVX2 for four rows (p + i·ldp, out + i·ldo, i < 4), 16
// columns at a time: each 8-wide chunk of a row of v is widened once for
// the four rows, and every output adds the same fused products in the
// same order as halfAccumAVX2 (the same bits). n ≥ 1, hd ≥ 16 a multiple
// of 16.
TEXT ·halfAccum4AVX2(SB), NOSPLIT, $0-64
	MOVQ p+0(FP), SI
	MOVQ ldp+8(FP), R8
	SHLQ $2, R8
	LEAQ (SI)(R8*2), R10
	LEAQ (R10)(R8*1), R13
	ADDQ SI, R8
	MOVQ v+16(FP), R14
	MOVQ ldv+24(FP), R11
	SHLQ $1, R11
	MOVQ hd+40(FP), DX
	MOVQ out+48(FP), DI
	MOVQ ldo+56(FP), R9
	SHLQ $2, R9
	XORQ R12, R12

a4Col:
	LEAQ (DI)(R12*4), CX
	VMOVUPS (CX), Y6
	VMOVUPS 32(CX), Y7
	VMOVUPS (CX)(R9*1), Y8
	VMOVUPS 32(CX)(R9*1), Y9
	VMOVUPS (CX)(R9*2), Y10
	VMOVUPS 32(CX)(R9*2), Y11
	ADDQ R9, CX
	VMOVUPS (CX)(R9*2), Y12
	VMOVUPS 32(CX)(R9*2), Y13
	LEAQ (R14)(R12*2), BX
	XORQ AX, AX

a4Row:
	VCVTPH2PS (BX), Y4
	VCVTPH2PS 16(BX), Y5
	VBROADCASTSS (SI)(AX*4), Y0
	VBROADCASTSS (R8)(AX*4), Y1
	VBROADCASTSS (R10)(AX*4), Y2
	VBROADCASTSS (R13)(AX*4), Y3
	VFMADD231PS Y4, Y0, Y6
	VFMADD231PS Y5, Y0, Y7
	VFMADD231PS Y4, Y1, Y8
	VFMADD231PS Y5, Y1, Y9
	VFMADD231PS Y4, Y2, Y10
	VFMADD231PS Y5, Y2, Y11
	VFMADD231PS Y4, Y3, Y12
	VFMADD231PS Y5, Y3, Y13
	ADDQ R11, BX
	INCQ AX
	CMPQ AX, n+32(FP)
	JLT  a4Row

	LEAQ (DI)(R12*4), CX
	VMOVUPS Y6, (CX)
	VMOVUPS Y7, 32(CX)
	VMOVUPS Y8, (CX)(R9*1)
	VMOVUPS Y9, 32(CX)(R9*1)
	VMOVUPS Y10, (CX)(R9*2)
	VMOVUPS Y11, 32(CX)(R9*2)
	ADDQ R9, CX
	VMOVUPS Y12, (CX)(R9*2)
	VMOVUPS Y13, 32(CX)(R9*2)
	ADDQ $16, R12
	CMPQ R12, DX
	JLT  a4Col

	VZEROUPPER
	RET
