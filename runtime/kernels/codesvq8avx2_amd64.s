//go:build !purego

#include "textflag.h"

// AVX2 form of CodeAccumQ8's value kernel (codesvq8.go; the AVX-512 one
// is codesvq8_amd64.s) for CPUs without VNNI and VBMI: 2-bit codes,
// head_dim a multiple of 64 (nc chunks of 64 channels, 16 bytes of each
// row), any row stride, blocks of 16 rows. Per block (BLOCKP, for up to 8 blocks
// before their codes): w = p·s
// (the fp16 scales and zeros split by VPERMPS and VPERM2F128), δ =
// max|w|/127, w8 = round(w/δ) (VCVTPS2DQ, nearest even) packed to int8
// (VPACKSSDW, VPERMQ, VPACKSSWB) into the block's frame slot, later
// broadcast to both lanes of Y14; cz += δ·w8·z in two 8-lane
// accumulators (lanes 0–15 as the AVX-512 kernel's 16). For each chunk and group of four rows
// (GROUPV), rows 0 and 2 and rows 1 and 3 are interleaved byte by byte
// (VPUNPCKLBW/HBW of [row 0 | row 1] and [row 2 | row 3]: lane 0 holds
// the pairs of rows 0 and 2, lane 1 those of rows 1 and 3), each 2-bit
// plane extracted by a word shift and mask, and VPMADDUBSW multiplies the
// code pairs with the weight pairs (w8 of rows 0, 2 in lane 0 and 1, 3 in
// lane 1, by VPSHUFB) into int16 sums per channel: a pair is at most
// 2·3·128 = 768, a block's four groups 3,072 and the two lanes' sum
// 6,144, so no sum saturates and every one is exact. At the end of a
// chunk the lanes are added, widened to int32 and added to the float32
// sums in tmp as δ·sum by one FMA each: the AVX-512 kernel's operations
// on the same exact sums, so the outputs have its bits (TestCodeAccumQ8
// against float64; TestCodeAccumQ8AVX2Exact for the integer part).
//
// Registers: DI tmp, SI p, DX params, BX the block's codes, CX blocks
// left, R10 nc, R11 rb, R14 3·rb, R9 consts, R8 cz, R12 chunks left, R13
// the chunk's codes, R15 the group's rows, AX the chunk's float sums;
// Y15 the 2-bit mask, Y14 the block's w8 (both lanes), Y0–Y3 (lane pairs
// of bytes 0–7) and Y4–Y7 (bytes 8–15) the int16 sums of planes 0–3.
// Frame: 0 unused, 32 the block's δ (8 lanes), 64 and 96 the cz lanes of
// rows 0–7 and 8–15, 128 and 160 Σ 0·w of the same (NaN where a weight is
// NaN or infinite), 192 16·rb, 200 the blocks left in the group of up to
// 8, 208 the next block's slot offset, 224 + 32·b block b's slot: its 16
// w8 bytes, then δ.

// PLW(SRC, A0, A1, A2, A3, T): the four 2-bit planes of SRC times the
// weight pairs in Y10, added to A0–A3.
#define PLW(SRC, A0, A1, A2, A3, T) \
	VPAND Y15, SRC, T; \
	VPMADDUBSW Y10, T, T; \
	VPADDW T, A0, A0; \
	VPSRLW $2, SRC, T; \
	VPAND Y15, T, T; \
	VPMADDUBSW Y10, T, T; \
	VPADDW T, A1, A1; \
	VPSRLW $4, SRC, T; \
	VPAND Y15, T, T; \
	VPMADDUBSW Y10, T, T; \
	VPADDW T, A2, A2; \
	VPSRLW $6, SRC, T; \
	VPAND Y15, T, T; \
	VPMADDUBSW Y10, T, T; \
	VPADDW T, A3, A3

// GROUPV(CTRL): the group of four rows at R15 (chunk bytes), weight pairs
// by the VPSHUFB control at CTRL(R9).
#define GROUPV(CTRL) \
	VMOVDQU (R15), X8; \
	VINSERTI128 $1, (R15)(R11*1), Y8, Y8; \
	VMOVDQU (R15)(R11*2), X9; \
	VINSERTI128 $1, (R15)(R14*1), Y9, Y9; \
	VPUNPCKHBW Y9, Y8, Y12; \
	VPUNPCKLBW Y9, Y8, Y8; \
	VPSHUFB CTRL(R9), Y14, Y10; \
	PLW(Y8, Y0, Y1, Y2, Y3, Y11); \
	PLW(Y12, Y4, Y5, Y6, Y7, Y13); \
	LEAQ (R15)(R11*4), R15

// EPIP(AL, AH, OFF): plane sums AL (bytes 0–7) and AH (8–15) to the
// float sums at OFF(AX) (16 floats): lanes added, widened, δ·sum added.
#define EPIP(AL, AH, OFF) \
	VPERM2I128 $0x20, AH, AL, Y8; \
	VPERM2I128 $0x31, AH, AL, Y9; \
	VPADDW Y9, Y8, Y8; \
	VPMOVSXWD X8, Y9; \
	VEXTRACTI128 $1, Y8, X8; \
	VPMOVSXWD X8, Y8; \
	VCVTDQ2PS Y9, Y9; \
	VCVTDQ2PS Y8, Y8; \
	VFMADD213PS OFF(AX), Y10, Y9; \
	VMOVUPS Y9, OFF(AX); \
	VFMADD213PS 32+OFF(AX), Y10, Y8; \
	VMOVUPS Y8, 32+OFF(AX)

// BLOCKP: the weights of the block at SI (p) and DX (params) into the
// frame slot at R12 (w8 at 224, δ at 240); Y10/Y11 the cz lanes of rows
// 0–7 and 8–15, Y12/Y15 their Σ 0·w; Y13 the scale/zero split.
#define BLOCKP \
	VMOVUPS (SI), Y0; \
	VMOVUPS 32(SI), Y8; \
	VCVTPH2PS (DX), Y1; \
	VCVTPH2PS 16(DX), Y2; \
	VCVTPH2PS 32(DX), Y3; \
	VCVTPH2PS 48(DX), Y4; \
	VPERMPS Y1, Y13, Y1; \
	VPERMPS Y2, Y13, Y2; \
	VPERMPS Y3, Y13, Y3; \
	VPERMPS Y4, Y13, Y4; \
	VPERM2F128 $0x20, Y2, Y1, Y5; \
	VPERM2F128 $0x31, Y2, Y1, Y6; \
	VPERM2F128 $0x20, Y4, Y3, Y7; \
	VPERM2F128 $0x31, Y4, Y3, Y9; \
	VMULPS Y5, Y0, Y0; \
	VMULPS Y7, Y8, Y8; \
	VXORPS Y1, Y1, Y1; \
	VMULPS Y1, Y0, Y2; \
	VADDPS Y2, Y12, Y12; \
	VMULPS Y1, Y8, Y3; \
	VADDPS Y3, Y15, Y15; \
	VBROADCASTSS 264(R9), Y1; \
	VANDPS Y1, Y0, Y2; \
	VANDPS Y1, Y8, Y3; \
	VMAXPS Y3, Y2, Y2; \
	VEXTRACTF128 $1, Y2, X3; \
	VMAXPS X3, X2, X2; \
	VPERMILPS $0x4E, X2, X3; \
	VMAXPS X3, X2, X2; \
	VPERMILPS $0xB1, X2, X3; \
	VMAXPS X3, X2, X2; \
	VBROADCASTSS X2, Y2; \
	VBROADCASTSS 260(R9), Y3; \
	VMAXPS Y3, Y2, Y2; \
	VBROADCASTSS 256(R9), Y3; \
	VDIVPS Y2, Y3, Y4; \
	VDIVPS Y3, Y2, Y5; \
	VMOVSS X5, 240(SP)(R12*1); \
	VMULPS Y4, Y0, Y0; \
	VMULPS Y4, Y8, Y8; \
	VCVTPS2DQ Y0, Y0; \
	VCVTPS2DQ Y8, Y8; \
	VPACKSSDW Y8, Y0, Y1; \
	VPERMQ $0xD8, Y1, Y1; \
	VEXTRACTI128 $1, Y1, X2; \
	VPACKSSWB X2, X1, X1; \
	VMOVDQU X1, 224(SP)(R12*1); \
	VCVTDQ2PS Y0, Y0; \
	VCVTDQ2PS Y8, Y8; \
	VMULPS Y5, Y0, Y0; \
	VMULPS Y5, Y8, Y8; \
	VFMADD231PS Y6, Y0, Y10; \
	VFMADD231PS Y9, Y8, Y11

// func codeAccumQ8b2AVX2(tmp, p *float32, params *uint16, codes *byte, n16, nc, rb int, consts *q8vConstTab, cz *float32)
// tmp [64·nc] receives the plane-ordered sums of each chunk (as
// codeAccumQ8b2C1's), *cz Σ_j w̃_j·z_j. Requires n16 ≥ 1, nc ≥ 1, rb ≥ 16·nc.
TEXT ·codeAccumQ8b2AVX2(SB), $480-72
	MOVQ tmp+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ params+16(FP), DX
	MOVQ codes+24(FP), BX
	MOVQ n16+32(FP), CX
	MOVQ nc+40(FP), R10
	MOVQ rb+48(FP), R11
	MOVQ consts+56(FP), R9
	MOVQ cz+64(FP), R8
	LEAQ (R11)(R11*2), R14
	MOVQ R11, AX
	SHLQ $4, AX
	MOVQ AX, 192(SP)
	VXORPS Y0, Y0, Y0
	VMOVUPS Y0, 64(SP)
	VMOVUPS Y0, 96(SP)
	VMOVUPS Y0, 128(SP)
	VMOVUPS Y0, 160(SP)
	MOVQ DI, AX
	MOVQ R10, R12

zero:
	VMOVUPS Y0, (AX)
	VMOVUPS Y0, 32(AX)
	VMOVUPS Y0, 64(AX)
	VMOVUPS Y0, 96(AX)
	VMOVUPS Y0, 128(AX)
	VMOVUPS Y0, 160(AX)
	VMOVUPS Y0, 192(AX)
	VMOVUPS Y0, 224(AX)
	ADDQ $256, AX
	DECQ R12
	JNZ  zero

	// Up to 8 blocks at a time: their weights first (BLOCKP: the
	// blocks' chains of reductions and divisions are independent and
	// overlap), then their codes.
super:
	MOVQ CX, AX
	CMPQ AX, $8
	JLE  prep
	MOVQ $8, AX

prep:
	SUBQ AX, CX
	MOVQ AX, 200(SP)
	VMOVDQU 400(R9), Y13
	VMOVUPS 64(SP), Y10
	VMOVUPS 96(SP), Y11
	VMOVUPS 128(SP), Y12
	VMOVUPS 160(SP), Y15
	XORQ R12, R12

pre:
	PREFETCHT0 512(DX)
	PREFETCHT0 512(SI)
	BLOCKP
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $32, R12
	DECQ AX
	JNZ  pre

	VMOVUPS Y10, 64(SP)
	VMOVUPS Y11, 96(SP)
	VMOVUPS Y12, 128(SP)
	VMOVUPS Y15, 160(SP)
	VMOVDQU 192(R9), Y15
	MOVQ $0, 208(SP)

blk:
	PREFETCHT0 2048(BX)
	PREFETCHT0 2112(BX)
	PREFETCHT0 2176(BX)
	PREFETCHT0 2240(BX)
	MOVQ 208(SP), R12
	VBROADCASTI128 224(SP)(R12*1), Y14
	VBROADCASTSS 240(SP)(R12*1), Y10
	VMOVUPS Y10, 32(SP)
	ADDQ $32, R12
	MOVQ R12, 208(SP)
	MOVQ BX, R13
	MOVQ DI, AX
	MOVQ R10, R12

chunk:
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	VPXOR Y4, Y4, Y4
	VPXOR Y5, Y5, Y5
	VPXOR Y6, Y6, Y6
	VPXOR Y7, Y7, Y7
	MOVQ R13, R15
	GROUPV(432)
	GROUPV(464)
	GROUPV(496)
	GROUPV(528)
	VMOVUPS 32(SP), Y10
	EPIP(Y0, Y4, 0)
	EPIP(Y1, Y5, 64)
	EPIP(Y2, Y6, 128)
	EPIP(Y3, Y7, 192)
	ADDQ $16, R13
	ADDQ $256, AX
	DECQ R12
	JNZ  chunk

	ADDQ 192(SP), BX
	DECQ 200(SP)
	JNZ  blk
	TESTQ CX, CX
	JNZ  super

	VMOVUPS 64(SP), Y0
	VADDPS 128(SP), Y0, Y0
	VMOVUPS 96(SP), Y1
	VADDPS 160(SP), Y1, Y1
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0x4E, X0, X1
	VADDPS X1, X0, X0
	VPERMILPS $0xB1, X0, X1
	VADDPS X1, X0, X0
	VMOVSS X0, (R8)
	VZEROUPPER
	RET
