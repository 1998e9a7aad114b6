//go:build !purego

#include "textflag.h"

// func dequantU4AVX2(dst *float32, src *byte, n int, scale, zero float32)
// n is a multiple of 16; reads n/2 bytes of src, writes n floats of dst.
// Eight bytes are zero-extended to eight dwords, split into low and high
// nibbles, interleaved back into code order (low nibble first), converted
// to float32, and mapped to (code − zero)·scale.
TEXT ·dequantU4AVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y0
	VBROADCASTSS zero+28(FP), Y1
	VPCMPEQD Y2, Y2, Y2
	VPSRLD $28, Y2, Y2 // 15 in every dword

u4loop:
	CMPQ CX, $16
	JL   u4done
	VPMOVZXBD (SI), Y3
	VPAND Y2, Y3, Y4            // low nibbles: codes 0, 2, 4, ...
	VPSRLD $4, Y3, Y5           // high nibbles: codes 1, 3, 5, ...
	VPUNPCKLDQ Y5, Y4, Y6       // lanes: c0 c1 c2 c3 | c8 c9 c10 c11
	VPUNPCKHDQ Y5, Y4, Y7       // lanes: c4 c5 c6 c7 | c12 c13 c14 c15
	VPERM2I128 $0x20, Y7, Y6, Y8 // c0..c7
	VPERM2I128 $0x31, Y7, Y6, Y9 // c8..c15
	VCVTDQ2PS Y8, Y8
	VCVTDQ2PS Y9, Y9
	VSUBPS Y1, Y8, Y8
	VSUBPS Y1, Y9, Y9
	VMULPS Y0, Y8, Y8
	VMULPS Y0, Y9, Y9
	VMOVUPS Y8, (DI)
	VMOVUPS Y9, 32(DI)
	ADDQ $8, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  u4loop

u4done:
	VZEROUPPER
	RET

// func dequantU4RowAVX2(dst *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32)
// ng groups of group codes (group a multiple of 16, ng >= 1). Each group's
// scale (and zero-point unless zeros is nil, then zsym) is converted from
// float16 with VCVTPH2PS and broadcast; the body is dequantU4AVX2's.
TEXT ·dequantU4RowAVX2(SB), NOSPLIT, $0-52
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ scales+16(FP), R8
	MOVQ zeros+24(FP), R9
	MOVQ ng+32(FP), R10
	MOVQ group+40(FP), R11
	VBROADCASTSS zsym+48(FP), Y1
	VPCMPEQD Y2, Y2, Y2
	VPSRLD $28, Y2, Y2

rgroup:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	VBROADCASTSS X0, Y0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   rcodes
	MOVWLZX (R9), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	VBROADCASTSS X1, Y1
	ADDQ $2, R9

rcodes:
	MOVQ R11, CX

rloop:
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
	VMULPS Y0, Y8, Y8
	VMULPS Y0, Y9, Y9
	VMOVUPS Y8, (DI)
	VMOVUPS Y9, 32(DI)
	ADDQ $8, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ  rloop

	DECQ R10
	JNZ  rgroup
	VZEROUPPER
	RET

// func dequantBitsRowAVX2(dst *float32, src *byte, scales, zeros *uint16, ng, group, bits int, shifts *int32, zsym float32, mask uint32)
// ng >= 1 groups of group codes (a multiple of 8). Eight codes take bits
// bytes: a 32-bit load of them is broadcast to eight dwords, shifted right
// by shifts[0..7] and masked, so lane i holds code i.
TEXT ·dequantBitsRowAVX2(SB), NOSPLIT, $0-72
	MOVQ dst+0(FP), DI
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

bgroup:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	VBROADCASTSS X0, Y0
	ADDQ $2, R8
	TESTQ R9, R9
	JZ   bcodes
	MOVWLZX (R9), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	VBROADCASTSS X1, Y1
	ADDQ $2, R9

bcodes:
	MOVQ R11, CX

bloop:
	MOVL (SI), AX
	VMOVD AX, X3
	VPBROADCASTD X3, Y3
	VPSRLVD Y10, Y3, Y3
	VPAND Y2, Y3, Y3
	VCVTDQ2PS Y3, Y3
	VSUBPS Y1, Y3, Y3
	VMULPS Y0, Y3, Y3
	VMOVUPS Y3, (DI)
	ADDQ R12, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ  bloop

	DECQ R10
	JNZ  bgroup
	VZEROUPPER
	RET
