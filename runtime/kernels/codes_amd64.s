//go:build !purego

#include "textflag.h"

// Kernels over rows of packed unsigned codes (codes.go): a row holds hd
// codes of 2, 4 or 8 bits, LSB first, in hd·bits/8 bytes. Each 32-code
// chunk of a row is brought into four ymm registers of eight int32 codes
// (Y4..Y7, codes 0–7, 8–15, 16–23, 24–31 of the chunk) by the OCT macros,
// converted to float32 (exact: codes are below 2^24) and multiplied with
// FMA. Y15 holds the code mask, Y14 and Y13 the variable shifts (2-bit:
// 0, 2, …, 14 and 16, 18, …, 30; 4-bit: 0, 4, …, 28).

// OCT2: 32 2-bit codes at A (8 bytes, two dwords; B = A+4; C, D
// unused). The OCT macros take the addresses of the chunk's bytes 0, 4
// (2-bit) or 0, 4, 8, 12 (4-bit) or 0, 8, 16, 24 (8-bit).
#define OCT2(A, B, C, D) \
	VPBROADCASTD A, Y8; \
	VPBROADCASTD B, Y9; \
	VPSRLVD Y14, Y8, Y4; \
	VPSRLVD Y13, Y8, Y5; \
	VPSRLVD Y14, Y9, Y6; \
	VPSRLVD Y13, Y9, Y7; \
	VPAND Y15, Y4, Y4; \
	VPAND Y15, Y5, Y5; \
	VPAND Y15, Y6, Y6; \
	VPAND Y15, Y7, Y7

// OCT4: 32 4-bit codes at A (16 bytes, four dwords at A, B, C, D).
#define OCT4(A, B, C, D) \
	VPBROADCASTD A, Y4; \
	VPBROADCASTD B, Y5; \
	VPBROADCASTD C, Y6; \
	VPBROADCASTD D, Y7; \
	VPSRLVD Y14, Y4, Y4; \
	VPSRLVD Y14, Y5, Y5; \
	VPSRLVD Y14, Y6, Y6; \
	VPSRLVD Y14, Y7, Y7; \
	VPAND Y15, Y4, Y4; \
	VPAND Y15, Y5, Y5; \
	VPAND Y15, Y6, Y6; \
	VPAND Y15, Y7, Y7

// OCT8: 32 8-bit codes at A (32 bytes, quadwords at A, B, C, D).
#define OCT8(A, B, C, D) \
	VPMOVZXBD A, Y4; \
	VPMOVZXBD B, Y5; \
	VPMOVZXBD C, Y6; \
	VPMOVZXBD D, Y7

// O2, O4, O8 (R): one chunk at (R); O2X, O4X, O8X (R, X): at (R)(X).
#define O2(R) OCT2((R), 4(R), 0, 0)
#define O4(R) OCT4((R), 4(R), 8(R), 12(R))
#define O8(R) OCT8((R), 8(R), 16(R), 24(R))
#define OS8(R) OCTS8((R), 8(R), 16(R), 24(R))
#define OS8X(R, X) OCTS8((R)(X), 8(R)(X), 16(R)(X), 24(R)(X))
#define O2X(R, X) OCT2((R)(X), 4(R)(X), 0, 0)
#define O4X(R, X) OCT4((R)(X), 4(R)(X), 8(R)(X), 12(R)(X))
#define O8X(R, X) OCT8((R)(X), 8(R)(X), 16(R)(X), 24(R)(X))

// FMA4(ACC): ACC += Y4..Y7 · the chunk's 32 values of q at (DX).
#define FMA4(ACC) \
	VCVTDQ2PS Y4, Y4; \
	VCVTDQ2PS Y5, Y5; \
	VCVTDQ2PS Y6, Y6; \
	VCVTDQ2PS Y7, Y7; \
	VFMADD231PS (DX), Y4, ACC; \
	VFMADD231PS 32(DX), Y5, ACC; \
	VFMADD231PS 64(DX), Y6, ACC; \
	VFMADD231PS 96(DX), Y7, ACC

// OCTS8: 32 signed 8-bit codes (int8, sign-extended) at A..D as OCT8.
#define OCTS8(A, B, C, D) \
	VPMOVSXBD A, Y4; \
	VPMOVSXBD B, Y5; \
	VPMOVSXBD C, Y6; \
	VPMOVSXBD D, Y7

#define CVT4 \
	VCVTDQ2PS Y4, Y4; \
	VCVTDQ2PS Y5, Y5; \
	VCVTDQ2PS Y6, Y6; \
	VCVTDQ2PS Y7, Y7

// SETUP loads the mask (mask, in AX) and the shifts (table in R13).
#define SETUP \
	VMOVD AX, X15; \
	VPBROADCASTD X15, Y15; \
	VMOVDQU (R13), Y14; \
	VMOVDQU 32(R13), Y13

// DOTS(O, OX, CB): out[j] = q·code_j for j < n, four rows at a time (one
// accumulator each, reduced together), then one at a time. Registers:
// DI out, BX q, SI codes, CX n, R10 hd, R11 rb, R12 3·rb, R13 shifts;
// CB is the code bytes of 32 codes.
#define DOTS(O, OX, CB) \
	SETUP; \
	LEAQ (R11)(R11*2), R12; \
dots4: \
	CMPQ CX, $4; \
	JL dots1; \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	MOVQ SI, R8; \
	MOVQ BX, DX; \
	MOVQ R10, R9; \
dots4Chunk: \
	O(R8); \
	FMA4(Y0); \
	OX(R8, R11*1); \
	FMA4(Y1); \
	OX(R8, R11*2); \
	FMA4(Y2); \
	OX(R8, R12*1); \
	FMA4(Y3); \
	ADDQ $CB, R8; \
	ADDQ $128, DX; \
	SUBQ $32, R9; \
	JNZ dots4Chunk; \
	VHADDPS Y1, Y0, Y0; \
	VHADDPS Y3, Y2, Y2; \
	VHADDPS Y2, Y0, Y0; \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS X1, X0, X0; \
	VMOVUPS X0, (DI); \
	ADDQ $16, DI; \
	LEAQ (SI)(R11*4), SI; \
	SUBQ $4, CX; \
	JMP dots4; \
dots1: \
	TESTQ CX, CX; \
	JZ dotsDone; \
	VXORPS Y0, Y0, Y0; \
	MOVQ SI, R8; \
	MOVQ BX, DX; \
	MOVQ R10, R9; \
dots1Chunk: \
	O(R8); \
	FMA4(Y0); \
	ADDQ $CB, R8; \
	ADDQ $128, DX; \
	SUBQ $32, R9; \
	JNZ dots1Chunk; \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS X1, X0, X0; \
	VHADDPS X0, X0, X0; \
	VHADDPS X0, X0, X0; \
	VMOVSS X0, (DI); \
	ADDQ $4, DI; \
	ADDQ R11, SI; \
	DECQ CX; \
	JMP dots1; \
dotsDone: \
	VZEROUPPER; \
	RET

// AXPY(OCT, CB): acc[c] += Σ_j w[j]·code_j[c], 32 columns at a time held
// in Y0..Y3 over the n rows. Registers: DI acc, BX w, SI codes, CX n,
// R10 hd, R11 rb, R13 shifts.
#define AXPY(OCT, CB) \
	SETUP; \
axpySlab: \
	VMOVUPS (DI), Y0; \
	VMOVUPS 32(DI), Y1; \
	VMOVUPS 64(DI), Y2; \
	VMOVUPS 96(DI), Y3; \
	MOVQ SI, R8; \
	MOVQ BX, DX; \
	MOVQ CX, R9; \
axpyRow: \
	VBROADCASTSS (DX), Y12; \
	OCT(R8); \
	CVT4; \
	VFMADD231PS Y4, Y12, Y0; \
	VFMADD231PS Y5, Y12, Y1; \
	VFMADD231PS Y6, Y12, Y2; \
	VFMADD231PS Y7, Y12, Y3; \
	ADDQ $4, DX; \
	ADDQ R11, R8; \
	DECQ R9; \
	JNZ axpyRow; \
	VMOVUPS Y0, (DI); \
	VMOVUPS Y1, 32(DI); \
	VMOVUPS Y2, 64(DI); \
	VMOVUPS Y3, 96(DI); \
	ADDQ $128, DI; \
	ADDQ $CB, SI; \
	SUBQ $32, R10; \
	JNZ axpySlab; \
	VZEROUPPER; \
	RET

#define ARGS \
	MOVQ dst+0(FP), DI; \
	MOVQ x+8(FP), BX; \
	MOVQ codes+16(FP), SI; \
	MOVQ n+24(FP), CX; \
	MOVQ hd+32(FP), R10; \
	MOVQ rb+40(FP), R11; \
	MOVQ shifts+48(FP), R13

// func codeDots2AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
// n ≥ 1, hd a positive multiple of 32, rb ≥ hd/4 the row stride in bytes.
TEXT ·codeDots2AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $3, AX
	DOTS(O2, O2X, 8)

// func codeDots4AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
TEXT ·codeDots4AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $15, AX
	DOTS(O4, O4X, 16)

// func codeDots8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
TEXT ·codeDots8AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $255, AX
	DOTS(O8, O8X, 32)

// func codeAxpy2AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
// n ≥ 1, hd a positive multiple of 32; dst is the accumulator [hd], x the
// weights [n].
TEXT ·codeAxpy2AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $3, AX
	AXPY(O2, 8)

// func codeAxpy4AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
TEXT ·codeAxpy4AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $15, AX
	AXPY(O4, 16)

// func codeAxpy8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
TEXT ·codeAxpy8AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $255, AX
	AXPY(O8, 32)

// func codeDotsS8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
// codeDots8AVX2 for signed (int8) codes.
TEXT ·codeDotsS8AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $255, AX
	DOTS(OS8, OS8X, 32)

// func codeAxpyS8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
// codeAxpy8AVX2 for signed (int8) codes.
TEXT ·codeAxpyS8AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $255, AX
	AXPY(OS8, 32)
