//go:build !purego

#include "textflag.h"

// Value kernels of CodeAccumQ8 (codesvq8.go): 2-bit codes, head_dim 64
// (rows 16 bytes apart) or 128 (32 bytes apart), blocks of 16 rows. Per
// block (BLOCKW): w = p·s (the fp16 scales deinterleaved from params by
// VPERMT2PS), δ = max|w|/127, w8 = round(w/δ) (VCVTPS2DQ, nearest even)
// packed to int8 into the frame; cz += δ·w8·z. For each group of four
// rows the code bytes of each 64-channel chunk are transposed (VPERMB,
// or VPERMT2B from the group's two halves: dword k = byte k of the four
// rows, channels 4k..4k+3), split into the four 2-bit planes, and
// VPDPBUSD adds code × w8 over the four rows (the group's weight dword
// broadcast from the frame) into int32 sums per plane (exact), which the
// block adds to float32 sums as δ·sum. Each block first prefetches
// (PREFETCHT0) the codes 2 KB ahead (eight blocks at head_dim 64; every line of a
// block) and the weights and params 512 bytes ahead: with the rows
// streamed from DRAM (BenchmarkKVDecodeDRAM values2/dram, three interleaved
// runs) that took the kernel from 14.2–15.6 to 16.3–18.4 GB/s (l2, the
// rows in cache: 18.6–20.7 GB/s, unchanged). Registers: SI p, DX params, BX
// codes, CX blocks left, DI tmp, R8 cz, R9 consts; Z11 127, Z12/Z14 the
// z/s indices, Z13 (and Z29) the transpose, Z15 the 2-bit mask; Z10 δ;
// Z16–Z19 (and Z21–Z24) the float sums in plane order, Z25–Z28 (and
// Z5–Z8) the block's int32 sums; Z20 the Σ w̃·z lanes; Z31 Σ 0·w (0, or
// NaN where a weight is NaN or infinite: added to cz so that such a
// weight makes every output NaN).

// LOADARGSQ: arguments and the constants both kernels use.
#define LOADARGSQ \
	MOVQ tmp+0(FP), DI; \
	MOVQ p+8(FP), SI; \
	MOVQ params+16(FP), DX; \
	MOVQ codes+24(FP), BX; \
	MOVQ n16+32(FP), CX; \
	MOVQ consts+40(FP), R9; \
	MOVQ cz+48(FP), R8; \
	VMOVDQU32 64(R9), Z14; \
	VMOVDQU32 128(R9), Z12; \
	VMOVDQU64 192(R9), Z15; \
	VBROADCASTSS 256(R9), Z11; \
	VPXORD Z20, Z20, Z20; \
	VPXORD Z31, Z31, Z31

// BLOCKW: the block's weights (see above) into (SP) and δ into Z10.
#define BLOCKW \
	VMOVUPS (SI), Z0; \
	VCVTPH2PS (DX), Z1; \
	VCVTPH2PS 32(DX), Z2; \
	VMOVAPS Z1, Z3; \
	VPERMT2PS Z2, Z14, Z3; \
	VMOVAPS Z1, Z4; \
	VPERMT2PS Z2, Z12, Z4; \
	VMULPS Z3, Z0, Z5; \
	VMULPS.BCST 268(R9), Z5, Z1; \
	VADDPS Z1, Z31, Z31; \
	VPANDD.BCST 264(R9), Z5, Z6; \
	VEXTRACTF32X8 $1, Z6, Y7; \
	VMAXPS Y7, Y6, Y6; \
	VEXTRACTF128 $1, Y6, X7; \
	VMAXPS X7, X6, X6; \
	VPERMILPS $0x4E, X6, X7; \
	VMAXPS X7, X6, X6; \
	VPERMILPS $0xB1, X6, X7; \
	VMAXPS X7, X6, X6; \
	VBROADCASTSS X6, Z6; \
	VMAXPS.BCST 260(R9), Z6, Z6; \
	VDIVPS Z6, Z11, Z7; \
	VDIVPS Z11, Z6, Z10; \
	VMULPS Z7, Z5, Z8; \
	VCVTPS2DQ Z8, Z8; \
	VPMOVSDB Z8, X9; \
	VMOVDQU X9, (SP); \
	VCVTDQ2PS Z8, Z8; \
	VMULPS Z10, Z8, Z8; \
	VFMADD231PS Z4, Z8, Z20

// PLANESW(SRC, A0, A1, A2, A3, WOFF): the four 2-bit planes of SRC (a
// transposed chunk) times the group's weights (the dword at WOFF(SP),
// broadcast) into A0–A3.
#define PLANESW(SRC, A0, A1, A2, A3, WOFF) \
	VPANDD Z15, SRC, Z2; \
	VPDPBUSD.BCST WOFF(SP), Z2, A0; \
	VPSRLW $2, SRC, Z2; \
	VPANDD Z15, Z2, Z2; \
	VPDPBUSD.BCST WOFF(SP), Z2, A1; \
	VPSRLW $4, SRC, Z2; \
	VPANDD Z15, Z2, Z2; \
	VPDPBUSD.BCST WOFF(SP), Z2, A2; \
	VPSRLW $6, SRC, Z2; \
	VPANDD Z15, Z2, Z2; \
	VPDPBUSD.BCST WOFF(SP), Z2, A3

// GROUP1(OFF, WOFF): the group of four 16-byte rows at OFF.
#define GROUP1(OFF, WOFF) \
	VPERMB OFF(BX), Z13, Z1; \
	PLANESW(Z1, Z25, Z26, Z27, Z28, WOFF)

// GROUP2(OFF, WOFF): the group of four 32-byte rows at OFF, each
// 64-channel chunk transposed by VPERMT2B (Z13 chunk 0, Z29 chunk 1)
// from the group's two 64-byte halves.
#define GROUP2(OFF, WOFF) \
	VMOVDQU64 OFF(BX), Z1; \
	VPERMT2B 64+OFF(BX), Z13, Z1; \
	PLANESW(Z1, Z25, Z26, Z27, Z28, WOFF); \
	VMOVDQU64 OFF(BX), Z3; \
	VPERMT2B 64+OFF(BX), Z29, Z3; \
	PLANESW(Z3, Z5, Z6, Z7, Z8, WOFF)

// ZERO4(A0, A1, A2, A3) and ADDI4(I0..I3, F0..F3): clear int32 sums; add
// them to float sums as δ·sum.
#define ZERO4(A0, A1, A2, A3) \
	VPXORD A0, A0, A0; \
	VPXORD A1, A1, A1; \
	VPXORD A2, A2, A2; \
	VPXORD A3, A3, A3

#define ADDI4(I0, I1, I2, I3, F0, F1, F2, F3) \
	VCVTDQ2PS I0, I0; \
	VCVTDQ2PS I1, I1; \
	VCVTDQ2PS I2, I2; \
	VCVTDQ2PS I3, I3; \
	VFMADD231PS I0, Z10, F0; \
	VFMADD231PS I1, Z10, F1; \
	VFMADD231PS I2, Z10, F2; \
	VFMADD231PS I3, Z10, F3

// STORE4(F0..F3, OFF): a chunk's float sums to tmp at OFF.
#define STORE4(F0, F1, F2, F3, OFF) \
	VMOVUPS F0, OFF(DI); \
	VMOVUPS F1, 64+OFF(DI); \
	VMOVUPS F2, 128+OFF(DI); \
	VMOVUPS F3, 192+OFF(DI)

// CZEND: *cz = Σ lanes of Z20 + Z31.
#define CZEND \
	VADDPS Z31, Z20, Z20; \
	VEXTRACTF32X8 $1, Z20, Y1; \
	VADDPS Y1, Y20, Y20; \
	VEXTRACTF32X4 $1, Y20, X1; \
	VADDPS X1, X20, X20; \
	VPERMILPS $0x4E, X20, X1; \
	VADDPS X1, X20, X20; \
	VPERMILPS $0xB1, X20, X1; \
	VADDPS X1, X20, X20; \
	VMOVSS X20, (R8)

// func codeAccumQ8b2C1(tmp, p *float32, params *uint16, codes *byte, n16 int, consts *q8vConstTab, cz *float32)
// head_dim 64: tmp [64]. Requires n16 ≥ 1.
TEXT ·codeAccumQ8b2C1(SB), NOSPLIT, $16-56
	LOADARGSQ
	VMOVDQU64 (R9), Z13
	ZERO4(Z16, Z17, Z18, Z19)

blk1:
	PREFETCHT0 2048(BX)
	PREFETCHT0 2112(BX)
	PREFETCHT0 2176(BX)
	PREFETCHT0 2240(BX)
	PREFETCHT0 512(DX)
	PREFETCHT0 512(SI)
	BLOCKW
	ZERO4(Z25, Z26, Z27, Z28)
	GROUP1(0, 0)
	GROUP1(64, 4)
	GROUP1(128, 8)
	GROUP1(192, 12)
	ADDI4(Z25, Z26, Z27, Z28, Z16, Z17, Z18, Z19)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $256, BX
	DECQ CX
	JNZ  blk1

	STORE4(Z16, Z17, Z18, Z19, 0)
	CZEND
	VZEROUPPER
	RET

// func codeAccumQ8b2C2(tmp, p *float32, params *uint16, codes *byte, n16 int, consts *q8vConstTab, cz *float32)
// head_dim 128: tmp [128], the two 64-channel chunks in turn. Requires
// n16 ≥ 1.
TEXT ·codeAccumQ8b2C2(SB), NOSPLIT, $16-56
	LOADARGSQ
	VMOVDQU64 272(R9), Z13
	VMOVDQU64 336(R9), Z29
	ZERO4(Z16, Z17, Z18, Z19)
	ZERO4(Z21, Z22, Z23, Z24)

blk2:
	PREFETCHT0 2048(BX)
	PREFETCHT0 2112(BX)
	PREFETCHT0 2176(BX)
	PREFETCHT0 2240(BX)
	PREFETCHT0 2304(BX)
	PREFETCHT0 2368(BX)
	PREFETCHT0 2432(BX)
	PREFETCHT0 2496(BX)
	PREFETCHT0 512(DX)
	PREFETCHT0 512(SI)
	BLOCKW
	ZERO4(Z25, Z26, Z27, Z28)
	ZERO4(Z5, Z6, Z7, Z8)
	GROUP2(0, 0)
	GROUP2(128, 4)
	GROUP2(256, 8)
	GROUP2(384, 12)
	ADDI4(Z25, Z26, Z27, Z28, Z16, Z17, Z18, Z19)
	ADDI4(Z5, Z6, Z7, Z8, Z21, Z22, Z23, Z24)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $512, BX
	DECQ CX
	JNZ  blk2

	STORE4(Z16, Z17, Z18, Z19, 0)
	STORE4(Z21, Z22, Z23, Z24, 256)
	CZEND
	VZEROUPPER
	RET
