package main

// pairAVX2x4 is dotQ8x4p2AVX2 and dotQ8x8p2AVX2, the AVX2 two-row forms
// of dotQ8x4AVX2's and dotQ8x8AVX2's group paths (bpg ≥ 2), appended to qdot8_amd64.s (it reads that file's
// q8shift4 table). Written out rather than generated: they are two
// widths and one path, each row's instructions those oneRowKernel emits for the
// AVX2 group loop, in the same order (TestDotQ8PairsAVX2Bitwise checks
// the bits).
const pairAVX2x4 = `
// 4-bit codes, AVX2, two packed rows at once (dotQ8Pairs without VNNI):
// rows r and r+dist against the same activation row, for r < rows, only
// for groups of two or more blocks (bpg ≥ 2; dotQ8Asm sends one-block
// groups to dotQ8x4AVX2). Each row performs dotQ8x4AVX2's group-path
// operations in its order (the same int32 block sums, float32 products,
// FMAs and reduction), so every result has the one-row kernel's bits;
// what is gained is two rows' independent FMA chains in flight (the
// one-row kernel waits on one chain a block in a group of several).
// Registers: DX y, BX pairs left, DI xq, R12 xs, R13 xsum, SI src (row
// r), R14 the code bytes of dist rows, R8 scales, R9 zeros (row r+dist's
// at +R11), R10 groups left, CX blocks left; Y12, Y11 the totals and X13,
// X10 the zero terms of rows r and r+dist, Y5, Y8 their group sums, X7
// the group's activation sums (the same for both rows), X0, X2 their
// scales, Y14 the shifts, Y15 the nibble mask, Y9 words of 1.
// func dotQ8x4p2AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)
TEXT ·dotQ8x4p2AVX2(SB), NOSPLIT, $0-96
	MOVQ src+24(FP), SI
	MOVQ scales+32(FP), R8
	MOVQ zeros+40(FP), R9
	MOVQ ng+48(FP), R11
	MOVQ y+72(FP), DX
	MOVQ rows+80(FP), BX
	IMULQ dist+88(FP), R11
	MOVQ R11, R14
	IMULQ bpg+56(FP), R14
	SHLQ $4, R14
	SHLQ $1, R11
	MOVL $0x0f, AX
	VMOVD AX, X15
	VPBROADCASTB X15, Y15
	VPCMPEQW Y9, Y9, Y9
	VPSRLW $15, Y9, Y9
	VMOVDQU q8shift4<>(SB), Y14

dotQ8x4p2AVX2_row:
	MOVQ xq+0(FP), DI
	MOVQ xs+8(FP), R12
	MOVQ xsum+16(FP), R13
	MOVQ ng+48(FP), R10
	VXORPS Y12, Y12, Y12
	VXORPS Y11, Y11, Y11
	VXORPS X13, X13, X13
	VXORPS X10, X10, X10

dotQ8x4p2AVX2_group:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	MOVWLZX (R8)(R11*1), AX
	VMOVD AX, X2
	VCVTPH2PS X2, X2
	ADDQ $2, R8
	MOVQ bpg+56(FP), CX
	VXORPS X7, X7, X7
	VXORPS Y5, Y5, Y5
	VXORPS Y8, Y8, Y8

dotQ8x4p2AVX2_block:
	VBROADCASTI128 0(SI), Y4
	VBROADCASTI128 0(SI)(R14*1), Y1
	VPSRLVQ Y14, Y4, Y4
	VPSRLVQ Y14, Y1, Y1
	VPAND Y15, Y4, Y4
	VPAND Y15, Y1, Y1
	VPMADDUBSW 0(DI), Y4, Y3
	VPMADDUBSW 0(DI), Y1, Y1
	VPMADDWD Y9, Y3, Y3
	VPMADDWD Y9, Y1, Y1
	VCVTDQ2PS Y3, Y3
	VCVTDQ2PS Y1, Y1
	VBROADCASTSS (R12), Y6
	VFMADD231PS Y6, Y3, Y5
	VFMADD231PS Y6, Y1, Y8
	VADDSS (R13), X7, X7
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ $32, DI
	ADDQ $16, SI
	DECQ CX
	JNZ  dotQ8x4p2AVX2_block

	VBROADCASTSS X0, Y6
	VFMADD231PS Y6, Y5, Y12
	VBROADCASTSS X2, Y6
	VFMADD231PS Y6, Y8, Y11
	VMOVSS zsym+64(FP), X1
	VMOVSS zsym+64(FP), X4
	TESTQ R9, R9
	JZ   dotQ8x4p2AVX2_zero
	MOVWLZX (R9), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	MOVWLZX (R9)(R11*1), AX
	VMOVD AX, X4
	VCVTPH2PS X4, X4
	ADDQ $2, R9

dotQ8x4p2AVX2_zero:
	VMULSS X1, X7, X3
	VFMADD231SS X0, X3, X13
	VMULSS X4, X7, X3
	VFMADD231SS X2, X3, X10
	DECQ R10
	JNZ  dotQ8x4p2AVX2_group

	VXORPS Y3, Y3, Y3
	VADDPS Y3, Y12, Y12
	VEXTRACTF128 $1, Y12, X4
	VADDPS X4, X12, X12
	VSUBPS X3, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VSUBSS X13, X12, X12
	VMOVSS X12, (DX)
	VADDPS Y3, Y11, Y11
	VEXTRACTF128 $1, Y11, X4
	VADDPS X4, X11, X11
	VSUBPS X3, X11, X11
	VHADDPS X11, X11, X11
	VHADDPS X11, X11, X11
	VSUBSS X10, X11, X11
	MOVQ dist+88(FP), AX
	VMOVSS X11, (DX)(AX*4)
	ADDQ $4, DX
	DECQ BX
	JNZ  dotQ8x4p2AVX2_row
	VZEROUPPER
	RET

// 8-bit codes, AVX2, two packed rows at once: dotQ8x8AVX2's group path
// (bpg ≥ 2; codes taken as c − 128, zero-points shifted by zoff as the
// one-row kernel does) on rows r and r+dist, each row's operations in the
// one-row kernel's order. Registers as dotQ8x4p2AVX2's, Y9 row r+dist's
// group sum, Y14 words of 1, Y15 the byte 0x80; each row's scratch
// Y3, Y4, Y8 (the activations, whose signs VPSIGNB moves per row).
// func dotQ8x8p2AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)
TEXT ·dotQ8x8p2AVX2(SB), NOSPLIT, $0-96
	MOVQ src+24(FP), SI
	MOVQ scales+32(FP), R8
	MOVQ zeros+40(FP), R9
	MOVQ ng+48(FP), R11
	MOVQ y+72(FP), DX
	MOVQ rows+80(FP), BX
	IMULQ dist+88(FP), R11
	MOVQ R11, R14
	IMULQ bpg+56(FP), R14
	SHLQ $5, R14
	SHLQ $1, R11
	MOVL $0x80, AX
	VMOVD AX, X15
	VPBROADCASTB X15, Y15
	VPCMPEQW Y14, Y14, Y14
	VPSRLW $15, Y14, Y14

dotQ8x8p2AVX2_row:
	MOVQ xq+0(FP), DI
	MOVQ xs+8(FP), R12
	MOVQ xsum+16(FP), R13
	MOVQ ng+48(FP), R10
	VXORPS Y12, Y12, Y12
	VXORPS Y11, Y11, Y11
	VXORPS X13, X13, X13
	VXORPS X10, X10, X10

dotQ8x8p2AVX2_group:
	MOVWLZX (R8), AX
	VMOVD AX, X0
	VCVTPH2PS X0, X0
	MOVWLZX (R8)(R11*1), AX
	VMOVD AX, X1
	VCVTPH2PS X1, X1
	ADDQ $2, R8
	MOVQ bpg+56(FP), CX
	VXORPS X7, X7, X7
	VXORPS Y5, Y5, Y5
	VXORPS Y9, Y9, Y9

dotQ8x8p2AVX2_block:
	VMOVDQU 0(SI), Y4
	VPXOR Y15, Y4, Y4
	VMOVDQU 0(DI), Y8
	VPSIGNB Y4, Y4, Y3
	VPSIGNB Y4, Y8, Y8
	VPMADDUBSW Y8, Y3, Y3
	VPMADDWD Y14, Y3, Y3
	VCVTDQ2PS Y3, Y3
	VBROADCASTSS (R12), Y6
	VFMADD231PS Y6, Y3, Y5
	VMOVDQU 0(SI)(R14*1), Y4
	VPXOR Y15, Y4, Y4
	VMOVDQU 0(DI), Y8
	VPSIGNB Y4, Y4, Y2
	VPSIGNB Y4, Y8, Y8
	VPMADDUBSW Y8, Y2, Y2
	VPMADDWD Y14, Y2, Y2
	VCVTDQ2PS Y2, Y2
	VFMADD231PS Y6, Y2, Y9
	VADDSS (R13), X7, X7
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ $32, DI
	ADDQ $32, SI
	DECQ CX
	JNZ  dotQ8x8p2AVX2_block

	VBROADCASTSS X0, Y6
	VFMADD231PS Y6, Y5, Y12
	VBROADCASTSS X1, Y6
	VFMADD231PS Y6, Y9, Y11
	VMOVSS zsym+64(FP), X3
	VMOVSS zsym+64(FP), X4
	TESTQ R9, R9
	JZ   dotQ8x8p2AVX2_zero
	VMOVSS zoff+68(FP), X8
	MOVWLZX (R9), AX
	VMOVD AX, X3
	VCVTPH2PS X3, X3
	VSUBSS X8, X3, X3
	MOVWLZX (R9)(R11*1), AX
	VMOVD AX, X4
	VCVTPH2PS X4, X4
	VSUBSS X8, X4, X4
	ADDQ $2, R9

dotQ8x8p2AVX2_zero:
	VMULSS X3, X7, X3
	VFMADD231SS X0, X3, X13
	VMULSS X4, X7, X4
	VFMADD231SS X1, X4, X10
	DECQ R10
	JNZ  dotQ8x8p2AVX2_group

	VXORPS Y3, Y3, Y3
	VADDPS Y3, Y12, Y12
	VEXTRACTF128 $1, Y12, X4
	VADDPS X4, X12, X12
	VSUBPS X3, X12, X12
	VHADDPS X12, X12, X12
	VHADDPS X12, X12, X12
	VSUBSS X13, X12, X12
	VMOVSS X12, (DX)
	VADDPS Y3, Y11, Y11
	VEXTRACTF128 $1, Y11, X4
	VADDPS X4, X11, X11
	VSUBPS X3, X11, X11
	VHADDPS X11, X11, X11
	VHADDPS X11, X11, X11
	VSUBSS X10, X11, X11
	MOVQ dist+88(FP), AX
	VMOVSS X11, (DX)(AX*4)
	ADDQ $4, DX
	DECQ BX
	JNZ  dotQ8x8p2AVX2_row
	VZEROUPPER
	RET
`
