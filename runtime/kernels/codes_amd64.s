//go:build !purego

#include "textflag.h"

// Kernels over rows of packed unsigned codes (codes.go): a row holds hd
// codes of 2, 4 or 8 bits, LSB first, in hd·bits/8 bytes. Each 32-code
// chunk of a row is brought into four ymm registers of eight int32 codes
// (Y4..Y7, codes 0–7, 8–15, 16–23, 24–31 of the chunk) by the OCT macros,
// converted to float32 (exact: codes are below 2^24) and multiplied with
// FMA. Y15 holds the code mask, Y14 and Y13 the variable shifts (2-bit:
// 0, 2, …, 14 and 16, 18, …, 30; 4-bit: 0, 4, …, 28).

// OCT2: 32 2-bit codes at (R) (8 bytes, two dwords).
#define OCT2(R) \
	VPBROADCASTD (R), Y8; \
	VPBROADCASTD 4(R), Y9; \
	VPSRLVD Y14, Y8, Y4; \
	VPSRLVD Y13, Y8, Y5; \
	VPSRLVD Y14, Y9, Y6; \
	VPSRLVD Y13, Y9, Y7; \
	VPAND Y15, Y4, Y4; \
	VPAND Y15, Y5, Y5; \
	VPAND Y15, Y6, Y6; \
	VPAND Y15, Y7, Y7

// OCT4: 32 4-bit codes at (R) (16 bytes, four dwords).
#define OCT4(R) \
	VPBROADCASTD (R), Y4; \
	VPBROADCASTD 4(R), Y5; \
	VPBROADCASTD 8(R), Y6; \
	VPBROADCASTD 12(R), Y7; \
	VPSRLVD Y14, Y4, Y4; \
	VPSRLVD Y14, Y5, Y5; \
	VPSRLVD Y14, Y6, Y6; \
	VPSRLVD Y14, Y7, Y7; \
	VPAND Y15, Y4, Y4; \
	VPAND Y15, Y5, Y5; \
	VPAND Y15, Y6, Y6; \
	VPAND Y15, Y7, Y7

// OCT8: 32 8-bit codes at (R) (32 bytes).
#define OCT8(R) \
	VPMOVZXBD (R), Y4; \
	VPMOVZXBD 8(R), Y5; \
	VPMOVZXBD 16(R), Y6; \
	VPMOVZXBD 24(R), Y7

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

// DOTS(OCT, CB): out[j] = q·code_j for j < n. Registers: DI out, BX q,
// SI codes, CX n, R10 hd, R11 rb, R13 shifts; CB is the code bytes of 32
// codes.
#define DOTS(OCT, CB) \
	SETUP; \
dotsRow: \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	MOVQ SI, R8; \
	MOVQ BX, DX; \
	MOVQ R10, R9; \
dotsChunk: \
	OCT(R8); \
	CVT4; \
	VFMADD231PS (DX), Y4, Y0; \
	VFMADD231PS 32(DX), Y5, Y1; \
	VFMADD231PS 64(DX), Y6, Y0; \
	VFMADD231PS 96(DX), Y7, Y1; \
	ADDQ $CB, R8; \
	ADDQ $128, DX; \
	SUBQ $32, R9; \
	JNZ dotsChunk; \
	VADDPS Y1, Y0, Y0; \
	VEXTRACTF128 $1, Y0, X1; \
	VADDPS X1, X0, X0; \
	VHADDPS X0, X0, X0; \
	VHADDPS X0, X0, X0; \
	VMOVSS X0, (DI); \
	ADDQ $4, DI; \
	ADDQ R11, SI; \
	DECQ CX; \
	JNZ dotsRow; \
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
	DOTS(OCT2, 8)

// func codeDots4AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
TEXT ·codeDots4AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $15, AX
	DOTS(OCT4, 16)

// func codeDots8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
TEXT ·codeDots8AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $255, AX
	DOTS(OCT8, 32)

// func codeAxpy2AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
// n ≥ 1, hd a positive multiple of 32; dst is the accumulator [hd], x the
// weights [n].
TEXT ·codeAxpy2AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $3, AX
	AXPY(OCT2, 8)

// func codeAxpy4AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
TEXT ·codeAxpy4AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $15, AX
	AXPY(OCT4, 16)

// func codeAxpy8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
TEXT ·codeAxpy8AVX2(SB), NOSPLIT, $0-56
	ARGS
	MOVL $255, AX
	AXPY(OCT8, 32)
