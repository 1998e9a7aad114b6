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

// Q8DOTS(MASKOFF, PLANES): the kernel body; MASKOFF is the byte offset
// of the mask in q8Consts.
#define Q8DOTS(MASKOFF, PLANES) \
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
	VPXORD Z0, Z0, Z0; \
	VPXORD Z4, Z4, Z4; \
	MOVQ SI, R8; \
	MOVQ BX, R13; \
	MOVQ R10, R14; \
unit: \
	LOADU; \
	PLANES; \
	ADDQ $16, R8; \
	ADDQ $64, R13; \
	DECQ R14; \
	JNZ unit; \
	VPADDD Z4, Z0, Z0; \
	VPSHUFD $0x4E, Z0, Z1; \
	VPADDD Z1, Z0, Z0; \
	VPSHUFD $0xB1, Z0, Z1; \
	VPADDD Z1, Z0, Z0; \
	VPERMD Z0, Z13, Z0; \
	VCVTDQ2PS X0, X0; \
	VMULPS X12, X0, X0; \
	VPERMPS (DX), Y10, Y1; \
	VEXTRACTF128 $1, Y1, X2; \
	VFNMADD231PS X11, X2, X0; \
	VMULPS X1, X0, X0; \
	VMOVUPS X0, (DI); \
	ADDQ $16, DI; \
	ADDQ $32, DX; \
	LEAQ (SI)(R11*4), SI; \
	DECQ CX; \
	JNZ grp; \
	VZEROUPPER; \
	RET

// func codeDotsQ8b2VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)
// Requires n4 ≥ 1, u ≥ 1.
TEXT ·codeDotsQ8b2VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(96, PLANES2)

// func codeDotsQ8b4VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8b4VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(160, PLANES4)

// func codeDotsQ8b8VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)
TEXT ·codeDotsQ8b8VNNI(SB), NOSPLIT, $0-72
	Q8DOTS(96, PLANES8)
