//go:build !purego

// AVX2+FMA kernels for package kernels. All pointers address float32 data,
// all counts are in elements unless a name says bytes. Every routine ends
// with VZEROUPPER so that SSE code run afterwards pays no transition penalty.
// The Go wrappers in kernels_amd64.go guarantee the preconditions stated in
// each header (counts, alignment of counts to 8 where required); the
// routines themselves never read or write outside the ranges described.

#include "textflag.h"

// Eight copies of one 32-bit pattern, for full-width memory operands.
#define CONST8(name, v) \
	DATA name<>+0(SB)/4, v; \
	DATA name<>+4(SB)/4, v; \
	DATA name<>+8(SB)/4, v; \
	DATA name<>+12(SB)/4, v; \
	DATA name<>+16(SB)/4, v; \
	DATA name<>+20(SB)/4, v; \
	DATA name<>+24(SB)/4, v; \
	DATA name<>+28(SB)/4, v; \
	GLOBL name<>(SB), RODATA|NOPTR, $32

// Lane indices 0..7, compared against a broadcast remainder to build the
// VMASKMOVPS mask for a k or n tail of 1..7 elements.
DATA lanes<>+0(SB)/4, $0
DATA lanes<>+4(SB)/4, $1
DATA lanes<>+8(SB)/4, $2
DATA lanes<>+12(SB)/4, $3
DATA lanes<>+16(SB)/4, $4
DATA lanes<>+20(SB)/4, $5
DATA lanes<>+24(SB)/4, $6
DATA lanes<>+28(SB)/4, $7
GLOBL lanes<>(SB), RODATA|NOPTR, $32

// exp constants (see exp.go for the derivation).
CONST8(expHi, $0x42b1999a)   // 88.8: above it exp overflows to +Inf
CONST8(expLo, $0xc2d00000)   // -104: below it exp is 0 in float32
CONST8(log2e, $0x3fb8aa3b)   // log2(e)
CONST8(ln2hi, $0x3f318000)   // 0.693359375, exact in 9 bits
CONST8(ln2lo, $0xb95e8083)   // ln(2) - ln2hi
CONST8(expC7, $0x39500d01)   // 1/5040
CONST8(expC6, $0x3ab60b61)   // 1/720
CONST8(expC5, $0x3c088889)   // 1/120
CONST8(expC4, $0x3d2aaaab)   // 1/24
CONST8(expC3, $0x3e2aaaab)   // 1/6
CONST8(expC2, $0x3f000000)   // 1/2
CONST8(one, $0x3f800000)     // 1.0
CONST8(bias, $0x0000007f)    // float32 exponent bias 127 (integer lanes)
CONST8(signbit, $0x80000000) // sign bit

// MASK(R, X, Y): Y = lane mask with lanes [0, R) set, where R holds 0..8
// and X is the low half of Y.
#define MASK(R, X, Y) \
	VMOVQ R, X; \
	VPBROADCASTD X, Y; \
	VPCMPGTD lanes<>(SB), Y, Y

// EXP(X, T1, T2, T3): X = exp(X) for 8 float32 lanes; T1..T3 are clobbered.
// Input is clamped to [-104, 88.8] with the NaN-propagating operand order
// (VMINPS/VMAXPS return their memory/second Intel operand when either is
// NaN, and X is placed there). n = round(x·log2 e); r = x − n·ln2 with ln2
// split hi+lo (Cody–Waite); e^r by its degree-7 Taylor polynomial (|r| ≤
// ln2/2, truncation < 6e-9 relative); 2^n applied as 2^(n>>1)·2^(n−(n>>1))
// so both factors are normal floats over the whole clamped range, which
// gives correct gradual underflow and overflow to +Inf.
#define EXP(X, T1, T2, T3) \
	VMOVUPS expHi<>(SB), T1; \
	VMINPS X, T1, X; \
	VMOVUPS expLo<>(SB), T1; \
	VMAXPS X, T1, X; \
	VMULPS log2e<>(SB), X, T1; \
	VROUNDPS $0, T1, T1; \
	VFNMADD231PS ln2hi<>(SB), T1, X; \
	VFNMADD231PS ln2lo<>(SB), T1, X; \
	VMOVUPS expC7<>(SB), T2; \
	VFMADD213PS expC6<>(SB), X, T2; \
	VFMADD213PS expC5<>(SB), X, T2; \
	VFMADD213PS expC4<>(SB), X, T2; \
	VFMADD213PS expC3<>(SB), X, T2; \
	VFMADD213PS expC2<>(SB), X, T2; \
	VFMADD213PS one<>(SB), X, T2; \
	VFMADD213PS one<>(SB), X, T2; \
	VCVTPS2DQ T1, T1; \
	VPSRAD $1, T1, T3; \
	VPSUBD T3, T1, T1; \
	VPADDD bias<>(SB), T3, T3; \
	VPSLLD $23, T3, T3; \
	VPADDD bias<>(SB), T1, T1; \
	VPSLLD $23, T1, T1; \
	VMULPS T3, T2, T2; \
	VMULPS T1, T2, X

// func dotAVX2(a, b *float32, n int) float32
// n is a multiple of 8 (may be 0).
TEXT ·dotAVX2(SB), NOSPLIT, $0-28
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	CMPQ CX, $32
	JL   dot8

dot32:
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	VFMADD231PS 64(DI), Y6, Y2
	VFMADD231PS 96(DI), Y7, Y3
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	CMPQ CX, $32
	JGE  dot32

dot8:
	CMPQ CX, $8
	JL   dotReduce
	VMOVUPS (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  dot8

dotReduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func axpyAVX2(alpha float32, x, y *float32, n int)
// y[i] += alpha*x[i]; n is a multiple of 8.
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	VBROADCASTSS alpha+0(FP), Y0
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DI
	MOVQ n+24(FP), CX
	CMPQ CX, $32
	JL   axpy8

axpy32:
	VMOVUPS (SI), Y1
	VMOVUPS 32(SI), Y2
	VMOVUPS 64(SI), Y3
	VMOVUPS 96(SI), Y4
	VFMADD213PS (DI), Y0, Y1
	VFMADD213PS 32(DI), Y0, Y2
	VFMADD213PS 64(DI), Y0, Y3
	VFMADD213PS 96(DI), Y0, Y4
	VMOVUPS Y1, (DI)
	VMOVUPS Y2, 32(DI)
	VMOVUPS Y3, 64(DI)
	VMOVUPS Y4, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	CMPQ CX, $32
	JGE  axpy32

axpy8:
	CMPQ CX, $8
	JL   axpyDone
	VMOVUPS (SI), Y1
	VFMADD213PS (DI), Y0, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  axpy8

axpyDone:
	VZEROUPPER
	RET

// func scaleMulAVX2(out, x, w *float32, n int, s float32)
// out[i] = s*x[i]*w[i]; out may alias x; n is a multiple of 8.
TEXT ·scaleMulAVX2(SB), NOSPLIT, $0-36
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSS s+32(FP), Y0

smul8:
	CMPQ CX, $8
	JL   smulDone
	VMULPS (SI), Y0, Y1
	VMULPS (DX), Y1, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  smul8

smulDone:
	VZEROUPPER
	RET

// func scaleAVX2(alpha float32, x *float32, n int)
// x[i] *= alpha; n is a multiple of 8.
TEXT ·scaleAVX2(SB), NOSPLIT, $0-24
	VBROADCASTSS alpha+0(FP), Y0
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	CMPQ CX, $32
	JL   scale8

scale32:
	VMULPS (SI), Y0, Y1
	VMULPS 32(SI), Y0, Y2
	VMULPS 64(SI), Y0, Y3
	VMULPS 96(SI), Y0, Y4
	VMOVUPS Y1, (SI)
	VMOVUPS Y2, 32(SI)
	VMOVUPS Y3, 64(SI)
	VMOVUPS Y4, 96(SI)
	ADDQ $128, SI
	SUBQ $32, CX
	CMPQ CX, $32
	JGE  scale32

scale8:
	CMPQ CX, $8
	JL   scaleDone
	VMULPS (SI), Y0, Y1
	VMOVUPS Y1, (SI)
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  scale8

scaleDone:
	VZEROUPPER
	RET

// func maxAVX2(x *float32, n int) float32
// max over x[0:n]; n is a positive multiple of 8. NaN handling is not
// specified (the Go wrapper documents it).
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VMOVUPS (SI), Y0
	VMOVAPS Y0, Y1
	ADDQ $32, SI
	SUBQ $8, CX

max16:
	CMPQ CX, $16
	JL   max8
	VMAXPS (SI), Y0, Y0
	VMAXPS 32(SI), Y1, Y1
	ADDQ $64, SI
	SUBQ $16, CX
	JMP  max16

max8:
	CMPQ CX, $8
	JL   maxReduce
	VMAXPS (SI), Y0, Y0

maxReduce:
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

// func expAVX2(x *float32, n int)
// x[i] = exp(x[i]); n is a multiple of 8.
TEXT ·expAVX2(SB), NOSPLIT, $0-16
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX

exp16:
	CMPQ CX, $16
	JL   exp8
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y4
	EXP(Y0, Y1, Y2, Y3)
	EXP(Y4, Y5, Y6, Y7)
	VMOVUPS Y0, (SI)
	VMOVUPS Y4, 32(SI)
	ADDQ $64, SI
	SUBQ $16, CX
	JMP  exp16

exp8:
	CMPQ CX, $8
	JL   expDone
	VMOVUPS (SI), Y0
	EXP(Y0, Y1, Y2, Y3)
	VMOVUPS Y0, (SI)

expDone:
	VZEROUPPER
	RET

// func expScaleSubSumAVX2(x *float32, n int, alpha, m float32) float32
// x[i] = exp(alpha·x[i] − m) with the argument rounded once (FMA; for
// alpha = 1 that is the float32 difference x[i] − m); returns the float32
// sum of the new values (two vector accumulators). n is a multiple of 8.
TEXT ·expScaleSubSumAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS alpha+16(FP), Y11
	VBROADCASTSS m+20(FP), Y10
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9

ess16:
	CMPQ CX, $16
	JL   ess8
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y4
	VFMSUB213PS Y10, Y11, Y0
	VFMSUB213PS Y10, Y11, Y4
	EXP(Y0, Y1, Y2, Y3)
	EXP(Y4, Y5, Y6, Y7)
	VMOVUPS Y0, (SI)
	VMOVUPS Y4, 32(SI)
	VADDPS Y0, Y8, Y8
	VADDPS Y4, Y9, Y9
	ADDQ $64, SI
	SUBQ $16, CX
	JMP  ess16

ess8:
	CMPQ CX, $8
	JL   essReduce
	VMOVUPS (SI), Y0
	VFMSUB213PS Y10, Y11, Y0
	EXP(Y0, Y1, Y2, Y3)
	VMOVUPS Y0, (SI)
	VADDPS Y0, Y8, Y8

essReduce:
	VADDPS Y9, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPS X9, X8, X8
	VHADDPS X8, X8, X8
	VHADDPS X8, X8, X8
	VZEROUPPER
	MOVSS X8, ret+24(FP)
	RET

// func siluMulAVX2(gate, up *float32, n int)
// gate[i] = gate[i]/(1+exp(-gate[i])) * up[i]; n is a multiple of 8.
TEXT ·siluMulAVX2(SB), NOSPLIT, $0-24
	MOVQ gate+0(FP), SI
	MOVQ up+8(FP), DI
	MOVQ n+16(FP), CX

silu16:
	CMPQ CX, $16
	JL   silu8
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y5
	VXORPS signbit<>(SB), Y0, Y1
	VXORPS signbit<>(SB), Y5, Y6
	EXP(Y1, Y2, Y3, Y4)
	EXP(Y6, Y7, Y8, Y9)
	VADDPS one<>(SB), Y1, Y1
	VADDPS one<>(SB), Y6, Y6
	VDIVPS Y1, Y0, Y0
	VDIVPS Y6, Y5, Y5
	VMULPS (DI), Y0, Y0
	VMULPS 32(DI), Y5, Y5
	VMOVUPS Y0, (SI)
	VMOVUPS Y5, 32(SI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  silu16

silu8:
	CMPQ CX, $8
	JL   siluDone
	VMOVUPS (SI), Y0
	VXORPS signbit<>(SB), Y0, Y1
	EXP(Y1, Y2, Y3, Y4)
	VADDPS one<>(SB), Y1, Y1
	VDIVPS Y1, Y0, Y0
	VMULPS (DI), Y0, Y0
	VMOVUPS Y0, (SI)

siluDone:
	VZEROUPPER
	RET

// func gemv4AVX2(x, w *float32, ldw, k int, y *float32, nt, rs, ys int)
// For t in [0, nt) and r in [0, 4):
//   y[t + r·ys] = Σ_{p<k} x[p]·w[t·ldw + r·rs + p].
// Four rows of w, rs elements apart, share every load of x; two 8-lane
// accumulators per row (16 k per iteration); FMAs take w straight from
// memory. The decode GEMV calls it with rs = (n/4)·ldw, so the four rows
// are a quarter of the matrix apart and memory is read as four long
// sequential streams, which measured about twice the DRAM bandwidth of
// four adjacent rows (see doc.go). A k tail of 1..7 uses masked loads,
// which never touch memory past the last element. nt ≥ 1, k ≥ 1.
TEXT ·gemv4AVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), R8
	MOVQ w+8(FP), R10
	MOVQ ldw+16(FP), R11
	SHLQ $2, R11
	MOVQ k+24(FP), CX
	MOVQ y+32(FP), R12
	MOVQ nt+40(FP), DI
	MOVQ rs+48(FP), R9
	SHLQ $2, R9
	MOVQ ys+56(FP), R13
	SHLQ $2, R13
	MOVQ CX, AX
	ANDQ $7, AX
	MASK(AX, X15, Y15)

gvTile:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	MOVQ R8, SI
	MOVQ R10, BX
	LEAQ (R10)(R9*2), DX
	ADDQ R9, DX
	MOVQ CX, AX
	SHRQ $4, AX
	JZ   gv8

gv16:
	VMOVUPS (SI), Y8
	VMOVUPS 32(SI), Y9
	VFMADD231PS (BX), Y8, Y0
	VFMADD231PS 32(BX), Y9, Y1
	VFMADD231PS (BX)(R9*1), Y8, Y2
	VFMADD231PS 32(BX)(R9*1), Y9, Y3
	VFMADD231PS (BX)(R9*2), Y8, Y4
	VFMADD231PS 32(BX)(R9*2), Y9, Y5
	VFMADD231PS (DX), Y8, Y6
	VFMADD231PS 32(DX), Y9, Y7
	ADDQ $64, SI
	ADDQ $64, BX
	ADDQ $64, DX
	DECQ AX
	JNZ  gv16

gv8:
	TESTQ $8, CX
	JZ    gvRem
	VMOVUPS (SI), Y8
	VFMADD231PS (BX), Y8, Y0
	VFMADD231PS (BX)(R9*1), Y8, Y2
	VFMADD231PS (BX)(R9*2), Y8, Y4
	VFMADD231PS (DX), Y8, Y6
	ADDQ $32, SI
	ADDQ $32, BX
	ADDQ $32, DX

gvRem:
	TESTQ $7, CX
	JZ    gvReduce
	VMASKMOVPS (SI), Y15, Y8
	VMASKMOVPS (BX), Y15, Y9
	VFMADD231PS Y9, Y8, Y1
	VMASKMOVPS (BX)(R9*1), Y15, Y9
	VFMADD231PS Y9, Y8, Y3
	VMASKMOVPS (BX)(R9*2), Y15, Y9
	VFMADD231PS Y9, Y8, Y5
	VMASKMOVPS (DX), Y15, Y9
	VFMADD231PS Y9, Y8, Y7

gvReduce:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y5, Y4, Y4
	VADDPS Y7, Y6, Y6
	VHADDPS Y2, Y0, Y0
	VHADDPS Y6, Y4, Y4
	VHADDPS Y4, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	LEAQ (R12)(R13*2), DX
	ADDQ R13, DX
	VMOVSS X0, (R12)
	VEXTRACTPS $1, X0, (R12)(R13*1)
	VEXTRACTPS $2, X0, (R12)(R13*2)
	VEXTRACTPS $3, X0, (DX)
	ADDQ $4, R12
	ADDQ R11, R10
	DECQ DI
	JNZ  gvTile
	VZEROUPPER
	RET

// One 8-wide k step of the 4x3 NT micro-kernel at byte offset off: three
// rows of w in Y12..Y14, each of the four rows of x in turn in Y15, and
// acc[i][j] in Y(3i+j).
#define NT43STEP(off) \
	VMOVUPS off(BX), Y12; \
	VMOVUPS off(BX)(R11*1), Y13; \
	VMOVUPS off(BX)(R11*2), Y14; \
	VMOVUPS off(SI), Y15; \
	VFMADD231PS Y12, Y15, Y0; \
	VFMADD231PS Y13, Y15, Y1; \
	VFMADD231PS Y14, Y15, Y2; \
	VMOVUPS off(SI)(R9*1), Y15; \
	VFMADD231PS Y12, Y15, Y3; \
	VFMADD231PS Y13, Y15, Y4; \
	VFMADD231PS Y14, Y15, Y5; \
	VMOVUPS off(SI)(R9*2), Y15; \
	VFMADD231PS Y12, Y15, Y6; \
	VFMADD231PS Y13, Y15, Y7; \
	VFMADD231PS Y14, Y15, Y8; \
	VMOVUPS off(DX), Y15; \
	VFMADD231PS Y12, Y15, Y9; \
	VFMADD231PS Y13, Y15, Y10; \
	VFMADD231PS Y14, Y15, Y11

// Masked tail column j of the 4x3 kernel: w row at wrow (already masked
// into Y12 by the caller's macro), x rows masked into Y13.
#define NT43TAILCOL(wrow, a0, a1, a2, a3) \
	VMASKMOVPS wrow, Y15, Y12; \
	VMASKMOVPS (SI), Y15, Y13; \
	VFMADD231PS Y12, Y13, a0; \
	VMASKMOVPS (SI)(R9*1), Y15, Y13; \
	VFMADD231PS Y12, Y13, a1; \
	VMASKMOVPS (SI)(R9*2), Y15, Y13; \
	VFMADD231PS Y12, Y13, a2; \
	VMASKMOVPS (DX), Y15, Y13; \
	VFMADD231PS Y12, Y13, a3

// Reduce the three accumulators of one row to [s0, s1, s2, s2] in XA
// (A, B, C are clobbered).
#define NT43ROW(A, B, C, XA, XC) \
	VHADDPS B, A, A; \
	VHADDPS C, C, C; \
	VHADDPS C, A, A; \
	VEXTRACTF128 $1, A, XC; \
	VADDPS XC, XA, XA

// XA[0:3] += the three floats at lo (two) and hi (one); T is clobbered.
#define NT43LOADADD(lo, hi, XA, T) \
	VMOVSD lo, T; \
	VINSERTPS $0x20, hi, T, T; \
	VADDPS T, XA, XA

// func gemmNT4x3AVX2(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k, nt, acc int)
// For t in [0, nt), i in [0, 4), j in [0, 3):
//   y[i·ldy + 3t+j] = (acc ? y[i·ldy + 3t+j] : 0) + Σ_{p<k} x[i·ldx+p]·w[(3t+j)·ldw+p].
// Twelve 8-lane accumulators reduce along k (dot-product form, which suits
// the NT layout: both operands are contiguous in k); w rows are held in
// registers and each x row is loaded once per 8 k, so one k step costs 7
// loads for 12 FMAs. The four x rows stay in L1 while t walks over w; acc
// lets the driver split long k into L1-sized slices. nt ≥ 1, k ≥ 1.
TEXT ·gemmNT4x3AVX2(SB), NOSPLIT, $0-72
	MOVQ x+0(FP), R8
	MOVQ ldx+8(FP), R9
	SHLQ $2, R9
	MOVQ w+16(FP), R10
	MOVQ ldw+24(FP), R11
	SHLQ $2, R11
	MOVQ y+32(FP), R12
	MOVQ ldy+40(FP), R13
	SHLQ $2, R13
	MOVQ k+48(FP), CX
	MOVQ nt+56(FP), DI

ntTile:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	MOVQ R8, SI
	LEAQ (R8)(R9*2), DX
	ADDQ R9, DX
	MOVQ R10, BX
	MOVQ CX, AX
	SHRQ $4, AX
	JZ   nt8

nt16:
	NT43STEP(0)
	NT43STEP(32)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, BX
	DECQ AX
	JNZ  nt16

nt8:
	TESTQ $8, CX
	JZ    ntRem
	NT43STEP(0)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, BX

ntRem:
	TESTQ $7, CX
	JZ    ntReduce
	MOVQ CX, AX
	ANDQ $7, AX
	MASK(AX, X15, Y15)
	NT43TAILCOL((BX), Y0, Y3, Y6, Y9)
	NT43TAILCOL((BX)(R11*1), Y1, Y4, Y7, Y10)
	NT43TAILCOL((BX)(R11*2), Y2, Y5, Y8, Y11)

ntReduce:
	LEAQ (R12)(R13*2), DX
	ADDQ R13, DX
	MOVQ acc+64(FP), AX
	NT43ROW(Y0, Y1, Y2, X0, X2)
	NT43ROW(Y3, Y4, Y5, X3, X5)
	NT43ROW(Y6, Y7, Y8, X6, X8)
	NT43ROW(Y9, Y10, Y11, X9, X11)
	TESTQ AX, AX
	JZ    ntStore
	NT43LOADADD((R12), 8(R12), X0, X1)
	NT43LOADADD((R12)(R13*1), 8(R12)(R13*1), X3, X4)
	NT43LOADADD((R12)(R13*2), 8(R12)(R13*2), X6, X7)
	NT43LOADADD((DX), 8(DX), X9, X10)

ntStore:
	VMOVSD X0, (R12)
	VEXTRACTPS $2, X0, 8(R12)
	VMOVSD X3, (R12)(R13*1)
	VEXTRACTPS $2, X3, 8(R12)(R13*1)
	VMOVSD X6, (R12)(R13*2)
	VEXTRACTPS $2, X6, 8(R12)(R13*2)
	VMOVSD X9, (DX)
	VEXTRACTPS $2, X9, 8(DX)
	ADDQ $12, R12
	LEAQ (R10)(R11*2), R10
	ADDQ R11, R10
	DECQ DI
	JNZ  ntTile
	VZEROUPPER
	RET

// func gemmNN6x16AVX2(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k, nt int)
// For t in [0, nt), i in [0, 6), c in [0, 16):
//   y[i·ldy + 16t+c] = Σ_{p<k} x[i·ldx+p]·w[p·ldw + 16t+c]   (overwrites y).
// Broadcast-FMA form: per p, two 8-lane loads of a w row and one broadcast
// per x row feed twelve accumulators. nt ≥ 1, k ≥ 1.
TEXT ·gemmNN6x16AVX2(SB), NOSPLIT, $0-64
	MOVQ x+0(FP), R8
	MOVQ ldx+8(FP), R9
	SHLQ $2, R9
	MOVQ w+16(FP), R10
	MOVQ ldw+24(FP), R11
	SHLQ $2, R11
	MOVQ y+32(FP), R12
	MOVQ ldy+40(FP), R13
	SHLQ $2, R13
	MOVQ k+48(FP), CX
	MOVQ nt+56(FP), DI

nnTile:
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	MOVQ R8, SI
	LEAQ (R8)(R9*2), DX
	ADDQ R9, DX
	MOVQ R10, BX
	MOVQ CX, AX

nnLoop:
	VMOVUPS (BX), Y12
	VMOVUPS 32(BX), Y13
	VBROADCASTSS (SI), Y14
	VFMADD231PS Y12, Y14, Y0
	VFMADD231PS Y13, Y14, Y1
	VBROADCASTSS (SI)(R9*1), Y15
	VFMADD231PS Y12, Y15, Y2
	VFMADD231PS Y13, Y15, Y3
	VBROADCASTSS (SI)(R9*2), Y14
	VFMADD231PS Y12, Y14, Y4
	VFMADD231PS Y13, Y14, Y5
	VBROADCASTSS (DX), Y15
	VFMADD231PS Y12, Y15, Y6
	VFMADD231PS Y13, Y15, Y7
	VBROADCASTSS (DX)(R9*1), Y14
	VFMADD231PS Y12, Y14, Y8
	VFMADD231PS Y13, Y14, Y9
	VBROADCASTSS (DX)(R9*2), Y15
	VFMADD231PS Y12, Y15, Y10
	VFMADD231PS Y13, Y15, Y11
	ADDQ $4, SI
	ADDQ $4, DX
	ADDQ R11, BX
	DECQ AX
	JNZ  nnLoop

	LEAQ (R12)(R13*2), DX
	ADDQ R13, DX
	VMOVUPS Y0, (R12)
	VMOVUPS Y1, 32(R12)
	VMOVUPS Y2, (R12)(R13*1)
	VMOVUPS Y3, 32(R12)(R13*1)
	VMOVUPS Y4, (R12)(R13*2)
	VMOVUPS Y5, 32(R12)(R13*2)
	VMOVUPS Y6, (DX)
	VMOVUPS Y7, 32(DX)
	VMOVUPS Y8, (DX)(R13*1)
	VMOVUPS Y9, 32(DX)(R13*1)
	VMOVUPS Y10, (DX)(R13*2)
	VMOVUPS Y11, 32(DX)(R13*2)
	ADDQ $64, R12
	ADDQ $64, R10
	DECQ DI
	JNZ  nnTile
	VZEROUPPER
	RET

// func gemmNN1AVX2(x, w *float32, ldw int, y *float32, k, n int)
// y[c] = Σ_{p<k} x[p]·w[p·ldw+c] for c in [0, n) (overwrites y). Columns go
// in blocks of 32 (four accumulators), then 8, then a masked block of 1..7
// that neither reads nor writes past column n. k ≥ 1.
TEXT ·gemmNN1AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), R8
	MOVQ w+8(FP), R10
	MOVQ ldw+16(FP), R11
	SHLQ $2, R11
	MOVQ y+24(FP), R12
	MOVQ k+32(FP), CX
	MOVQ n+40(FP), DI

nn1Block32:
	CMPQ DI, $32
	JL   nn1Block8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	MOVQ R8, SI
	MOVQ R10, BX
	MOVQ CX, AX

nn1Loop32:
	VBROADCASTSS (SI), Y8
	VFMADD231PS (BX), Y8, Y0
	VFMADD231PS 32(BX), Y8, Y1
	VFMADD231PS 64(BX), Y8, Y2
	VFMADD231PS 96(BX), Y8, Y3
	ADDQ $4, SI
	ADDQ R11, BX
	DECQ AX
	JNZ  nn1Loop32
	VMOVUPS Y0, (R12)
	VMOVUPS Y1, 32(R12)
	VMOVUPS Y2, 64(R12)
	VMOVUPS Y3, 96(R12)
	ADDQ $128, R12
	ADDQ $128, R10
	SUBQ $32, DI
	JMP  nn1Block32

nn1Block8:
	CMPQ DI, $8
	JL   nn1Rem
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	MOVQ R8, SI
	MOVQ R10, BX
	MOVQ CX, AX

nn1Loop8:
	VBROADCASTSS (SI), Y8
	VFMADD231PS (BX), Y8, Y0
	ADDQ $4, SI
	ADDQ R11, BX
	DECQ AX
	JNZ  nn1Loop8
	VMOVUPS Y0, (R12)
	ADDQ $32, R12
	ADDQ $32, R10
	SUBQ $8, DI
	JMP  nn1Block8

nn1Rem:
	TESTQ DI, DI
	JZ    nn1Done
	MASK(DI, X15, Y15)
	VXORPS Y0, Y0, Y0
	MOVQ R8, SI
	MOVQ R10, BX
	MOVQ CX, AX

nn1LoopRem:
	VBROADCASTSS (SI), Y8
	VMASKMOVPS (BX), Y15, Y9
	VFMADD231PS Y9, Y8, Y0
	ADDQ $4, SI
	ADDQ R11, BX
	DECQ AX
	JNZ  nn1LoopRem
	VMASKMOVPS Y0, Y15, (R12)

nn1Done:
	VZEROUPPER
	RET
