//go:build !purego

#include "textflag.h"

// Value kernel of CodeAccumQ8 (codesvq8.go): 2-bit codes, head_dim 64,
// rows 16 bytes apart, blocks of 16 rows. Per block: w = p·s (the fp16
// scales deinterleaved from params by VPERMT2PS), δ = max|w|/127, w8 =
// round(w/δ) (VCVTPS2DQ, nearest even) packed to int8; cz += δ·w8·z; for
// each group of four rows the 64 code bytes are transposed by VPERMB
// (dword k = byte k of the four rows: channels 4k..4k+3), split into the
// four 2-bit planes, and VPDPBUSD adds code × w8 over the four rows into
// int32 sums per plane (exact), which the block adds to float32 sums as
// δ·sum. Registers: SI p, DX params, BX codes, CX blocks left, DI tmp,
// R8 cz, R9 consts; Z11 127, Z29 the smallest max, Z30 the abs mask,
// Z12/Z14 the z/s indices, Z13 the transpose, Z15 the 2-bit mask;
// Z16–Z19 the float sums (plane order), Z20 the Σ w̃·z lanes, Z21–Z24
// the block's int32 sums, Z25–Z28 the four rows' weights of a group,
// Z31 Σ 0·w (0, or NaN where a weight is NaN or infinite: added to cz so
// that such a weight makes every output NaN).

// GROUP(OFF, ZW): rows OFF/16 .. OFF/16+3 of the block with weights ZW.
#define GROUP(OFF, ZW) \
	VPERMB OFF(BX), Z13, Z1; \
	VPANDD Z15, Z1, Z2; \
	VPDPBUSD ZW, Z2, Z21; \
	VPSRLW $2, Z1, Z3; \
	VPANDD Z15, Z3, Z3; \
	VPDPBUSD ZW, Z3, Z22; \
	VPSRLW $4, Z1, Z2; \
	VPANDD Z15, Z2, Z2; \
	VPDPBUSD ZW, Z2, Z23; \
	VPSRLW $6, Z1, Z3; \
	VPANDD Z15, Z3, Z3; \
	VPDPBUSD ZW, Z3, Z24

// func codeAccumQ8b2C1(tmp, p *float32, params *uint16, codes *byte, n16 int, consts *q8vConstTab, cz *float32)
// Requires n16 ≥ 1.
TEXT ·codeAccumQ8b2C1(SB), NOSPLIT, $0-56
	MOVQ tmp+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ params+16(FP), DX
	MOVQ codes+24(FP), BX
	MOVQ n16+32(FP), CX
	MOVQ consts+40(FP), R9
	MOVQ cz+48(FP), R8
	VMOVDQU64 (R9), Z13
	VMOVDQU32 64(R9), Z14
	VMOVDQU32 128(R9), Z12
	VMOVDQU64 192(R9), Z15
	VBROADCASTSS 256(R9), Z11
	VBROADCASTSS 260(R9), Z29
	VPBROADCASTD 264(R9), Z30
	VPXORD Z16, Z16, Z16
	VPXORD Z17, Z17, Z17
	VPXORD Z18, Z18, Z18
	VPXORD Z19, Z19, Z19
	VPXORD Z20, Z20, Z20
	VPXORD Z31, Z31, Z31

blk:
	VMOVUPS (SI), Z0
	VCVTPH2PS (DX), Z1
	VCVTPH2PS 32(DX), Z2
	VMOVAPS Z1, Z3
	VPERMT2PS Z2, Z14, Z3
	VMOVAPS Z1, Z4
	VPERMT2PS Z2, Z12, Z4
	VMULPS Z3, Z0, Z5
	VMULPS.BCST 268(R9), Z5, Z1
	VADDPS Z1, Z31, Z31
	VPANDD Z30, Z5, Z6
	VEXTRACTF32X8 $1, Z6, Y7
	VMAXPS Y7, Y6, Y6
	VEXTRACTF128 $1, Y6, X7
	VMAXPS X7, X6, X6
	VPERMILPS $0x4E, X6, X7
	VMAXPS X7, X6, X6
	VPERMILPS $0xB1, X6, X7
	VMAXPS X7, X6, X6
	VBROADCASTSS X6, Z6
	VMAXPS Z29, Z6, Z6
	VDIVPS Z6, Z11, Z7
	VDIVPS Z11, Z6, Z6
	VMULPS Z7, Z5, Z8
	VCVTPS2DQ Z8, Z8
	VPMOVSDB Z8, X9
	VCVTDQ2PS Z8, Z8
	VMULPS Z6, Z8, Z8
	VFMADD231PS Z4, Z8, Z20
	VPBROADCASTD X9, Z25
	VPSRLDQ $4, X9, X10
	VPBROADCASTD X10, Z26
	VPSRLDQ $8, X9, X10
	VPBROADCASTD X10, Z27
	VPSRLDQ $12, X9, X10
	VPBROADCASTD X10, Z28
	VPXORD Z21, Z21, Z21
	VPXORD Z22, Z22, Z22
	VPXORD Z23, Z23, Z23
	VPXORD Z24, Z24, Z24
	GROUP(0, Z25)
	GROUP(64, Z26)
	GROUP(128, Z27)
	GROUP(192, Z28)
	VCVTDQ2PS Z21, Z21
	VCVTDQ2PS Z22, Z22
	VCVTDQ2PS Z23, Z23
	VCVTDQ2PS Z24, Z24
	VFMADD231PS Z21, Z6, Z16
	VFMADD231PS Z22, Z6, Z17
	VFMADD231PS Z23, Z6, Z18
	VFMADD231PS Z24, Z6, Z19
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $256, BX
	DECQ CX
	JNZ  blk

	VMOVUPS Z16, (DI)
	VMOVUPS Z17, 64(DI)
	VMOVUPS Z18, 128(DI)
	VMOVUPS Z19, 192(DI)
	VADDPS Z31, Z20, Z20
	VEXTRACTF32X8 $1, Z20, Y1
	VADDPS Y1, Y20, Y20
	VEXTRACTF32X4 $1, Y20, X1
	VADDPS X1, X20, X20
	VPERMILPS $0x4E, X20, X1
	VADDPS X1, X20, X20
	VPERMILPS $0xB1, X20, X1
	VADDPS X1, X20, X20
	VMOVSS X20, (R8)
	VZEROUPPER
	RET
