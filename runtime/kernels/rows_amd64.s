//go:build !purego

#include "textflag.h"

// func gemvNT8AVX2(x, w *float32, k int, y *float32, nt, ldw, rs, ys, acc int)
// For t in [0, nt) and r in [0, 8):
//   y[t + r·ys] = (acc ? y[t + r·ys] : 0) + Σ_{p<k} x[p]·w[t·ldw + r·rs + p]
// with every output summed exactly as one output of gemmNT4x3AVX2: one
// 8-lane accumulator taking the 8-wide k steps in order, a k tail of 1..7
// by masked loads into the same accumulator, then ((l0+l1)+(l2+l3)) +
// ((l4+l5)+(l6+l7)), added to y when acc. So MatMulNTRows can run a row
// of x alone through it (eight rows of w per load of x, as four-row
// streams do in gemv4AVX2) and get the bits of the 4×3 tiles. rs = 0 and
// ys = 0 alias the eight rows (one output; every y load happens before any
// store). nt ≥ 1, k ≥ 1.
TEXT ·gemvNT8AVX2(SB), NOSPLIT, $0-72
	MOVQ x+0(FP), R8
	MOVQ w+8(FP), R10
	MOVQ y+24(FP), R12
	MOVQ nt+32(FP), DI
	MOVQ ldw+40(FP), R11
	SHLQ $2, R11
	MOVQ rs+48(FP), R9
	SHLQ $2, R9
	MOVQ ys+56(FP), R13
	SHLQ $2, R13
	MOVQ k+16(FP), CX
	ANDQ $7, CX
	VMOVQ CX, X15
	VPBROADCASTD X15, Y15
	VPCMPGTD lanes8<>(SB), Y15, Y15

g8Tile:
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
	JZ   g8Rem

g8Loop:
	VMOVUPS (SI), Y8
	VFMADD231PS (BX), Y8, Y0
	VFMADD231PS (BX)(R9*1), Y8, Y1
	VFMADD231PS (BX)(R9*2), Y8, Y2
	VFMADD231PS (DX), Y8, Y3
	VFMADD231PS (DX)(R9*1), Y8, Y4
	VFMADD231PS (DX)(R9*2), Y8, Y5
	VFMADD231PS (AX), Y8, Y6
	VFMADD231PS (AX)(R9*1), Y8, Y7
	ADDQ $32, SI
	ADDQ $32, BX
	ADDQ $32, DX
	ADDQ $32, AX
	DECQ CX
	JNZ  g8Loop

g8Rem:
	MOVQ k+16(FP), CX
	TESTQ $7, CX
	JZ    g8Reduce
	VMASKMOVPS (SI), Y15, Y8
	VMASKMOVPS (BX), Y15, Y9
	VFMADD231PS Y9, Y8, Y0
	VMASKMOVPS (BX)(R9*1), Y15, Y9
	VFMADD231PS Y9, Y8, Y1
	VMASKMOVPS (BX)(R9*2), Y15, Y9
	VFMADD231PS Y9, Y8, Y2
	VMASKMOVPS (DX), Y15, Y9
	VFMADD231PS Y9, Y8, Y3
	VMASKMOVPS (DX)(R9*1), Y15, Y9
	VFMADD231PS Y9, Y8, Y4
	VMASKMOVPS (DX)(R9*2), Y15, Y9
	VFMADD231PS Y9, Y8, Y5
	VMASKMOVPS (AX), Y15, Y9
	VFMADD231PS Y9, Y8, Y6
	VMASKMOVPS (AX)(R9*1), Y15, Y9
	VFMADD231PS Y9, Y8, Y7

g8Reduce:
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
	JZ    g8Store
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

g8Store:
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
	JNZ  g8Tile
	VZEROUPPER
	RET

DATA lanes8<>+0(SB)/4, $0
DATA lanes8<>+4(SB)/4, $1
DATA lanes8<>+8(SB)/4, $2
DATA lanes8<>+12(SB)/4, $3
DATA lanes8<>+16(SB)/4, $4
DATA lanes8<>+20(SB)/4, $5
DATA lanes8<>+24(SB)/4, $6
DATA lanes8<>+28(SB)/4, $7
GLOBL lanes8<>(SB), RODATA|NOPTR, $32
