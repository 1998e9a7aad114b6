//go:build !purego

#include "textflag.h"

// Code generated from one template (BF16 and F16 differ only in how a row
// of w is widened); keep the two functions in step.

// func gemvNT8BF16AVX2(x *float32, w *uint16, k int, y *float32, nt, ldw, rs, ys, acc int)
// func gemvNT8F16AVX2(x *float32, w *uint16, k int, y *float32, nt, ldw, rs, ys, acc int)
// gemvNT8AVX2 (rows_amd64.s) with w 16-bit floats (bfloat16: VPMOVZXWD and
// VPSLLD $16; IEEE binary16: VCVTPH2PS), widened exactly to float32 before
// each VFMADD231PS. For t in [0, nt) and r in [0, 8):
//   y[t + r·ys] = (acc ? y[t + r·ys] : 0) + Σ_{p<k} x[p]·w[t·ldw + r·rs + p]
// summed exactly as gemvNT8AVX2 sums the widened row: one 8-lane
// accumulator over the 8-wide k steps in order, a k tail of t = k%8
// elements in the same accumulator (x by a masked load, w by a 16-byte
// load ending at the row's end shuffled down with zeros above t), then
// ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). So every output has the bits
// MatMulNTRows gives on the widened float32 matrix. rs = 0 and ys = 0 alias
// the eight rows. nt ≥ 1, k ≥ 1, and k ≥ 8 when k%8 ≠ 0 (the tail load
// reads the 16 bytes before the row's end).
TEXT ·gemvNT8BF16AVX2(SB), NOSPLIT, $0-72
	MOVQ x+0(FP), R8
	MOVQ w+8(FP), R10
	MOVQ y+24(FP), R12
	MOVQ nt+32(FP), DI
	MOVQ ldw+40(FP), R11
	SHLQ $1, R11
	MOVQ rs+48(FP), R9
	SHLQ $1, R9
	MOVQ ys+56(FP), R13
	SHLQ $2, R13
	MOVQ k+16(FP), CX
	ANDQ $7, CX
	VMOVQ CX, X15
	VPBROADCASTD X15, Y15
	VPCMPGTD halfLanes<>(SB), Y15, Y15
	// X14: the tail's byte shuffle (halfTail<> row t = k%8); R14 = 2t−16,
	// the offset that makes a 16-byte load end at the row's end.
	LEAQ halfTail<>(SB), R14
	MOVQ CX, AX
	SHLQ $4, AX
	VMOVDQU (R14)(AX*1), X14
	LEAQ -16(CX)(CX*1), R14

BF16Tile:
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
	ADDQ R9, DX        // row 3
	LEAQ (DX)(R9*2), AX
	ADDQ R9, AX        // row 6
	MOVQ k+16(FP), CX
	SHRQ $3, CX
	JZ   BF16Rem

BF16Loop:
	VMOVUPS (SI), Y8
	VPMOVZXWD (BX), Y9
	VPSLLD $16, Y9, Y9
	VPMOVZXWD (BX)(R9*1), Y10
	VPSLLD $16, Y10, Y10
	VFMADD231PS Y9, Y8, Y0
	VFMADD231PS Y10, Y8, Y1
	VPMOVZXWD (BX)(R9*2), Y9
	VPSLLD $16, Y9, Y9
	VPMOVZXWD (DX), Y10
	VPSLLD $16, Y10, Y10
	VFMADD231PS Y9, Y8, Y2
	VFMADD231PS Y10, Y8, Y3
	VPMOVZXWD (DX)(R9*1), Y9
	VPSLLD $16, Y9, Y9
	VPMOVZXWD (DX)(R9*2), Y10
	VPSLLD $16, Y10, Y10
	VFMADD231PS Y9, Y8, Y4
	VFMADD231PS Y10, Y8, Y5
	VPMOVZXWD (AX), Y9
	VPSLLD $16, Y9, Y9
	VPMOVZXWD (AX)(R9*1), Y10
	VPSLLD $16, Y10, Y10
	VFMADD231PS Y9, Y8, Y6
	VFMADD231PS Y10, Y8, Y7
	ADDQ $32, SI
	ADDQ $16, BX
	ADDQ $16, DX
	ADDQ $16, AX
	DECQ CX
	JNZ  BF16Loop

BF16Rem:
	MOVQ k+16(FP), CX
	TESTQ $7, CX
	JZ    BF16Reduce
	VMASKMOVPS (SI), Y15, Y8
	ADDQ R14, BX
	ADDQ R14, DX
	ADDQ R14, AX
	VMOVDQU (BX), X9
	VPSHUFB X14, X9, X9
	VPMOVZXWD X9, Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y0
	VMOVDQU (BX)(R9*1), X9
	VPSHUFB X14, X9, X9
	VPMOVZXWD X9, Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y1
	VMOVDQU (BX)(R9*2), X9
	VPSHUFB X14, X9, X9
	VPMOVZXWD X9, Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y2
	VMOVDQU (DX), X9
	VPSHUFB X14, X9, X9
	VPMOVZXWD X9, Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y3
	VMOVDQU (DX)(R9*1), X9
	VPSHUFB X14, X9, X9
	VPMOVZXWD X9, Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y4
	VMOVDQU (DX)(R9*2), X9
	VPSHUFB X14, X9, X9
	VPMOVZXWD X9, Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y5
	VMOVDQU (AX), X9
	VPSHUFB X14, X9, X9
	VPMOVZXWD X9, Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y6
	VMOVDQU (AX)(R9*1), X9
	VPSHUFB X14, X9, X9
	VPMOVZXWD X9, Y9
	VPSLLD $16, Y9, Y9
	VFMADD231PS Y9, Y8, Y7

BF16Reduce:
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	LEAQ (R12)(R13*2), DX
	ADDQ R13, DX       // output 3
	LEAQ (DX)(R13*2), AX
	ADDQ R13, AX       // output 6
	MOVQ acc+64(FP), CX
	TESTQ CX, CX
	JZ    BF16Store
	VMOVSS (R12), X9
	VINSERTPS $0x10, (R12)(R13*1), X9, X9
	VINSERTPS $0x20, (R12)(R13*2), X9, X9
	VINSERTPS $0x30, (DX), X9, X9
	VMOVSS (R12)(R13*4), X10
	VINSERTPS $0x10, (DX)(R13*2), X10, X10
	VINSERTPS $0x20, (AX), X10, X10
	VINSERTPS $0x30, (AX)(R13*1), X10, X10
	VADDPS X9, X0, X0
	VADDPS X10, X4, X4

BF16Store:
	VMOVSS X0, (R12)
	VEXTRACTPS $1, X0, (R12)(R13*1)
	VEXTRACTPS $2, X0, (R12)(R13*2)
	VEXTRACTPS $3, X0, (DX)
	VMOVSS X4, (R12)(R13*4)
	VEXTRACTPS $1, X4, (DX)(R13*2)
	VEXTRACTPS $2, X4, (AX)
	VEXTRACTPS $3, X4, (AX)(R13*1)
	ADDQ $4, R12
	ADDQ R11, R10
	DECQ DI
	JNZ  BF16Tile
	VZEROUPPER
	RET

TEXT ·gemvNT8F16AVX2(SB), NOSPLIT, $0-72
	MOVQ x+0(FP), R8
	MOVQ w+8(FP), R10
	MOVQ y+24(FP), R12
	MOVQ nt+32(FP), DI
	MOVQ ldw+40(FP), R11
	SHLQ $1, R11
	MOVQ rs+48(FP), R9
	SHLQ $1, R9
	MOVQ ys+56(FP), R13
	SHLQ $2, R13
	MOVQ k+16(FP), CX
	ANDQ $7, CX
	VMOVQ CX, X15
	VPBROADCASTD X15, Y15
	VPCMPGTD halfLanes<>(SB), Y15, Y15
	// X14: the tail's byte shuffle (halfTail<> row t = k%8); R14 = 2t−16,
	// the offset that makes a 16-byte load end at the row's end.
	LEAQ halfTail<>(SB), R14
	MOVQ CX, AX
	SHLQ $4, AX
	VMOVDQU (R14)(AX*1), X14
	LEAQ -16(CX)(CX*1), R14

F16Tile:
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
	ADDQ R9, DX        // row 3
	LEAQ (DX)(R9*2), AX
	ADDQ R9, AX        // row 6
	MOVQ k+16(FP), CX
	SHRQ $3, CX
	JZ   F16Rem

F16Loop:
	VMOVUPS (SI), Y8
	VCVTPH2PS (BX), Y9
	VCVTPH2PS (BX)(R9*1), Y10
	VFMADD231PS Y9, Y8, Y0
	VFMADD231PS Y10, Y8, Y1
	VCVTPH2PS (BX)(R9*2), Y9
	VCVTPH2PS (DX), Y10
	VFMADD231PS Y9, Y8, Y2
	VFMADD231PS Y10, Y8, Y3
	VCVTPH2PS (DX)(R9*1), Y9
	VCVTPH2PS (DX)(R9*2), Y10
	VFMADD231PS Y9, Y8, Y4
	VFMADD231PS Y10, Y8, Y5
	VCVTPH2PS (AX), Y9
	VCVTPH2PS (AX)(R9*1), Y10
	VFMADD231PS Y9, Y8, Y6
	VFMADD231PS Y10, Y8, Y7
	ADDQ $32, SI
	ADDQ $16, BX
	ADDQ $16, DX
	ADDQ $16, AX
	DECQ CX
	JNZ  F16Loop

F16Rem:
	MOVQ k+16(FP), CX
	TESTQ $7, CX
	JZ    F16Reduce
	VMASKMOVPS (SI), Y15, Y8
	ADDQ R14, BX
	ADDQ R14, DX
	ADDQ R14, AX
	VMOVDQU (BX), X9
	VPSHUFB X14, X9, X9
	VCVTPH2PS X9, Y9
	VFMADD231PS Y9, Y8, Y0
	VMOVDQU (BX)(R9*1), X9
	VPSHUFB X14, X9, X9
	VCVTPH2PS X9, Y9
	VFMADD231PS Y9, Y8, Y1
	VMOVDQU (BX)(R9*2), X9
	VPSHUFB X14, X9, X9
	VCVTPH2PS X9, Y9
	VFMADD231PS Y9, Y8, Y2
	VMOVDQU (DX), X9
	VPSHUFB X14, X9, X9
	VCVTPH2PS X9, Y9
	VFMADD231PS Y9, Y8, Y3
	VMOVDQU (DX)(R9*1), X9
	VPSHUFB X14, X9, X9
	VCVTPH2PS X9, Y9
	VFMADD231PS Y9, Y8, Y4
	VMOVDQU (DX)(R9*2), X9
	VPSHUFB X14, X9, X9
	VCVTPH2PS X9, Y9
	VFMADD231PS Y9, Y8, Y5
	VMOVDQU (AX), X9
	VPSHUFB X14, X9, X9
	VCVTPH2PS X9, Y9
	VFMADD231PS Y9, Y8, Y6
	VMOVDQU (AX)(R9*1), X9
	VPSHUFB X14, X9, X9
	VCVTPH2PS X9, Y9
	VFMADD231PS Y9, Y8, Y7

F16Reduce:
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	LEAQ (R12)(R13*2), DX
	ADDQ R13, DX       // output 3
	LEAQ (DX)(R13*2), AX
	ADDQ R13, AX       // output 6
	MOVQ acc+64(FP), CX
	TESTQ CX, CX
	JZ    F16Store
	VMOVSS (R12), X9
	VINSERTPS $0x10, (R12)(R13*1), X9, X9
	VINSERTPS $0x20, (R12)(R13*2), X9, X9
	VINSERTPS $0x30, (DX), X9, X9
	VMOVSS (R12)(R13*4), X10
	VINSERTPS $0x10, (DX)(R13*2), X10, X10
	VINSERTPS $0x20, (AX), X10, X10
	VINSERTPS $0x30, (AX)(R13*1), X10, X10
	VADDPS X9, X0, X0
	VADDPS X10, X4, X4

F16Store:
	VMOVSS X0, (R12)
	VEXTRACTPS $1, X0, (R12)(R13*1)
	VEXTRACTPS $2, X0, (R12)(R13*2)
	VEXTRACTPS $3, X0, (DX)
	VMOVSS X4, (R12)(R13*4)
	VEXTRACTPS $1, X4, (DX)(R13*2)
	VEXTRACTPS $2, X4, (AX)
	VEXTRACTPS $3, X4, (AX)(R13*1)
	ADDQ $4, R12
	ADDQ R11, R10
	DECQ DI
	JNZ  F16Tile
	VZEROUPPER
	RET

// halfTail<> row t: VPSHUFB control moving bytes [16−2t, 16) to [0, 2t), zero above.
DATA halfTail<>+0(SB)/4, $0x80808080
DATA halfTail<>+4(SB)/4, $0x80808080
DATA halfTail<>+8(SB)/4, $0x80808080
DATA halfTail<>+12(SB)/4, $0x80808080
DATA halfTail<>+16(SB)/4, $0x80800f0e
DATA halfTail<>+20(SB)/4, $0x80808080
DATA halfTail<>+24(SB)/4, $0x80808080
DATA halfTail<>+28(SB)/4, $0x80808080
DATA halfTail<>+32(SB)/4, $0x0f0e0d0c
DATA halfTail<>+36(SB)/4, $0x80808080
DATA halfTail<>+40(SB)/4, $0x80808080
DATA halfTail<>+44(SB)/4, $0x80808080
DATA halfTail<>+48(SB)/4, $0x0d0c0b0a
DATA halfTail<>+52(SB)/4, $0x80800f0e
DATA halfTail<>+56(SB)/4, $0x80808080
DATA halfTail<>+60(SB)/4, $0x80808080
DATA halfTail<>+64(SB)/4, $0x0b0a0908
DATA halfTail<>+68(SB)/4, $0x0f0e0d0c
DATA halfTail<>+72(SB)/4, $0x80808080
DATA halfTail<>+76(SB)/4, $0x80808080
DATA halfTail<>+80(SB)/4, $0x09080706
DATA halfTail<>+84(SB)/4, $0x0d0c0b0a
DATA halfTail<>+88(SB)/4, $0x80800f0e
DATA halfTail<>+92(SB)/4, $0x80808080
DATA halfTail<>+96(SB)/4, $0x07060504
DATA halfTail<>+100(SB)/4, $0x0b0a0908
DATA halfTail<>+104(SB)/4, $0x0f0e0d0c
DATA halfTail<>+108(SB)/4, $0x80808080
DATA halfTail<>+112(SB)/4, $0x05040302
DATA halfTail<>+116(SB)/4, $0x09080706
DATA halfTail<>+120(SB)/4, $0x0d0c0b0a
DATA halfTail<>+124(SB)/4, $0x80800f0e
GLOBL halfTail<>(SB), RODATA|NOPTR, $128

DATA halfLanes<>+0(SB)/4, $0
DATA halfLanes<>+4(SB)/4, $1
DATA halfLanes<>+8(SB)/4, $2
DATA halfLanes<>+12(SB)/4, $3
DATA halfLanes<>+16(SB)/4, $4
DATA halfLanes<>+20(SB)/4, $5
DATA halfLanes<>+24(SB)/4, $6
DATA halfLanes<>+28(SB)/4, $7
GLOBL halfLanes<>(SB), RODATA|NOPTR, $32

// func widenBF16AVX2(dst *float32, src *uint16, n int)
// dst[i] = float32 of bfloat16 src[i] for i < n, n a multiple of 8, n ≥ 8.
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

wbLoop:
	VPMOVZXWD (SI), Y0
	VPSLLD $16, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  wbLoop
	VZEROUPPER
	RET

// func widenF16AVX2(dst *float32, src *uint16, n int)
// dst[i] = float32 of binary16 src[i] for i < n, n a multiple of 8, n ≥ 8
// (F16C).
TEXT ·widenF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

whLoop:
	VCVTPH2PS (SI), Y0
	VMOVUPS Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JNZ  whLoop
	VZEROUPPER
	RET
