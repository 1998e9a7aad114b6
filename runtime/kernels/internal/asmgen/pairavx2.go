package main

import "fmt"

// pairsAVX2Width reports whether w has an AVX2 two-row kernel
// (pairAVX2Kernel): every width but 3 bits, whose split blocks the
// runtime sends to the one-row kernel (runtime/kernels pairsAVX2).
func pairsAVX2Width(w width) bool { return !w.u3() }

// pairAVX2Kernel writes dotQ8x<bits>p2AVX2, the AVX2 one-row kernel's
// group path (groups of bpg ≥ 2 blocks; the runtime sends one-block
// groups to the one-row kernel) on two packed rows at once, rows r and
// r+dist against the same activation row, for r < rows: each row performs
// the one-row kernel's operations in its order (oneRowDotAt's int32 block
// sums, the same float32 products, FMAs and reduceRow), so every result
// has the one-row kernel's bits; what is gained is two rows' independent
// FMA chains in flight (the one-row kernel waits on one chain a block).
// Registers: DX y, BX pairs left, DI xq, R12 xs, R13 xsum, SI src (row
// r), R14 the code bytes of dist rows, R8 scales, R9 zeros (row r+dist's
// at +R11, the scale bytes of dist rows), R10 groups left, CX blocks
// left; Y12, Y11 the totals, X13, X10 the zero terms, Y5, Y1 the group
// sums and X0, X2 the scales of rows r and r+dist; X7 the group's
// activation sums (the same for both rows), Y6 the block's activation
// scale; Y3, Y4, Y8 oneRowDot's scratch, Y14 and Y15 (and Y9) as the
// one-row kernel's.
func pairAVX2Kernel(a *asm, w width) {
	name := fmt.Sprintf("dotQ8x%dp2AVX2", w.bits)
	l := labels(name)
	bb := w.blockBytes()
	shifted := zoffShifted(w, avx2)
	a.blank()
	fmt.Fprintf(&a.b, "// %d-bit codes, AVX2, two packed rows at once: dotQ8x%dAVX2's group path\n// on rows r and r+dist (pairAVX2Kernel).\n", w.bits, w.bits)
	a.text(name, pairRowArgs, 0, 96)
	a.movs([2]string{"src+24(FP)", "SI"}, [2]string{"scales+32(FP)", "R8"},
		[2]string{"zeros+40(FP)", "R9"}, [2]string{"ng+48(FP)", "R11"},
		[2]string{"y+72(FP)", "DX"}, [2]string{"rows+80(FP)", "BX"})
	a.op("IMULQ", "dist+88(FP)", "R11")
	a.op("MOVQ", "R11", "R14")
	a.op("IMULQ", "bpg+56(FP)", "R14")
	a.op("IMULQ", imm(bb), "R14")
	a.op("SHLQ", "$1", "R11")
	byteConsts(a, w, "Y", true)
	if w.bits == 8 {
		a.op("VMOVDQU", "Y9", "Y14")
	} else {
		a.op("VMOVDQU", fmt.Sprintf("q8shift%d<>(SB)", w.shifts()), "Y14")
	}

	rowStart(a, l)
	a.zero("Y12", "Y11", "X13", "X10")

	a.label(l("group"))
	for _, r := range [][2]string{{"(R8)", "X0"}, {"(R8)(R11*1)", "X2"}} {
		a.op("MOVWLZX", r[0], "AX")
		a.op("VMOVD", "AX", r[1])
		a.op("VCVTPH2PS", r[1], r[1])
	}
	a.op("ADDQ", "$2", "R8")
	a.op("MOVQ", "bpg+56(FP)", "CX")
	a.zero("X7", "Y5", "Y1")
	a.label(l("block"))
	a.op("VBROADCASTSS", "(R12)", "Y6")
	oneRowDot(a, w, avx2, 0, 0)
	a.op("VFMADD231PS", "Y6", "Y3", "Y5")
	oneRowDotAt(a, w, avx2, func(d int) string { return fmt.Sprintf("%d(SI)(R14*1)", d) }, 0, 0)
	a.op("VFMADD231PS", "Y6", "Y3", "Y1")
	a.op("VADDSS", "(R13)", "X7", "X7")
	blockStep(a, l, bb, true)

	a.op("VBROADCASTSS", "X0", "Y6")
	a.op("VFMADD231PS", "Y6", "Y5", "Y12")
	a.op("VBROADCASTSS", "X2", "Y6")
	a.op("VFMADD231PS", "Y6", "Y1", "Y11")
	// The zero-points into X3 and X4 (zsym when zeros is nil; zoff
	// subtracted where the one-row kernel does), then each row's zero
	// term += s·(z·Σ xsum) as the one-row kernel computes it.
	a.op("VMOVSS", "zsym+64(FP)", "X3")
	a.op("VMOVSS", "zsym+64(FP)", "X4")
	a.op("TESTQ", "R9", "R9")
	a.jmp("JZ", l("zero"))
	if shifted {
		a.op("VMOVSS", "zoff+68(FP)", "X8")
	}
	for _, r := range [][2]string{{"(R9)", "X3"}, {"(R9)(R11*1)", "X4"}} {
		a.op("MOVWLZX", r[0], "AX")
		a.op("VMOVD", "AX", r[1])
		a.op("VCVTPH2PS", r[1], r[1])
		if shifted {
			a.op("VSUBSS", "X8", r[1], r[1])
		}
	}
	a.op("ADDQ", "$2", "R9")
	a.label(l("zero"))
	a.op("VMULSS", "X3", "X7", "X3")
	a.op("VFMADD231SS", "X0", "X3", "X13")
	a.op("VMULSS", "X4", "X7", "X4")
	a.op("VFMADD231SS", "X2", "X4", "X10")
	a.op("DECQ", "R10")
	a.jmp("JNZ", l("group"))

	// The one-row kernel's reduction, its other accumulators (zero in the
	// group path) in Y8: Y12 + 0, then reduceRow against a zero vector.
	a.zero("Y8")
	a.op("VADDPS", "Y8", "Y12", "Y12")
	reduceRow(a, 12, 8, "", "X13", "(DX)")
	a.zero("Y8")
	a.op("VADDPS", "Y8", "Y11", "Y11")
	a.op("MOVQ", "dist+88(FP)", "AX")
	reduceRow(a, 11, 8, "", "X10", "(DX)(AX*4)")
	a.op("ADDQ", "$4", "DX")
	a.op("DECQ", "BX")
	a.jmp("JNZ", l("row"))
	a.op("VZEROUPPER")
	a.op("RET")
}
