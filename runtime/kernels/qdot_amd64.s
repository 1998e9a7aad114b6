//go:build !purego

#include "textflag.h"

// func dotU4RowAVX2(x *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32) float32
// ng >= 1 groups of group codes (a multiple of 16). Per group, 16 codes
// per step are decoded as in dequantU4RowAVX2, the zero-point subtracted,
// and multiplied into two float32 accumulators with x (FMA); at the end of
// the group their sum is scaled by s_g into the total (FMA), which is
// reduced horizontally once at the end.
TEXT ·dotU4RowAVX2(SB), NOSPLIT, $0-60
	MOVQ x+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ scales+16(FP), R8
	MOVQ zeros+24(FP), R9
	MOVQ ng+32(FP), R10
	MOVQ group+40(FP), R11
	VBROADCASTSS zsym+48(FP), Y1
	VPCMPEQD Y2, Y2, Y2
	VPSRLD $28, Y2, Y2
	VXORPS Y12, Y12, Y12

qgroup:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	VBROADCASTSS X0, Y0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   qcodes
	MOVWLZX (R9), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	VBROADCASTSS X1, Y1
	ADDQ $2, R9

qcodes:
	MOVQ R11, CX
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14

qloop:
	VPMOVZXBD (SI), Y3
	VPAND Y2, Y3, Y4
	VPSRLD $4, Y3, Y5
	VPUNPCKLDQ Y5, Y4, Y6
	VPUNPCKHDQ Y5, Y4, Y7
	VPERM2I128 $0x20, Y7, Y6, Y8
	VPERM2I128 $0x31, Y7, Y6, Y9
	VCVTDQ2PS Y8, Y8
	VCVTDQ2PS Y9, Y9
	VSUBPS Y1, Y8, Y8
	VSUBPS Y1, Y9, Y9
	VFMADD231PS (DI), Y8, Y13
	VFMADD231PS 32(DI), Y9, Y14
	ADDQ $8, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ  qloop

	VADDPS Y14, Y13, Y13
	VFMADD231PS Y0, Y13, Y12
	DECQ R10
	JNZ  qgroup

	VEXTRACTF128 $1, Y12, X13
	VADDPS X13, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VZEROUPPER
	MOVSS X12, ret+56(FP)
	RET

// func dotBitsRowAVX2(x *float32, src *byte, scales, zeros *uint16, ng, group, bits int, shifts *int32, zsym float32, mask uint32) float32
// ng >= 1 groups of group codes (a multiple of 8). Eight codes (bits
// bytes) are extracted as in dequantBitsRowAVX2 and multiplied into a
// float32 accumulator with x, 16 per step into two accumulators while
// they last; the group's sum is scaled by s_g into the total.
TEXT ·dotBitsRowAVX2(SB), NOSPLIT, $0-76
	MOVQ x+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ scales+16(FP), R8
	MOVQ zeros+24(FP), R9
	MOVQ ng+32(FP), R10
	MOVQ group+40(FP), R11
	MOVQ bits+48(FP), R12
	MOVQ shifts+56(FP), R13
	VMOVDQU (R13), Y10
	VBROADCASTSS zsym+64(FP), Y1
	MOVL mask+68(FP), AX
	VMOVD AX, X2
	VPBROADCASTD X2, Y2
	VXORPS Y12, Y12, Y12

pgroup:
	VPBROADCASTW (R8), X0
	VCVTPH2PS X0, Y0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   pcodes
	VPBROADCASTW (R9), X1
	VCVTPH2PS X1, Y1
	ADDQ $2, R9

pcodes:
	MOVQ R11, CX
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14

ploop16:
	CMPQ CX, $16
	JL   ploop
	VPBROADCASTD (SI), Y3
	VPBROADCASTD (SI)(R12*1), Y4
	VPSRLVD Y10, Y3, Y3
	VPSRLVD Y10, Y4, Y4
	VPAND Y2, Y3, Y3
	VPAND Y2, Y4, Y4
	VCVTDQ2PS Y3, Y3
	VCVTDQ2PS Y4, Y4
	VSUBPS Y1, Y3, Y3
	VSUBPS Y1, Y4, Y4
	VFMADD231PS (DI), Y3, Y13
	VFMADD231PS 32(DI), Y4, Y14
	LEAQ (SI)(R12*2), SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ  ploop16
	JMP  pend

ploop:
	VPBROADCASTD (SI), Y3
	VPSRLVD Y10, Y3, Y3
	VPAND Y2, Y3, Y3
	VCVTDQ2PS Y3, Y3
	VSUBPS Y1, Y3, Y3
	VFMADD231PS (DI), Y3, Y13
	ADDQ R12, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ  ploop16

pend:
	VADDPS Y14, Y13, Y13
	VFMADD231PS Y0, Y13, Y12
	DECQ R10
	JNZ  pgroup

	VEXTRACTF128 $1, Y12, X13
	VADDPS X13, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VZEROUPPER
	MOVSS X12, ret+72(FP)
	RET

// func dotU4RowILAVX2(xi *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32) float32
// ng >= 1 groups of group codes (a multiple of 16), x interleaved per 16
// (InterleaveU4): eight bytes zero-extend to eight dwords whose low
// nibbles are codes 0, 2, …, 14 and high nibbles codes 1, 3, …, 15,
// matching xi[0..7] and xi[8..15]. Each group's scale and zero-point are
// broadcast from memory as float16 words and converted (VCVTPH2PS).
// 32 codes per step into four accumulators while they last, then 16.
TEXT ·dotU4RowILAVX2(SB), NOSPLIT, $0-60
	MOVQ xi+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ scales+16(FP), R8
	MOVQ zeros+24(FP), R9
	MOVQ ng+32(FP), R10
	MOVQ group+40(FP), R11
	VBROADCASTSS zsym+48(FP), Y1
	VPCMPEQD Y2, Y2, Y2
	VPSRLD $28, Y2, Y2
	VXORPS Y12, Y12, Y12

igroup:
	VPBROADCASTW (R8), X0
	VCVTPH2PS X0, Y0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   icodes
	VPBROADCASTW (R9), X1
	VCVTPH2PS X1, Y1
	ADDQ $2, R9

icodes:
	MOVQ R11, CX
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15
	VXORPS Y11, Y11, Y11

iloop32:
	CMPQ CX, $32
	JL   iloop
	VPMOVZXBD (SI), Y3
	VPMOVZXBD 8(SI), Y6
	VPAND Y2, Y3, Y4
	VPSRLD $4, Y3, Y5
	VPAND Y2, Y6, Y7
	VPSRLD $4, Y6, Y8
	VCVTDQ2PS Y4, Y4
	VCVTDQ2PS Y5, Y5
	VCVTDQ2PS Y7, Y7
	VCVTDQ2PS Y8, Y8
	VSUBPS Y1, Y4, Y4
	VSUBPS Y1, Y5, Y5
	VSUBPS Y1, Y7, Y7
	VSUBPS Y1, Y8, Y8
	VFMADD231PS (DI), Y4, Y13
	VFMADD231PS 32(DI), Y5, Y14
	VFMADD231PS 64(DI), Y7, Y15
	VFMADD231PS 96(DI), Y8, Y11
	ADDQ $16, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JNZ  iloop32
	JMP  iend

iloop:
	VPMOVZXBD (SI), Y3
	VPAND Y2, Y3, Y4
	VPSRLD $4, Y3, Y5
	VCVTDQ2PS Y4, Y4
	VCVTDQ2PS Y5, Y5
	VSUBPS Y1, Y4, Y4
	VSUBPS Y1, Y5, Y5
	VFMADD231PS (DI), Y4, Y13
	VFMADD231PS 32(DI), Y5, Y14
	ADDQ $8, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ  iloop32

iend:
	VADDPS Y14, Y13, Y13
	VADDPS Y11, Y15, Y15
	VADDPS Y15, Y13, Y13
	VFMADD231PS Y0, Y13, Y12
	DECQ R10
	JNZ  igroup

	VEXTRACTF128 $1, Y12, X13
	VADDPS X13, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VZEROUPPER
	MOVSS X12, ret+56(FP)
	RET
