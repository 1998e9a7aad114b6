//go:build !purego

#include "textflag.h"

// func dotNT2x4AVX2(a0, a1, b *float64, ldb, n4 int, out *[8]float64)
// Eight dot products of length 4·n4 (n4 ≥ 1): rows a0 and a1 against the
// four rows of b at stride ldb; one YMM accumulator per product, each b
// vector loaded once and used by both rows.
TEXT ·dotNT2x4AVX2(SB), NOSPLIT, $0-48
	MOVQ a0+0(FP), SI
	MOVQ a1+8(FP), DI
	MOVQ b+16(FP), R8
	MOVQ ldb+24(FP), R9
	SHLQ $3, R9
	LEAQ (R8)(R9*1), R10
	LEAQ (R10)(R9*1), R11
	LEAQ (R11)(R9*1), R12
	MOVQ n4+32(FP), CX
	MOVQ out+40(FP), DX
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	VXORPD Y4, Y4, Y4
	VXORPD Y5, Y5, Y5
	VXORPD Y6, Y6, Y6
	VXORPD Y7, Y7, Y7
	XORQ AX, AX

loop:
	VMOVUPD (SI)(AX*1), Y8
	VMOVUPD (DI)(AX*1), Y9
	VMOVUPD (R8)(AX*1), Y10
	VFMADD231PD Y8, Y10, Y0
	VFMADD231PD Y9, Y10, Y4
	VMOVUPD (R10)(AX*1), Y11
	VFMADD231PD Y8, Y11, Y1
	VFMADD231PD Y9, Y11, Y5
	VMOVUPD (R11)(AX*1), Y12
	VFMADD231PD Y8, Y12, Y2
	VFMADD231PD Y9, Y12, Y6
	VMOVUPD (R12)(AX*1), Y13
	VFMADD231PD Y8, Y13, Y3
	VFMADD231PD Y9, Y13, Y7
	ADDQ $32, AX
	DECQ CX
	JNZ  loop

	VEXTRACTF128 $1, Y0, X8
	VADDPD       X8, X0, X0
	VHADDPD      X0, X0, X0
	VMOVSD       X0, 0(DX)
	VEXTRACTF128 $1, Y1, X8
	VADDPD       X8, X1, X1
	VHADDPD      X1, X1, X1
	VMOVSD       X1, 8(DX)
	VEXTRACTF128 $1, Y2, X8
	VADDPD       X8, X2, X2
	VHADDPD      X2, X2, X2
	VMOVSD       X2, 16(DX)
	VEXTRACTF128 $1, Y3, X8
	VADDPD       X8, X3, X3
	VHADDPD      X3, X3, X3
	VMOVSD       X3, 24(DX)
	VEXTRACTF128 $1, Y4, X8
	VADDPD       X8, X4, X4
	VHADDPD      X4, X4, X4
	VMOVSD       X4, 32(DX)
	VEXTRACTF128 $1, Y5, X8
	VADDPD       X8, X5, X5
	VHADDPD      X5, X5, X5
	VMOVSD       X5, 40(DX)
	VEXTRACTF128 $1, Y6, X8
	VADDPD       X8, X6, X6
	VHADDPD      X6, X6, X6
	VMOVSD       X6, 48(DX)
	VEXTRACTF128 $1, Y7, X8
	VADDPD       X8, X7, X7
	VHADDPD      X7, X7, X7
	VMOVSD       X7, 56(DX)
	VZEROUPPER
	RET
