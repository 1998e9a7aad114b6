//go:build !purego

#include "textflag.h"

// Value kernels of CodeAccumF16 (codesv.go). Per chunk of 64 channels,
// rows two at a time (accumulators Z16–Z19 and Z20–Z23, added at the
// end), then one: w_j = p_j·s_j (the row's fp16 scale and zero widened by
// VCVTPH2PS), cz += w_j·z_j (X14, X15), and the row's 64 codes, 16 bytes
// at a time zero-extended to dwords, become floats by a VPERMPS table
// lookup (Z30; VPERMPS reads the low 4 bits of each index, so a 2-bit
// plane needs only the shift) or VCVTDQ2PS, multiplied by w_j into the
// accumulators. Registers: DI tmp, SI p, DX params, BX the chunk's codes,
// CX n, R10 chunks left, R11 rb, R9 table, R8 cz; per chunk R12 p, R13
// params, R14 codes, AX rows left.

#define LOADARGS \
	MOVQ tmp+0(FP), DI; \
	MOVQ p+8(FP), SI; \
	MOVQ params+16(FP), DX; \
	MOVQ codes+24(FP), BX; \
	MOVQ n+32(FP), CX; \
	MOVQ nc+40(FP), R10; \
	MOVQ rb+48(FP), R11; \
	MOVQ table+56(FP), R9; \
	MOVQ cz+64(FP), R8; \
	VMOVUPS (R9), Z30

// W(PA, QA, XACC, ZB): ZB = broadcast w = p·s, XACC += w·z.
#define W(PA, QA, XACC, ZB) \
	VMOVD QA, X0; \
	VCVTPH2PS X0, X0; \
	VMULSS PA, X0, X1; \
	VMOVSHDUP X0, X2; \
	VFMADD231SS X2, X1, XACC; \
	VBROADCASTSS X1, ZB

// BODY2(C, ZB, A0..A3): the 64 2-bit codes at C (16 bytes).
#define BODY2(C, ZB, A0, A1, A2, A3) \
	VPMOVZXBD C, Z2; \
	VPERMPS Z30, Z2, Z3; \
	VFMADD231PS Z3, ZB, A0; \
	VPSRLD $2, Z2, Z4; \
	VPERMPS Z30, Z4, Z4; \
	VFMADD231PS Z4, ZB, A1; \
	VPSRLD $4, Z2, Z5; \
	VPERMPS Z30, Z5, Z5; \
	VFMADD231PS Z5, ZB, A2; \
	VPSRLD $6, Z2, Z6; \
	VCVTDQ2PS Z6, Z6; \
	VFMADD231PS Z6, ZB, A3

// BODY4(C0, C1, ZB, A0..A3): the 64 4-bit codes at C0 and C1 = C0+16.
#define BODY4(C0, C1, ZB, A0, A1, A2, A3) \
	VPMOVZXBD C0, Z2; \
	VPMOVZXBD C1, Z3; \
	VPERMPS Z30, Z2, Z4; \
	VFMADD231PS Z4, ZB, A0; \
	VPSRLD $4, Z2, Z5; \
	VCVTDQ2PS Z5, Z5; \
	VFMADD231PS Z5, ZB, A1; \
	VPERMPS Z30, Z3, Z6; \
	VFMADD231PS Z6, ZB, A2; \
	VPSRLD $4, Z3, Z7; \
	VCVTDQ2PS Z7, Z7; \
	VFMADD231PS Z7, ZB, A3

// BODY8(C0, C1, C2, C3, ZB, A0..A3): the 64 8-bit codes at C0..C3.
#define BODY8(C0, C1, C2, C3, ZB, A0, A1, A2, A3) \
	VPMOVZXBD C0, Z2; \
	VPMOVZXBD C1, Z3; \
	VPMOVZXBD C2, Z4; \
	VPMOVZXBD C3, Z5; \
	VCVTDQ2PS Z2, Z2; \
	VCVTDQ2PS Z3, Z3; \
	VCVTDQ2PS Z4, Z4; \
	VCVTDQ2PS Z5, Z5; \
	VFMADD231PS Z2, ZB, A0; \
	VFMADD231PS Z3, ZB, A1; \
	VFMADD231PS Z4, ZB, A2; \
	VFMADD231PS Z5, ZB, A3

#define CHUNKSTART \
	VXORPS X14, X14, X14; \
	VXORPS X15, X15, X15; \
	VPXORD Z16, Z16, Z16; \
	VPXORD Z17, Z17, Z17; \
	VPXORD Z18, Z18, Z18; \
	VPXORD Z19, Z19, Z19; \
	VPXORD Z20, Z20, Z20; \
	VPXORD Z21, Z21, Z21; \
	VPXORD Z22, Z22, Z22; \
	VPXORD Z23, Z23, Z23; \
	MOVQ SI, R12; \
	MOVQ DX, R13; \
	MOVQ BX, R14; \
	MOVQ CX, AX

#define PAIRNEXT \
	ADDQ $8, R12; \
	ADDQ $8, R13; \
	LEAQ (R14)(R11*2), R14; \
	SUBQ $2, AX

// CHUNKEND(CB): store the chunk's sums, next chunk (CB code bytes on).
#define CHUNKEND(CB) \
	VADDPS Z20, Z16, Z16; \
	VADDPS Z21, Z17, Z17; \
	VADDPS Z22, Z18, Z18; \
	VADDPS Z23, Z19, Z19; \
	VMOVUPS Z16, (DI); \
	VMOVUPS Z17, 64(DI); \
	VMOVUPS Z18, 128(DI); \
	VMOVUPS Z19, 192(DI); \
	ADDQ $256, DI; \
	ADDQ $CB, BX; \
	DECQ R10

#define FINISH \
	VADDSS X15, X14, X14; \
	VMOVSS X14, (R8); \
	VZEROUPPER; \
	RET

// func codeAccumF16b2AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)
// Requires n ≥ 1, nc ≥ 1.
TEXT ·codeAccumF16b2AVX512(SB), NOSPLIT, $0-72
	LOADARGS
chunk:
	CHUNKSTART
pair:
	CMPQ AX, $2
	JL   single
	W((R12), (R13), X14, Z1)
	BODY2((R14), Z1, Z16, Z17, Z18, Z19)
	W(4(R12), 4(R13), X15, Z8)
	BODY2((R14)(R11*1), Z8, Z20, Z21, Z22, Z23)
	PAIRNEXT
	JMP  pair
single:
	TESTQ AX, AX
	JZ    fin
	W((R12), (R13), X14, Z1)
	BODY2((R14), Z1, Z16, Z17, Z18, Z19)
fin:
	CHUNKEND(16)
	JNZ chunk
	FINISH

// func codeAccumF16b4AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)
TEXT ·codeAccumF16b4AVX512(SB), NOSPLIT, $0-72
	LOADARGS
chunk:
	CHUNKSTART
pair:
	CMPQ AX, $2
	JL   single
	W((R12), (R13), X14, Z1)
	BODY4((R14), 16(R14), Z1, Z16, Z17, Z18, Z19)
	W(4(R12), 4(R13), X15, Z8)
	BODY4((R14)(R11*1), 16(R14)(R11*1), Z8, Z20, Z21, Z22, Z23)
	PAIRNEXT
	JMP  pair
single:
	TESTQ AX, AX
	JZ    fin
	W((R12), (R13), X14, Z1)
	BODY4((R14), 16(R14), Z1, Z16, Z17, Z18, Z19)
fin:
	CHUNKEND(32)
	JNZ chunk
	FINISH

// func codeAccumF16b8AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)
TEXT ·codeAccumF16b8AVX512(SB), NOSPLIT, $0-72
	LOADARGS
chunk:
	CHUNKSTART
pair:
	CMPQ AX, $2
	JL   single
	W((R12), (R13), X14, Z1)
	BODY8((R14), 16(R14), 32(R14), 48(R14), Z1, Z16, Z17, Z18, Z19)
	W(4(R12), 4(R13), X15, Z8)
	BODY8((R14)(R11*1), 16(R14)(R11*1), 32(R14)(R11*1), 48(R14)(R11*1), Z8, Z20, Z21, Z22, Z23)
	PAIRNEXT
	JMP  pair
single:
	TESTQ AX, AX
	JZ    fin
	W((R12), (R13), X14, Z1)
	BODY8((R14), 16(R14), 32(R14), 48(R14), Z1, Z16, Z17, Z18, Z19)
fin:
	CHUNKEND(64)
	JNZ chunk
	FINISH
