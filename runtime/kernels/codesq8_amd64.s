//go:build !purego

#include "textflag.h"

// Four-row integer code kernels of CodeDotsQ8 (codesq8.go for the plane
// layout). Four rows' 16-byte units are loaded into the four 128-bit
// lanes of Z1 (lane l: row l), each plane extracted by a word shift and a
// byte mask and multiplied with the query plane (the same 16 bytes in
// every lane) by VPDPBUSD (unsigned codes × signed query, int32 sums,
// exact). Registers: DI out, BX qb, SI codes, CX n4, R10 u, R11 rb, R12
// 3·rb, DX sz, R8 the rows' unit pointer, R13 the query unit pointer,
// R9 = 64·u (the plane stride of qb), AX = 3·64·u, R14 the unit counter;
// Z15 the byte mask, Z13 the lane-gathering dword indices, Y10 the
// scale/zero split, X12 the query scale, X11 Σ q̃; Z0, Z4 the sums.

// LOADU: unit at R8 of the four rows into Z1.
#define LOADU \
	VMOVDQU (R8), X1; \
	VINSERTI32X4 $1, (R8)(R11*1), Z1, Z1; \
	VINSERTI32X4 $2, (R8)(R11*2), Z1, Z1; \
	VINSERTI32X4 $3, (R8)(R12*1), Z1, Z1

// PLANES2: the four 2-bit planes of Z1.
#define PLANES2 \
	VPANDD Z15, Z1, Z2; \
	VPDPBUSD (R13), Z2, Z0; \
	VPSRLW $2, Z1, Z3; \
	VPANDD Z15, Z3, Z3; \
	VPDPBUSD (R13)(R9*1), Z3, Z4; \
	VPSRLW $4, Z1, Z2; \
	VPANDD Z15, Z2, Z2; \
	VPDPBUSD (R13)(R9*2), Z2, Z0; \
	VPSRLW $6, Z1, Z3; \
	VPANDD Z15, Z3, Z3; \
	VPDPBUSD (R13)(AX*1), Z3, Z4

// PLANES4: the two 4-bit planes of Z1.
#define PLANES4 \
	VPANDD Z15, Z1, Z2; \
	VPDPBUSD (R13), Z2, Z0; \
	VPSRLW $4, Z1, Z3; \
	VPANDD Z15, Z3, Z3; \
	VPDPBUSD (R13)(R9*1), Z3, Z4

// PLANES8: the one 8-bit plane of Z1.
#define PLANES8 \
	VPDPBUSD (R13), Z1, Z0

// Unit loops over a group of four rows (UNITS of Q8DOTS, Q8DOTS4):
// PLANES per 16-byte unit with the query's unit QSTEP bytes on.
// UNITSG: any row stride (LOADU gathers each unit of the four rows).
#define UNITSG(PLANES, QSTEP) \
unit: \
	LOADU; \
	PLANES; \
	ADDQ $16, R8; \
	ADDQ $QSTEP, R13; \
	DECQ R14; \
	JNZ unit

// UNITSC1: rows of one unit, 16 bytes apart: the four rows are one load.
#define UNITSC1(PLANES, QSTEP) \
	VMOVDQU64 (R8), Z1; \
	PLANES

// UNITSC2: rows of two units, 32 bytes apart: two loads (rows 0–1 and
// 2–3), each unit's four rows gathered by one 128-bit lane shuffle.
#define UNITSC2(PLANES, QSTEP) \
	VMOVDQU64 (R8), Z8; \
	VMOVDQU64 64(R8), Z9; \
	VSHUFI64X2 $0x88, Z9, Z8, Z1; \
	PLANES; \
	ADDQ $QSTEP, R13; \
	VSHUFI64X2 $0xDD, Z9, Z8, Z1; \
	PLANES

// PF32 and PF16: the group's four scales into X1 and zeros into X2 from
// float32 sz (32 bytes) or fp16 params (16 bytes, widened exactly).
#define PF32 \
	VPERMPS (DX), Y10, Y1; \
	VEXTRACTF128 $1, Y1, X2

#define PF16 \
	VCVTPH2PS (DX), Y1; \
	VPERMPS Y1, Y10, Y1; \
	VEXTRACTF128 $1, Y1, X2

// Q8DOTS(MASKOFF, PLANES, PLOAD, PSTEP): the kernel body; MASKOFF is the
// byte offset of the mask in q8Consts, PLOAD loads a group's parameters
// (PF32, PF16) and PSTEP is their bytes per group. Each group of four rows
// first prefetches (PREFETCHT0) the codes 2 KB ahead (the lines of rows 0
// and 2) and the parameters 512 bytes ahead: with head_dim-64 2-bit rows
// streamed from DRAM (BenchmarkKVDecodeDRAM keys2/dram, three interleaved
// runs) that took the kernel from 14.1–16.1 to 20.2–21.7 GB/s (l2, the
// rows in cache: 22.6–25.3 GB/s, unchanged).
#define Q8DOTS(MASKOFF, PLANES, PLOAD, PSTEP, UNITS) \
	MOVQ out+0(FP), DI; \
	MOVQ qb+8(FP), BX; \
	MOVQ codes+16(FP), SI; \
	MOVQ n4+24(FP), CX; \
	MOVQ u+32(FP), R10; \
	MOVQ rb+40(FP), R11; \
	MOVQ sz+48(FP), DX; \
	MOVQ coef+56(FP), R13; \
	MOVQ consts+64(FP), R14; \
	VMOVDQU32 (R14), Z13; \
	VMOVDQU 64(R14), Y10; \
	VMOVDQU32 MASKOFF(R14), Z15; \
	VBROADCASTSS (R13), X12; \
	VBROADCASTSS 4(R13), X11; \
	LEAQ (R11)(R11*2), R12; \
	MOVQ R10, R9; \
	SHLQ $6, R9; \
	LEAQ (R9)(R9*2), AX; \
grp: \
	PREFETCHT0 2048(SI); \
	PREFETCHT0 2048(SI)(R11*2); \
	PREFETCHT0 512(DX); \
	VPXORD Z0, Z0, Z0; \
	VPXORD Z4, Z4, Z4; \
	MOVQ SI, R8; \
	MOVQ BX, R13; \
	MOVQ R10, R14; \
	UNITS(PLANES, 64); \
	VPADDD Z4, Z0, Z0; \
	VPSHUFD $0x4E, Z0, Z1; \
	VPADDD Z1, Z0, Z0; \
	VPSHUFD $0xB1, Z0, Z1; \
	VPADDD Z1, Z0, Z0; \
	VPERMD Z0, Z13, Z0; \
	VCVTDQ2PS X0, X0; \
	VMULPS X12, X0, X0; \
	PLOAD; \
	VFNMADD231PS X11, X2, X0; \
	VMULPS X1, X0, X0; \
	VMOVUPS X0, (DI); \
	ADDQ $16, DI; \
	ADDQ $PSTEP, DX; \
	LEAQ (SI)(R11*4), SI; \
	DECQ CX; \
	JNZ grp; \
	VZEROUPPER; \
	RET

// Four queries at once (CodeQ8Query4's layout: the four queries' copies
// of a unit 64 bytes apart, units 256 bytes apart, planes 256·u apart):
// each unit of the four rows is loaded and split into planes once and
// multiplied with every query's plane; Z16–Z19 are the queries' sums (int32
// additions are exact, so one accumulator per query gives the bits of the
// one-query kernels). R15 = 4·ldo, the bytes between two queries' out
// rows; X24–X31 the queries' scales and sums.

// DOT4(PLANE, OFF): VPDPBUSD of PLANE with the four queries' plane at OFF.
#define DOT4(PLANE, OFF) \
	VPDPBUSD OFF(R13), PLANE, Z16; \
	VPDPBUSD 64+OFF(R13), PLANE, Z17; \
	VPDPBUSD 128+OFF(R13), PLANE, Z18; \
	VPDPBUSD 192+OFF(R13), PLANE, Z19

#define DOT4I(PLANE, IDX) \
	VPDPBUSD (R13)(IDX*1), PLANE, Z16; \
	VPDPBUSD 64(R13)(IDX*1), PLANE, Z17; \
	VPDPBUSD 128(R13)(IDX*1), PLANE, Z18; \
	VPDPBUSD 192(R13)(IDX*1), PLANE, Z19

#define PLANES2X4 \
	VPANDD Z15, Z1, Z2; \
	DOT4(Z2, 0); \
	VPSRLW $2, Z1, Z3; \
	VPANDD Z15, Z3, Z3; \
	DOT4I(Z3, R9); \
	VPSRLW $4, Z1, Z5; \
	VPANDD Z15, Z5, Z5; \
	VPDPBUSD (R13)(R9*2), Z5, Z16; \
	VPDPBUSD 64(R13)(R9*2), Z5, Z17; \
	VPDPBUSD 128(R13)(R9*2), Z5, Z18; \
	VPDPBUSD 192(R13)(R9*2), Z5, Z19; \
	VPSRLW $6, Z1, Z6; \
	VPANDD Z15, Z6, Z6; \
	DOT4I(Z6, AX)

#define PLANES4X4 \
	VPANDD Z15, Z1, Z2; \
	DOT4(Z2, 0); \
	VPSRLW $4, Z1, Z3; \
	VPANDD Z15, Z3, Z3; \
	DOT4I(Z3, R9)

#define PLANES8X4 \
	DOT4(Z1, 0)

// EPI4(ZA, XA, XS, XM, OUT): query sums ZA to four scores at OUT.
#define EPI4(ZA, XA, XS, XM, OUT) \
	VPSHUFD $0x4E, ZA, Z4; \
	VPADDD Z4, ZA, ZA; \
	VPSHUFD $0xB1, ZA, Z4; \
	VPADDD Z4, ZA, ZA; \
	VPERMD ZA, Z13, ZA; \
	VCVTDQ2PS XA, XA; \
	VMULPS XS, XA, XA; \
	VFNMADD231PS XM, X2, XA; \
	VMULPS X1, XA, XA; \
	VMOVUPS XA, OUT

// Q8DOTS4: Q8DOTS for four query rows (a GQA group), with the same
// prefetch at each group of four code rows: keys2x4/dram (three
// interleaved runs) 7.9–8.5 → 8.9–9.3 GB/s, l2 8.8–9.7 either way (four
// queries per row make it compute-bound).
#define Q8DOTS4(MASKOFF, PLANES, UNITS) \
	MOVQ out+0(FP), DI; \
	MOVQ ldo+8(FP), R15; \
	SHLQ $2, R15; \
	MOVQ qb+16(FP), BX; \
	MOVQ codes+24(FP), SI; \
	MOVQ n4+32(FP), CX; \
	MOVQ u+40(FP), R10; \
	MOVQ rb+48(FP), R11; \
	MOVQ params+56(FP), DX; \
	MOVQ coef+64(FP), R13; \
	MOVQ consts+72(FP), R14; \
	VMOVDQU32 (R14), Z13; \
	VMOVDQU 64(R14), Y10; \
	VMOVDQU32 MASKOFF(R14), Z15; \
	VBROADCASTSS (R13), X24; \
	VBROADCASTSS 4(R13), X25; \
	VBROADCASTSS 8(R13), X26; \
	VBROADCASTSS 12(R13), X27; \
	VBROADCASTSS 16(R13), X28; \
	VBROADCASTSS 20(R13), X29; \
	VBROADCASTSS 24(R13), X30; \
	VBROADCASTSS 28(R13), X31; \
	LEAQ (R11)(R11*2), R12; \
	MOVQ R10, R9; \
	SHLQ $8, R9; \
	LEAQ (R9)(R9*2), AX; \
grp: \
	PREFETCHT0 2048(SI); \
	PREFETCHT0 2048(SI)(R11*2); \
	PREFETCHT0 512(DX); \
	VPXORD Z16, Z16, Z16; \
	VPXORD Z17, Z17, Z17; \
	VPXORD Z18, Z18, Z18; \
	VPXORD Z19, Z19, Z19; \
	MOVQ SI, R8; \
	MOVQ BX, R13; \
	MOVQ R10, R14; \
	UNITS(PLANES, 256); \
	PF16; \
	EPI4(Z16, X16, X24, X25, (DI)); \
	EPI4(Z17, X17, X26, X27, (DI)(R15*1)); \
	EPI4(Z18, X18, X28, X29, (DI)(R15*2)); \
	LEAQ (DI)(R15*2), R14; \
	ADDQ R15, R14; \
	EPI4(Z19, X19, X30, X31, (R14)); \
	ADDQ $16, DI; \
	ADDQ $16, DX; \
	LEAQ (SI)(R11*4), SI; \
	DECQ CX; \
	JNZ grp; \
	VZEROUPPER; \
	RET

// func codeDotsQ8b2VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)
// Requires n4 ≥ 1, u ≥ 1.
TEXT ·codeDotsQ8b2VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(96, PLANES2, PF32, 32, UNITSG)

// func codeDotsQ8b4VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8b4VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(160, PLANES4, PF32, 32, UNITSG)

// func codeDotsQ8b8VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8b8VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(96, PLANES8, PF32, 32, UNITSG)

// func codeDotsQ8F16b2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
// codeDotsQ8b2VNNI with fp16 params ([4·n4, 2]: scale, zero).
TEXT ·codeDotsQ8F16b2VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(96, PLANES2, PF16, 16, UNITSG)

// func codeDotsQ8F16b4VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16b4VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(160, PLANES4, PF16, 16, UNITSG)

// func codeDotsQ8F16b8VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16b8VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(96, PLANES8, PF16, 16, UNITSG)

// func codeDotsQ8F16x4b2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
// Requires n4 ≥ 1, u ≥ 1.
TEXT ·codeDotsQ8F16x4b2VNNI(SB), NOSPLIT, $0-80
	Q8DOTS4(96, PLANES2X4, UNITSG)

// func codeDotsQ8F16x4b4VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16x4b4VNNI(SB), NOSPLIT, $0-80
	Q8DOTS4(160, PLANES4X4, UNITSG)

// func codeDotsQ8F16x4b8VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16x4b8VNNI(SB), NOSPLIT, $0-80
	Q8DOTS4(96, PLANES8X4, UNITSG)

// Contiguous rows (rb = 16·u, u 1 or 2): the same kernels with the four
// rows' units loaded by UNITSC1 / UNITSC2 (arguments as above; u unused).

// func codeDotsQ8F16b2C1VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16b2C1VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(96, PLANES2, PF16, 16, UNITSC1)

// func codeDotsQ8F16b2C2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16b2C2VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(96, PLANES2, PF16, 16, UNITSC2)

// func codeDotsQ8F16b4C2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16b4C2VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(160, PLANES4, PF16, 16, UNITSC2)

// func codeDotsQ8F16x4b2C1VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16x4b2C1VNNI(SB), NOSPLIT, $0-80
	Q8DOTS4(96, PLANES2X4, UNITSC1)

// func codeDotsQ8F16x4b2C2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16x4b2C2VNNI(SB), NOSPLIT, $0-80
	Q8DOTS4(96, PLANES2X4, UNITSC2)

// func codeDotsQ8F16x4b4C2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8F16x4b4C2VNNI(SB), NOSPLIT, $0-80
	Q8DOTS4(160, PLANES4X4, UNITSC2)
