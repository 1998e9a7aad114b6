//go:build !purego

#include "textflag.h"

// Integer dot products of one packed weight row with one int8 activation
// row (qdot8.go, DotQ8Rows). Arguments of every kernel:
//   xq     int8 activations [ng·bpg·32]
//   xs     block scales S [ng·bpg], xsum S·ΣQ per block [ng·bpg]
//   src    the row's packed codes (8-bit: 32 bytes, 4-bit: 16 bytes a block)
//   scales, zeros  float16 per group (zeros nil: zsym for every group)
//   ng >= 1 groups of bpg >= 1 blocks of 32 codes
// Per block the 32 code·Q products are summed exactly into eight int32
// lanes, converted to float32 and multiplied by s_g·S_b into a vector
// accumulator (FMA); per group the zero term s_g·z_g·Σ_b xsum_b is
// accumulated in a scalar; the result is the horizontal sum minus it.
// Registers: DI xq, R12 xs, R13 xsum, SI src, R8 scales, R9 zeros,
// R10 groups left, R11 bpg, CX blocks left; X0 s_g, X1 z_g, X2 zoff,
// X7 Σ xsum of the group, Y12 total, X13 zero term, Y14 int16 ones,
// Y15 the byte constant.

// 8-bit codes, AVX2: c − 128 as signed bytes (so zsym and the zeros come
// shifted by zoff = 128), |c−128| times Q·sign(c−128) by vpmaddubsw
// (pairs ≤ 2·128·127, no saturation), vpmaddwd into int32.
// func dotQ8x8AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32) float32
TEXT ·dotQ8x8AVX2(SB), NOSPLIT, $0-76
	MOVQ xq+0(FP), DI
	MOVQ xs+8(FP), R12
	MOVQ xsum+16(FP), R13
	MOVQ src+24(FP), SI
	MOVQ scales+32(FP), R8
	MOVQ zeros+40(FP), R9
	MOVQ ng+48(FP), R10
	MOVQ bpg+56(FP), R11
	MOVSS zsym+64(FP), X1
	MOVSS zoff+68(FP), X2
	MOVL $0x80, AX
	VMOVD AX, X15
	VPBROADCASTB X15, Y15
	VPCMPEQW Y14, Y14, Y14
	VPSRLW $15, Y14, Y14
	VXORPS Y12, Y12, Y12
	VXORPS X13, X13, X13

dotQ8x8AVX2_group:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   dotQ8x8AVX2_blocks
	MOVWLZX (R9), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	VSUBSS X2, X1, X1
	ADDQ $2, R9

dotQ8x8AVX2_blocks:
	MOVQ R11, CX
	VXORPS X7, X7, X7

dotQ8x8AVX2_block:
	VMOVDQU (SI), Y4
	VPXOR Y15, Y4, Y4
	VMOVDQU (DI), Y5
	VPSIGNB Y4, Y4, Y3
	VPSIGNB Y4, Y5, Y5
	VPMADDUBSW Y5, Y3, Y3
	VPMADDWD Y14, Y3, Y3
	VCVTDQ2PS Y3, Y3
	VMULSS (R12), X0, X6
	VBROADCASTSS X6, Y6
	VFMADD231PS Y6, Y3, Y12
	VADDSS (R13), X7, X7
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ $32, DI
	ADDQ $32, SI
	DECQ CX
	JNZ  dotQ8x8AVX2_block

	VMULSS X1, X7, X7
	VFMADD231SS X0, X7, X13
	DECQ R10
	JNZ  dotQ8x8AVX2_group

	VEXTRACTF128 $1, Y12, X3
	VADDPS X3, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VSUBSS X13, X12, X12
	VZEROUPPER
	MOVSS X12, ret+72(FP)
	RET

// 8-bit codes, AVX-512 VNNI (VL): vpdpbusd of the unsigned codes and Q.
// func dotQ8x8VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym float32) float32
TEXT ·dotQ8x8VNNI(SB), NOSPLIT, $0-76
	MOVQ xq+0(FP), DI
	MOVQ xs+8(FP), R12
	MOVQ xsum+16(FP), R13
	MOVQ src+24(FP), SI
	MOVQ scales+32(FP), R8
	MOVQ zeros+40(FP), R9
	MOVQ ng+48(FP), R10
	MOVQ bpg+56(FP), R11
	MOVSS zsym+64(FP), X1
	MOVL $0x80, AX
	VMOVD AX, X15
	VPBROADCASTB X15, Y15
	VPCMPEQW Y14, Y14, Y14
	VPSRLW $15, Y14, Y14
	VXORPS Y12, Y12, Y12
	VXORPS X13, X13, X13

dotQ8x8VNNI_group:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   dotQ8x8VNNI_blocks
	MOVWLZX (R9), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	ADDQ $2, R9

dotQ8x8VNNI_blocks:
	MOVQ R11, CX
	VXORPS X7, X7, X7

dotQ8x8VNNI_block:
	VMOVDQU (SI), Y4
	VPXOR Y3, Y3, Y3
	VPDPBUSD (DI), Y4, Y3
	VCVTDQ2PS Y3, Y3
	VMULSS (R12), X0, X6
	VBROADCASTSS X6, Y6
	VFMADD231PS Y6, Y3, Y12
	VADDSS (R13), X7, X7
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ $32, DI
	ADDQ $32, SI
	DECQ CX
	JNZ  dotQ8x8VNNI_block

	VMULSS X1, X7, X7
	VFMADD231SS X0, X7, X13
	DECQ R10
	JNZ  dotQ8x8VNNI_group

	VEXTRACTF128 $1, Y12, X3
	VADDPS X3, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VSUBSS X13, X12, X12
	VZEROUPPER
	MOVSS X12, ret+72(FP)
	RET

// 4-bit codes, AVX2: 16 bytes split into nibbles and re-interleaved in
// code order, vpmaddubsw with Q (pairs ≤ 2·15·127), vpmaddwd into int32.
// func dotQ8x4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym float32) float32
TEXT ·dotQ8x4AVX2(SB), NOSPLIT, $0-76
	MOVQ xq+0(FP), DI
	MOVQ xs+8(FP), R12
	MOVQ xsum+16(FP), R13
	MOVQ src+24(FP), SI
	MOVQ scales+32(FP), R8
	MOVQ zeros+40(FP), R9
	MOVQ ng+48(FP), R10
	MOVQ bpg+56(FP), R11
	MOVSS zsym+64(FP), X1
	MOVL $0x0f, AX
	VMOVD AX, X15
	VPBROADCASTB X15, Y15
	VPCMPEQW Y14, Y14, Y14
	VPSRLW $15, Y14, Y14
	VXORPS Y12, Y12, Y12
	VXORPS X13, X13, X13

dotQ8x4AVX2_group:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   dotQ8x4AVX2_blocks
	MOVWLZX (R9), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	ADDQ $2, R9

dotQ8x4AVX2_blocks:
	MOVQ R11, CX
	VXORPS X7, X7, X7

dotQ8x4AVX2_block:
	VMOVDQU (SI), X4
	VPSRLW $4, X4, X5
	VPAND X15, X4, X4
	VPAND X15, X5, X5
	VPUNPCKLBW X5, X4, X3
	VPUNPCKHBW X5, X4, X6
	VINSERTI128 $1, X6, Y3, Y4
	VPMADDUBSW (DI), Y4, Y3
	VPMADDWD Y14, Y3, Y3
	VCVTDQ2PS Y3, Y3
	VMULSS (R12), X0, X6
	VBROADCASTSS X6, Y6
	VFMADD231PS Y6, Y3, Y12
	VADDSS (R13), X7, X7
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ $32, DI
	ADDQ $16, SI
	DECQ CX
	JNZ  dotQ8x4AVX2_block

	VMULSS X1, X7, X7
	VFMADD231SS X0, X7, X13
	DECQ R10
	JNZ  dotQ8x4AVX2_group

	VEXTRACTF128 $1, Y12, X3
	VADDPS X3, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VSUBSS X13, X12, X12
	VZEROUPPER
	MOVSS X12, ret+72(FP)
	RET

// 4-bit codes, AVX-512 VNNI (VL): the nibbles as for dotQ8x4AVX2, vpdpbusd.
// func dotQ8x4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym float32) float32
TEXT ·dotQ8x4VNNI(SB), NOSPLIT, $0-76
	MOVQ xq+0(FP), DI
	MOVQ xs+8(FP), R12
	MOVQ xsum+16(FP), R13
	MOVQ src+24(FP), SI
	MOVQ scales+32(FP), R8
	MOVQ zeros+40(FP), R9
	MOVQ ng+48(FP), R10
	MOVQ bpg+56(FP), R11
	MOVSS zsym+64(FP), X1
	MOVL $0x0f, AX
	VMOVD AX, X15
	VPBROADCASTB X15, Y15
	VPCMPEQW Y14, Y14, Y14
	VPSRLW $15, Y14, Y14
	VXORPS Y12, Y12, Y12
	VXORPS X13, X13, X13

dotQ8x4VNNI_group:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   dotQ8x4VNNI_blocks
	MOVWLZX (R9), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	ADDQ $2, R9

dotQ8x4VNNI_blocks:
	MOVQ R11, CX
	VXORPS X7, X7, X7

dotQ8x4VNNI_block:
	VMOVDQU (SI), X4
	VPSRLW $4, X4, X5
	VPAND X15, X4, X4
	VPAND X15, X5, X5
	VPUNPCKLBW X5, X4, X3
	VPUNPCKHBW X5, X4, X6
	VINSERTI128 $1, X6, Y3, Y4
	VPXOR Y3, Y3, Y3
	VPDPBUSD (DI), Y4, Y3
	VCVTDQ2PS Y3, Y3
	VMULSS (R12), X0, X6
	VBROADCASTSS X6, Y6
	VFMADD231PS Y6, Y3, Y12
	VADDSS (R13), X7, X7
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ $32, DI
	ADDQ $16, SI
	DECQ CX
	JNZ  dotQ8x4VNNI_block

	VMULSS X1, X7, X7
	VFMADD231SS X0, X7, X13
	DECQ R10
	JNZ  dotQ8x4VNNI_group

	VEXTRACTF128 $1, Y12, X3
	VADDPS X3, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VSUBSS X13, X12, X12
	VZEROUPPER
	MOVSS X12, ret+72(FP)
	RET
