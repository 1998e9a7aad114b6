//go:build !purego

#include "textflag.h"

// AVX2 forms of the four-row integer code kernels of CodeDotsQ8 and
// CodeDotsQ8F16 (codesq8.go for the plane layout; codesq8_amd64.s for
// the AVX-512 VNNI ones), for CPUs without VNNI. Rows 0–1 of a group are
// loaded into the two 128-bit lanes of Y1, rows 2–3 into Y5; each plane
// is extracted by a word shift and a byte mask and multiplied with the
// query plane (the same 16 bytes in both lanes: the first 32 of the
// layout's 64) by VPMADDUBSW (unsigned codes × signed query bytes, pairs
// summed to int16). A 2-bit pair sum is at most 2·3·127 = 762 and a 4-bit
// one 2·15·127 = 3,810, so the planes of one unit add in int16 without
// saturating (≤ 3,048 and ≤ 7,620); VPMADDWD with ones widens each unit's
// sums to int32. 8-bit codes would saturate VPMADDUBSW (2·255·127): rows
// of up to 16 units (head_dim 256) take Q8DOTS8W below (VPMADDWD on the
// codes zero-extended to int16), longer ones are split into nibbles, c =
// lo + 16·hi, each multiplied with the query (≤ 3,810) and widened by
// VPMADDWD with 1 and 16. Every int32 sum
// is exact, so a row's t_j is the VNNI kernel's, and the float32
// epilogue is the VNNI kernel's instruction for instruction: the scores
// have the same bits (TestCodeDotsQ8AVX2Exact, TestCodeDotsQ8).
//
// Registers: DI out, BX qb, SI codes, CX n4, R10 u, R11 rb, R12 3·rb, DX
// params (or sz), R8 the rows' unit pointer, R13 the query unit pointer,
// R15 qs (bytes between the query's units: 64 for CodeQ8Query's layout,
// 256 for a row of CodeQ8Query4's), R9 = qs·u (the plane stride), AX =
// 3·qs·u, R14 the unit counter; Y15 the byte mask, Y14 int16 ones, Y13
// int16 sixteens, Y10 the scale/zero split, X12 the query scale, X11 Σ q̃;
// Y0 (rows 0–1) and Y4 (rows 2–3) the int32 sums.

// PL2A(YR, YA, T0, T1): the four 2-bit planes of YR into YA.
#define PL2A(YR, YA, T0, T1) \
	VPAND Y15, YR, T0; \
	VPMADDUBSW (R13), T0, T0; \
	VPSRLW $2, YR, T1; \
	VPAND Y15, T1, T1; \
	VPMADDUBSW (R13)(R9*1), T1, T1; \
	VPADDW T1, T0, T0; \
	VPSRLW $4, YR, T1; \
	VPAND Y15, T1, T1; \
	VPMADDUBSW (R13)(R9*2), T1, T1; \
	VPADDW T1, T0, T0; \
	VPSRLW $6, YR, T1; \
	VPAND Y15, T1, T1; \
	VPMADDUBSW (R13)(AX*1), T1, T1; \
	VPADDW T1, T0, T0; \
	VPMADDWD Y14, T0, T0; \
	VPADDD T0, YA, YA

// PL4A: the two 4-bit planes.
#define PL4A(YR, YA, T0, T1) \
	VPAND Y15, YR, T0; \
	VPMADDUBSW (R13), T0, T0; \
	VPSRLW $4, YR, T1; \
	VPAND Y15, T1, T1; \
	VPMADDUBSW (R13)(R9*1), T1, T1; \
	VPADDW T1, T0, T0; \
	VPMADDWD Y14, T0, T0; \
	VPADDD T0, YA, YA

// PL8A: the one 8-bit plane, as its two nibbles (Y15 the 4-bit mask).
#define PL8A(YR, YA, T0, T1) \
	VPAND Y15, YR, T0; \
	VPMADDUBSW (R13), T0, T0; \
	VPMADDWD Y14, T0, T0; \
	VPSRLW $4, YR, T1; \
	VPAND Y15, T1, T1; \
	VPMADDUBSW (R13), T1, T1; \
	VPMADDWD Y13, T1, T1; \
	VPADDD T0, YA, YA; \
	VPADDD T1, YA, YA

// PF32A and PF16A: the group's four scales into X1 and zeros into X2.
#define PF32A \
	VPERMPS (DX), Y10, Y1; \
	VEXTRACTF128 $1, Y1, X2

#define PF16A \
	VCVTPH2PS (DX), Y1; \
	VPERMPS Y1, Y10, Y1; \
	VEXTRACTF128 $1, Y1, X2

// ARGSA(PNAME): the arguments of every kernel below into their registers
// (PNAME the parameters' argument name).
#define ARGSA(PNAME) \
	MOVQ out+0(FP), DI; \
	MOVQ qb+8(FP), BX; \
	MOVQ codes+16(FP), SI; \
	MOVQ n4+24(FP), CX; \
	MOVQ u+32(FP), R10; \
	MOVQ rb+40(FP), R11; \
	MOVQ qs+48(FP), R15; \
	MOVQ PNAME+56(FP), DX; \
	MOVQ coef+64(FP), R13; \
	MOVQ consts+72(FP), R14

// EPIA(PLOAD, PSTEP): four rows' int32 sums in X0 to their scores at DI
// (the VNNI kernels' epilogue: ·scale, − zero·Σq̃ fused, ·row scale);
// DI and DX step on.
#define EPIA(PLOAD, PSTEP) \
	VCVTDQ2PS X0, X0; \
	VMULPS X12, X0, X0; \
	PLOAD; \
	VFNMADD231PS X11, X2, X0; \
	VMULPS X1, X0, X0; \
	VMOVUPS X0, (DI); \
	ADDQ $16, DI; \
	ADDQ $PSTEP, DX

// Q8DOTSA(MASKOFF, PL, PLOAD, PSTEP, PNAME): the kernel body
// (codesq8_amd64.s's Q8DOTS with the same prefetch, for any row stride);
// PNAME is the parameters' argument name.
#define Q8DOTSA(MASKOFF, PL, PLOAD, PSTEP, PNAME) \
	ARGSA(PNAME); \
	VMOVDQU 64(R14), Y10; \
	VMOVDQU MASKOFF(R14), Y15; \
	VMOVDQU 224(R14), Y14; \
	VMOVDQU 256(R14), Y13; \
	VBROADCASTSS (R13), X12; \
	VBROADCASTSS 4(R13), X11; \
	LEAQ (R11)(R11*2), R12; \
	MOVQ R10, R9; \
	IMULQ R15, R9; \
	LEAQ (R9)(R9*2), AX; \
grp: \
	PREFETCHT0 2048(SI); \
	PREFETCHT0 2048(SI)(R11*2); \
	PREFETCHT0 512(DX); \
	VPXOR Y0, Y0, Y0; \
	VPXOR Y4, Y4, Y4; \
	MOVQ SI, R8; \
	MOVQ BX, R13; \
	MOVQ R10, R14; \
unit: \
	VMOVDQU (R8), X1; \
	VINSERTI128 $1, (R8)(R11*1), Y1, Y1; \
	VMOVDQU (R8)(R11*2), X5; \
	VINSERTI128 $1, (R8)(R12*1), Y5, Y5; \
	PL(Y1, Y0, Y2, Y3); \
	PL(Y5, Y4, Y6, Y7); \
	ADDQ $16, R8; \
	ADDQ R15, R13; \
	DECQ R14; \
	JNZ unit; \
	VPHADDD Y4, Y0, Y0; \
	VPHADDD Y0, Y0, Y0; \
	VEXTRACTI128 $1, Y0, X1; \
	VPUNPCKLDQ X1, X0, X0; \
	EPIA(PLOAD, PSTEP); \
	LEAQ (SI)(R11*4), SI; \
	DECQ CX; \
	JNZ grp; \
	VZEROUPPER; \
	RET

// 8-bit codes by VPMADDWD: the query's u units widened once to int16 in
// the frame (u ≤ 16: head_dim ≤ 256), each row's units zero-extended to
// int16 (VPMOVZXBW) and multiplied pairwise (code ≤ 255 × |q| ≤ 127:
// exact int32), one accumulator per row: three instructions per 16
// codes against the nibble split's nine per 32. Registers as Q8DOTSA;
// R13 the frame offset of the query unit, Y0–Y3 the four rows' sums.

// Q8DOTS8W(PLOAD, PSTEP, PNAME): the kernel body.
#define Q8DOTS8W(PLOAD, PSTEP, PNAME) \
	ARGSA(PNAME); \
	VMOVDQU 64(R14), Y10; \
	VBROADCASTSS (R13), X12; \
	VBROADCASTSS 4(R13), X11; \
	LEAQ (R11)(R11*2), R12; \
	XORQ R13, R13; \
	MOVQ R10, R14; \
widen: \
	VPMOVSXBW (BX), Y0; \
	VMOVDQU Y0, (SP)(R13*1); \
	ADDQ R15, BX; \
	ADDQ $32, R13; \
	DECQ R14; \
	JNZ widen; \
grp8: \
	PREFETCHT0 2048(SI); \
	PREFETCHT0 2048(SI)(R11*2); \
	PREFETCHT0 512(DX); \
	VPXOR Y0, Y0, Y0; \
	VPXOR Y1, Y1, Y1; \
	VPXOR Y2, Y2, Y2; \
	VPXOR Y3, Y3, Y3; \
	MOVQ SI, R8; \
	XORQ R13, R13; \
	MOVQ R10, R14; \
unit8: \
	VPMOVZXBW (R8), Y4; \
	VPMADDWD (SP)(R13*1), Y4, Y4; \
	VPADDD Y4, Y0, Y0; \
	VPMOVZXBW (R8)(R11*1), Y5; \
	VPMADDWD (SP)(R13*1), Y5, Y5; \
	VPADDD Y5, Y1, Y1; \
	VPMOVZXBW (R8)(R11*2), Y6; \
	VPMADDWD (SP)(R13*1), Y6, Y6; \
	VPADDD Y6, Y2, Y2; \
	VPMOVZXBW (R8)(R12*1), Y7; \
	VPMADDWD (SP)(R13*1), Y7, Y7; \
	VPADDD Y7, Y3, Y3; \
	ADDQ $16, R8; \
	ADDQ $32, R13; \
	DECQ R14; \
	JNZ unit8; \
	VPHADDD Y1, Y0, Y0; \
	VPHADDD Y3, Y2, Y2; \
	VPHADDD Y2, Y0, Y0; \
	VEXTRACTI128 $1, Y0, X1; \
	VPADDD X1, X0, X0; \
	EPIA(PLOAD, PSTEP); \
	LEAQ (SI)(R11*4), SI; \
	DECQ CX; \
	JNZ grp8; \
	VZEROUPPER; \
	RET

// Contiguous rows of one unit (rb = 16: 2-bit head_dim 64, oscar2's keys):
// the four rows are two loads and the query's four planes stay in Y6–Y9.

// PL2R(YR, YA, T0, T1): PL2A with the query planes in registers, the
// unit's sums written to YA.
#define PL2R(YR, YA, T0, T1) \
	VPAND Y15, YR, T0; \
	VPMADDUBSW Y6, T0, T0; \
	VPSRLW $2, YR, T1; \
	VPAND Y15, T1, T1; \
	VPMADDUBSW Y7, T1, T1; \
	VPADDW T1, T0, T0; \
	VPSRLW $4, YR, T1; \
	VPAND Y15, T1, T1; \
	VPMADDUBSW Y8, T1, T1; \
	VPADDW T1, T0, T0; \
	VPSRLW $6, YR, T1; \
	VPAND Y15, T1, T1; \
	VPMADDUBSW Y9, T1, T1; \
	VPADDW T1, T0, T0; \
	VPMADDWD Y14, T0, YA

// func codeDotsQ8b2AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab)
// Requires n4 ≥ 1, u ≥ 1.
TEXT ·codeDotsQ8b2AVX2(SB), NOSPLIT, $0-80
	Q8DOTSA(96, PL2A, PF32A, 32, sz)

// func codeDotsQ8b4AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8b4AVX2(SB), NOSPLIT, $0-80
	Q8DOTSA(160, PL4A, PF32A, 32, sz)

// func codeDotsQ8b8AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8b8AVX2(SB), NOSPLIT, $0-80
	Q8DOTSA(160, PL8A, PF32A, 32, sz)

// func codeDotsQ8F16b2AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)
// codeDotsQ8b2AVX2 with fp16 params ([4·n4, 2]: scale, zero).
TEXT ·codeDotsQ8F16b2AVX2(SB), NOSPLIT, $0-80
	Q8DOTSA(96, PL2A, PF16A, 16, params)

// func codeDotsQ8F16b4AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16b4AVX2(SB), NOSPLIT, $0-80
	Q8DOTSA(160, PL4A, PF16A, 16, params)

// func codeDotsQ8F16b8AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16b8AVX2(SB), NOSPLIT, $0-80
	Q8DOTSA(160, PL8A, PF16A, 16, params)

// func codeDotsQ8F16b2C1AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)
// Requires n4 ≥ 1, u = 1, rb = 16.
TEXT ·codeDotsQ8F16b2C1AVX2(SB), NOSPLIT, $0-80
	ARGSA(params)
	MOVQ R15, R9
	VMOVDQU 64(R14), Y10
	VMOVDQU 96(R14), Y15
	VMOVDQU 224(R14), Y14
	VBROADCASTSS (R13), X12
	VBROADCASTSS 4(R13), X11
	LEAQ (R9)(R9*2), AX
	VMOVDQU (BX), Y6
	VMOVDQU (BX)(R9*1), Y7
	VMOVDQU (BX)(R9*2), Y8
	VMOVDQU (BX)(AX*1), Y9

grpc1:
	PREFETCHT0 2048(SI)
	PREFETCHT0 512(DX)
	VMOVDQU (SI), Y1
	VMOVDQU 32(SI), Y5
	PL2R(Y1, Y0, Y2, Y3)
	PL2R(Y5, Y4, Y13, Y1)
	VPHADDD Y4, Y0, Y0
	VPHADDD Y0, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPUNPCKLDQ X1, X0, X0
	EPIA(PF16A, 16)
	ADDQ $64, SI
	DECQ CX
	JNZ  grpc1
	VZEROUPPER
	RET

// func codeDotsQ8b8WAVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab)
// Requires n4 ≥ 1, 1 ≤ u ≤ 16.
TEXT ·codeDotsQ8b8WAVX2(SB), $512-80
	Q8DOTS8W(PF32A, 32, sz)

// func codeDotsQ8F16b8WAVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16b8WAVX2(SB), $512-80
	Q8DOTS8W(PF16A, 16, params)
