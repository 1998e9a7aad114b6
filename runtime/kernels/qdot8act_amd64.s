//go:build !purego

#include "textflag.h"

// QuantizeActQ8's blocks of 32 (qdot8.go), AVX2: per block max|x| as the
// largest absolute value's bits (vpmaxsd on the sign-cleared bits: for
// non-negative floats the integer order is the float order), d = mx/127
// and inv = 127/mx in float32 (vdivss), Q = clamp(round(x·inv), ±127) with
// x·inv in float32 and vcvtps2dq rounding to nearest even (MXCSR
// default), Sum = d·float32(ΣQ). An all-zero block (max bits 0) gets Q, S
// and Sum zero. A block whose max is not finite or below 2^−119 (where
// 127/mx could overflow) is left to the Go loop: it is counted in bad.
// Registers: SI x, DI q, R8 s, R9 sum, CX blocks left, R10 bad; Y15 the
// abs mask, Y14 int32 127, Y13 int32 −127, Y12 the byte order, X11 127.0.

DATA q8actperm<>+0(SB)/4, $0
DATA q8actperm<>+4(SB)/4, $4
DATA q8actperm<>+8(SB)/4, $1
DATA q8actperm<>+12(SB)/4, $5
DATA q8actperm<>+16(SB)/4, $2
DATA q8actperm<>+20(SB)/4, $6
DATA q8actperm<>+24(SB)/4, $3
DATA q8actperm<>+28(SB)/4, $7
GLOBL q8actperm<>(SB), RODATA|NOPTR, $32

// func quantActQ8x32(x *float32, q *int8, s, sum *float32, nb int) (bad int)
TEXT ·quantActQ8x32(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ q+8(FP), DI
	MOVQ s+16(FP), R8
	MOVQ sum+24(FP), R9
	MOVQ nb+32(FP), CX
	XORQ R10, R10
	MOVL $0x7fffffff, AX
	VMOVD AX, X15
	VPBROADCASTD X15, Y15
	MOVL $127, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14
	MOVL $-127, AX
	VMOVD AX, X13
	VPBROADCASTD X13, Y13
	VMOVDQU q8actperm<>(SB), Y12
	MOVL $0x42fe0000, AX
	VMOVD AX, X11
	TESTQ CX, CX
	JZ   quantActQ8x32_end

quantActQ8x32_block:
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VPAND Y15, Y0, Y4
	VPAND Y15, Y1, Y5
	VPAND Y15, Y2, Y6
	VPAND Y15, Y3, Y7
	VPMAXSD Y5, Y4, Y4
	VPMAXSD Y7, Y6, Y6
	VPMAXSD Y6, Y4, Y4
	VEXTRACTI128 $1, Y4, X5
	VPMAXSD X5, X4, X4
	VPSHUFD $0x4e, X4, X5
	VPMAXSD X5, X4, X4
	VPSHUFD $0xb1, X4, X5
	VPMAXSD X5, X4, X4
	VMOVD X4, AX
	TESTL AX, AX
	JZ   quantActQ8x32_zero
	CMPL AX, $0x04000000
	JB   quantActQ8x32_bad
	CMPL AX, $0x7f800000
	JAE  quantActQ8x32_bad
	VDIVSS X4, X11, X5
	VDIVSS X11, X4, X6
	VBROADCASTSS X5, Y5
	VMULPS Y5, Y0, Y0
	VMULPS Y5, Y1, Y1
	VMULPS Y5, Y2, Y2
	VMULPS Y5, Y3, Y3
	VCVTPS2DQ Y0, Y0
	VCVTPS2DQ Y1, Y1
	VCVTPS2DQ Y2, Y2
	VCVTPS2DQ Y3, Y3
	VPMINSD Y14, Y0, Y0
	VPMINSD Y14, Y1, Y1
	VPMINSD Y14, Y2, Y2
	VPMINSD Y14, Y3, Y3
	VPMAXSD Y13, Y0, Y0
	VPMAXSD Y13, Y1, Y1
	VPMAXSD Y13, Y2, Y2
	VPMAXSD Y13, Y3, Y3
	VPADDD Y1, Y0, Y8
	VPADDD Y3, Y2, Y9
	VPADDD Y9, Y8, Y8
	VEXTRACTI128 $1, Y8, X9
	VPADDD X9, X8, X8
	VPSHUFD $0x4e, X8, X9
	VPADDD X9, X8, X8
	VPSHUFD $0xb1, X8, X9
	VPADDD X9, X8, X8
	VCVTDQ2PS X8, X8
	VMULSS X6, X8, X8
	VPACKSSDW Y1, Y0, Y0
	VPACKSSDW Y3, Y2, Y2
	VPACKSSWB Y2, Y0, Y0
	VPERMD Y0, Y12, Y0
	VMOVDQU Y0, (DI)
	VMOVSS X6, (R8)
	VMOVSS X8, (R9)
	JMP  quantActQ8x32_next

quantActQ8x32_zero:
	VPXOR Y0, Y0, Y0
	VMOVDQU Y0, (DI)
	MOVL $0, (R8)
	MOVL $0, (R9)
	JMP  quantActQ8x32_next

quantActQ8x32_bad:
	INCQ R10

quantActQ8x32_next:
	ADDQ $128, SI
	ADDQ $32, DI
	ADDQ $4, R8
	ADDQ $4, R9
	DECQ CX
	JNZ  quantActQ8x32_block

quantActQ8x32_end:
	MOVQ R10, bad+40(FP)
	VZEROUPPER
	RET
