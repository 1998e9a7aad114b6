//go:build !purego

// AVX-512 F kernels of SoftmaxScaled (softmax.go). Pointers address
// float32 data, counts are in elements and may be any n ≥ 1: the last
// n mod 16 elements are read and written under a K1 lane mask (masked-off
// lanes are neither loaded nor stored, and cannot fault), so no Go tail
// loop is needed.

#include "textflag.h"

// exp constants, as in kernels_amd64.s (derivation in exp.go), one copy
// each: the routines broadcast them into Z16..Z27 once per call.
DATA sm512<>+0(SB)/4, $0x42b1999a  // 88.8: above it exp overflows to +Inf
DATA sm512<>+4(SB)/4, $0xc2d00000  // -104: below it exp is 0 in float32
DATA sm512<>+8(SB)/4, $0x3fb8aa3b  // log2(e)
DATA sm512<>+12(SB)/4, $0x3f318000 // ln2hi = 0.693359375
DATA sm512<>+16(SB)/4, $0xb95e8083 // ln2lo = ln(2) - ln2hi
DATA sm512<>+20(SB)/4, $0x39500d01 // 1/5040
DATA sm512<>+24(SB)/4, $0x3ab60b61 // 1/720
DATA sm512<>+28(SB)/4, $0x3c088889 // 1/120
DATA sm512<>+32(SB)/4, $0x3d2aaaab // 1/24
DATA sm512<>+36(SB)/4, $0x3e2aaaab // 1/6
DATA sm512<>+40(SB)/4, $0x3f000000 // 1/2
DATA sm512<>+44(SB)/4, $0x3f800000 // 1
DATA sm512<>+48(SB)/4, $0xff800000 // -Inf
GLOBL sm512<>(SB), RODATA|NOPTR, $52

// TAILMASK(R): K1 = lanes [0, R) for R in 1..15 (clobbers AX).
#define TAILMASK(R) \
	MOVL $1, AX; \
	SHLL R, AX; \
	DECL AX; \
	KMOVW AX, K1

// EXP512(X, N, P): X = exp(X) for 16 lanes, the same operations as
// kernels_amd64.s's EXP with one change: 2^n is applied by VSCALEFPS,
// which multiplies by 2^n with one rounding, so results are bit-identical
// to EXP's two exact factors (TestSoftmaxExp512Bits checks it). Needs the
// constants in Z16..Z27; N and P are clobbered. The clamps keep NaN
// (VMINPS/VMAXPS return their second Intel source, X, when either is NaN)
// and map -Inf to -104 (exp 0).
#define EXP512(X, N, P) \
	VMINPS X, Z16, X; \
	VMAXPS X, Z17, X; \
	VMULPS Z18, X, N; \
	VRNDSCALEPS $0, N, N; \
	VFNMADD231PS Z19, N, X; \
	VFNMADD231PS Z20, N, X; \
	VMOVAPS Z21, P; \
	VFMADD213PS Z22, X, P; \
	VFMADD213PS Z23, X, P; \
	VFMADD213PS Z24, X, P; \
	VFMADD213PS Z25, X, P; \
	VFMADD213PS Z26, X, P; \
	VFMADD213PS Z27, X, P; \
	VFMADD213PS Z27, X, P; \
	VSCALEFPS N, P, X

// func max512(x *float32, n int) float32
// max over x[0:n], n ≥ 1. A NaN element may or may not be returned (the
// Go wrapper relies on exp to spread NaN instead).
TEXT ·max512(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS sm512<>+48(SB), Z0
	VMOVAPS Z0, Z1

mx32:
	CMPQ CX, $32
	JL   mx16
	VMAXPS (SI), Z0, Z0
	VMAXPS 64(SI), Z1, Z1
	ADDQ $128, SI
	SUBQ $32, CX
	JMP  mx32

mx16:
	CMPQ CX, $16
	JL   mxTail
	VMAXPS (SI), Z0, Z0
	ADDQ $64, SI
	SUBQ $16, CX

mxTail:
	TESTQ CX, CX
	JZ    mxReduce
	TAILMASK(CX)
	VMAXPS (SI), Z1, K1, Z1

mxReduce:
	VMAXPS Z1, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+16(FP)
	RET

// func expScaleSubSum512(x *float32, n int, alpha, m float32) float32
// x[i] = exp(alpha·x[i] − m) with the argument rounded once (FMA);
// returns the float32 sum of the new values (two 16-lane accumulators).
// n ≥ 1.
TEXT ·expScaleSubSum512(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS alpha+16(FP), Z28
	VBROADCASTSS m+20(FP), Z29
	VBROADCASTSS sm512<>+0(SB), Z16
	VBROADCASTSS sm512<>+4(SB), Z17
	VBROADCASTSS sm512<>+8(SB), Z18
	VBROADCASTSS sm512<>+12(SB), Z19
	VBROADCASTSS sm512<>+16(SB), Z20
	VBROADCASTSS sm512<>+20(SB), Z21
	VBROADCASTSS sm512<>+24(SB), Z22
	VBROADCASTSS sm512<>+28(SB), Z23
	VBROADCASTSS sm512<>+32(SB), Z24
	VBROADCASTSS sm512<>+36(SB), Z25
	VBROADCASTSS sm512<>+40(SB), Z26
	VBROADCASTSS sm512<>+44(SB), Z27
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9

es32:
	CMPQ CX, $32
	JL   es16
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z4
	VFMSUB213PS Z29, Z28, Z0
	VFMSUB213PS Z29, Z28, Z4
	EXP512(Z0, Z1, Z2)
	EXP512(Z4, Z5, Z6)
	VMOVUPS Z0, (SI)
	VMOVUPS Z4, 64(SI)
	VADDPS Z0, Z8, Z8
	VADDPS Z4, Z9, Z9
	ADDQ $128, SI
	SUBQ $32, CX
	JMP  es32

es16:
	CMPQ CX, $16
	JL   esTail
	VMOVUPS (SI), Z0
	VFMSUB213PS Z29, Z28, Z0
	EXP512(Z0, Z1, Z2)
	VMOVUPS Z0, (SI)
	VADDPS Z0, Z8, Z8
	ADDQ $64, SI
	SUBQ $16, CX

esTail:
	TESTQ CX, CX
	JZ    esReduce
	TAILMASK(CX)
	VMOVUPS.Z (SI), K1, Z0
	VFMSUB213PS Z29, Z28, Z0
	EXP512(Z0, Z1, Z2)
	VMOVUPS Z0, K1, (SI)
	VADDPS Z0, Z9, K1, Z9

esReduce:
	VADDPS Z9, Z8, Z8
	VEXTRACTF64X4 $1, Z8, Y9
	VADDPS Y9, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPS X9, X8, X8
	VHADDPS X8, X8, X8
	VHADDPS X8, X8, X8
	VZEROUPPER
	MOVSS X8, ret+24(FP)
	RET

// func scale512(alpha float32, x *float32, n int)
// x[i] *= alpha, n ≥ 1.
TEXT ·scale512(SB), NOSPLIT, $0-24
	VBROADCASTSS alpha+0(FP), Z0
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX

sc32:
	CMPQ CX, $32
	JL   sc16
	VMULPS (SI), Z0, Z1
	VMULPS 64(SI), Z0, Z2
	VMOVUPS Z1, (SI)
	VMOVUPS Z2, 64(SI)
	ADDQ $128, SI
	SUBQ $32, CX
	JMP  sc32

sc16:
	CMPQ CX, $16
	JL   scTail
	VMULPS (SI), Z0, Z1
	VMOVUPS Z1, (SI)
	ADDQ $64, SI
	SUBQ $16, CX

scTail:
	TESTQ CX, CX
	JZ    scDone
	TAILMASK(CX)
	VMULPS.Z (SI), Z0, K1, Z1
	VMOVUPS Z1, K1, (SI)

scDone:
	VZEROUPPER
	RET
