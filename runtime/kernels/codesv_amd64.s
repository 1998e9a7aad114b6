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

// Four query rows at once (CodeAccumF16x4; a GQA group sharing a KV
// head): each row's codes are loaded and turned into floats once and
// multiplied into every query row's accumulators, Z16–Z19 (query 0),
// Z20–Z23, Z24–Z27, Z28–Z31, one row at a time; X12–X15 the four Σ w·z.
// Registers: DI tmp ([chunk][query][64], plane order), SI p (query 0),
// R15 = 4·ldp (bytes between query rows of p), R9 = 12·ldp, DX params,
// BX the chunk's codes, CX n, R10 chunks left, R11 rb, R8 cz; Z7 the
// table; per chunk R12 p, R13 params, R14 codes, AX rows left.

#define LOADARGS4 \
	MOVQ tmp+0(FP), DI; \
	MOVQ p+8(FP), SI; \
	MOVQ ldp+16(FP), R15; \
	SHLQ $2, R15; \
	MOVQ params+24(FP), DX; \
	MOVQ codes+32(FP), BX; \
	MOVQ n+40(FP), CX; \
	MOVQ nc+48(FP), R10; \
	MOVQ rb+56(FP), R11; \
	MOVQ table+64(FP), R9; \
	MOVQ cz+72(FP), R8; \
	VMOVUPS (R9), Z7; \
	LEAQ (R15)(R15*2), R9

// W4: the row's weight for each query, w_q = p_q·s into Z8–Z11, and
// cz_q += w_q·z.
#define W4 \
	VMOVD (R13), X0; \
	VCVTPH2PS X0, X0; \
	VMOVSHDUP X0, X1; \
	VMULSS (R12), X0, X2; \
	VFMADD231SS X1, X2, X12; \
	VBROADCASTSS X2, Z8; \
	VMULSS (R12)(R15*1), X0, X3; \
	VFMADD231SS X1, X3, X13; \
	VBROADCASTSS X3, Z9; \
	VMULSS (R12)(R15*2), X0, X4; \
	VFMADD231SS X1, X4, X14; \
	VBROADCASTSS X4, Z10; \
	VMULSS (R12)(R9*1), X0, X5; \
	VFMADD231SS X1, X5, X15; \
	VBROADCASTSS X5, Z11

// FMA4(V, A): plane V into accumulator A of each query (A, A+4, A+8,
// A+12 spelled out).
#define FMA4(V, A0, A1, A2, A3) \
	VFMADD231PS V, Z8, A0; \
	VFMADD231PS V, Z9, A1; \
	VFMADD231PS V, Z10, A2; \
	VFMADD231PS V, Z11, A3

#define BODY2X4(C) \
	VPMOVZXBD C, Z2; \
	VPERMPS Z7, Z2, Z3; \
	FMA4(Z3, Z16, Z20, Z24, Z28); \
	VPSRLD $2, Z2, Z4; \
	VPERMPS Z7, Z4, Z4; \
	FMA4(Z4, Z17, Z21, Z25, Z29); \
	VPSRLD $4, Z2, Z5; \
	VPERMPS Z7, Z5, Z5; \
	FMA4(Z5, Z18, Z22, Z26, Z30); \
	VPSRLD $6, Z2, Z6; \
	VCVTDQ2PS Z6, Z6; \
	FMA4(Z6, Z19, Z23, Z27, Z31)

#define BODY4X4(C0, C1) \
	VPMOVZXBD C0, Z2; \
	VPMOVZXBD C1, Z3; \
	VPERMPS Z7, Z2, Z4; \
	FMA4(Z4, Z16, Z20, Z24, Z28); \
	VPSRLD $4, Z2, Z5; \
	VCVTDQ2PS Z5, Z5; \
	FMA4(Z5, Z17, Z21, Z25, Z29); \
	VPERMPS Z7, Z3, Z6; \
	FMA4(Z6, Z18, Z22, Z26, Z30); \
	VPSRLD $4, Z3, Z3; \
	VCVTDQ2PS Z3, Z3; \
	FMA4(Z3, Z19, Z23, Z27, Z31)

#define BODY8X4(C0, C1, C2, C3) \
	VPMOVZXBD C0, Z2; \
	VPMOVZXBD C1, Z3; \
	VPMOVZXBD C2, Z4; \
	VPMOVZXBD C3, Z5; \
	VCVTDQ2PS Z2, Z2; \
	VCVTDQ2PS Z3, Z3; \
	VCVTDQ2PS Z4, Z4; \
	VCVTDQ2PS Z5, Z5; \
	FMA4(Z2, Z16, Z20, Z24, Z28); \
	FMA4(Z3, Z17, Z21, Z25, Z29); \
	FMA4(Z4, Z18, Z22, Z26, Z30); \
	FMA4(Z5, Z19, Z23, Z27, Z31)

#define CHUNKSTART4 \
	VXORPS X12, X12, X12; \
	VXORPS X13, X13, X13; \
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
	VPXORD Z24, Z24, Z24; \
	VPXORD Z25, Z25, Z25; \
	VPXORD Z26, Z26, Z26; \
	VPXORD Z27, Z27, Z27; \
	VPXORD Z28, Z28, Z28; \
	VPXORD Z29, Z29, Z29; \
	VPXORD Z30, Z30, Z30; \
	VPXORD Z31, Z31, Z31; \
	MOVQ SI, R12; \
	MOVQ DX, R13; \
	MOVQ BX, R14; \
	MOVQ CX, AX

#define ROWNEXT4 \
	ADDQ $4, R12; \
	ADDQ $4, R13; \
	ADDQ R11, R14; \
	DECQ AX

// CHUNKEND4(CB): store the chunk's sums (query-major), next chunk.
#define CHUNKEND4(CB) \
	VMOVUPS Z16, (DI); \
	VMOVUPS Z17, 64(DI); \
	VMOVUPS Z18, 128(DI); \
	VMOVUPS Z19, 192(DI); \
	VMOVUPS Z20, 256(DI); \
	VMOVUPS Z21, 320(DI); \
	VMOVUPS Z22, 384(DI); \
	VMOVUPS Z23, 448(DI); \
	VMOVUPS Z24, 512(DI); \
	VMOVUPS Z25, 576(DI); \
	VMOVUPS Z26, 640(DI); \
	VMOVUPS Z27, 704(DI); \
	VMOVUPS Z28, 768(DI); \
	VMOVUPS Z29, 832(DI); \
	VMOVUPS Z30, 896(DI); \
	VMOVUPS Z31, 960(DI); \
	ADDQ $1024, DI; \
	ADDQ $CB, BX; \
	DECQ R10

#define FINISH4 \
	VMOVSS X12, (R8); \
	VMOVSS X13, 4(R8); \
	VMOVSS X14, 8(R8); \
	VMOVSS X15, 12(R8); \
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

// func codeAccumF16x4b2AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)
// Requires n ≥ 1, nc ≥ 1.
TEXT ·codeAccumF16x4b2AVX512(SB), NOSPLIT, $0-80
	LOADARGS4
chunk:
	CHUNKSTART4
row:
	W4
	BODY2X4((R14))
	ROWNEXT4
	JNZ row
	CHUNKEND4(16)
	JNZ chunk
	FINISH4

// func codeAccumF16x4b4AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)
TEXT ·codeAccumF16x4b4AVX512(SB), NOSPLIT, $0-80
	LOADARGS4
chunk:
	CHUNKSTART4
row:
	W4
	BODY4X4((R14), 16(R14))
	ROWNEXT4
	JNZ row
	CHUNKEND4(32)
	JNZ chunk
	FINISH4

// func codeAccumF16x4b8AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)
TEXT ·codeAccumF16x4b8AVX512(SB), NOSPLIT, $0-80
	LOADARGS4
chunk:
	CHUNKSTART4
row:
	W4
	BODY8X4((R14), 16(R14), 32(R14), 48(R14))
	ROWNEXT4
	JNZ row
	CHUNKEND4(64)
	JNZ chunk
	FINISH4
