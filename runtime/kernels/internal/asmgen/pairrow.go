package main

import "fmt"

// pairRowHeader is the comment block at the top of qdot8p_amd64.s.
const pairRowHeader = `//go:build !purego

#include "textflag.h"

// Two-row AVX-512 VNNI kernels of DotQ8Rows' one-row kernels (qdot8.go,
// dotQ8Asm): the VNNI one-row kernel (qdot8_amd64.s) run on two packed
// rows at once in the two 256-bit halves of Z registers, the low half row
// r, the high half row r+dist, against the same activation row, for r <
// rows (so 2·rows packed rows when dist = rows; each half streams its rows
// in order, two sequential streams the hardware prefetch follows, where
// adjacent row pairs read half as fast from DRAM). Every lane performs the one-row kernel's operations in
// its order (the same int32 block sums, the same float32 products, FMAs
// and reduction), so every result has the one-row kernel's bits; what is
// gained is one instruction stream for two rows (half the instructions a
// block) and two rows' independent FMA chains in flight (the one-row
// kernel waits on its two accumulators' FMA latency). Arguments as the
// one-row kernels', with rows the number of row pairs and dist ≥ rows the
// rows from the first row of a pair to the second (results y[r] and
// y[r+dist]).
// Registers: DX y, BX pairs left, DI xq, R12 xs, R13 xsum, SI src (row
// r), R14 the code bytes of dist rows (row r+dist at SI+R14), R8 scales,
// R9 zeros (row r+dist's at +R11, the scale bytes of dist rows), R10
// groups left, CX blocks left, yoff-8(SP) 4·dist; Z12, Z11 totals, Z10
// vector zero terms, X13 and X9 the scalar zero terms of rows r and
// r+dist, Z14 the shifts, Z15 the byte constant, Z16-Z23 the d_b
// permutations; Z0-Z8 scratch.

// Per-lane right shifts as in qdot8_amd64.s, for both halves.
`

// pairRowArgs is the Go signature of the two-row kernels.
const pairRowArgs = "(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)"

// unpackPair writes the instructions that bring the block at src offset so
// of both rows into Z4, row r's in the low half and row r+dist's in the
// high half, each half as unpack leaves Y4 (Y6 scratch).
func unpackPair(a *asm, w width, so int) {
	if w.bits == 8 {
		a.op("VMOVDQU", off(so, "SI"), "Y4")
		a.op("VINSERTI64X4", "$1", fmt.Sprintf("%d(SI)(R14*1)", so), "Z4", "Z4")
		return
	}
	a.op(w.load, off(so, "SI"), "Y4")
	a.op(w.load, fmt.Sprintf("%d(SI)(R14*1)", so), "Y6")
	a.op("VINSERTI64X4", "$1", "Y6", "Z4", "Z4")
	if w.u3() {
		a.op("VPBROADCASTD", off(so+8, "SI"), "Y28")
		a.op("VPBROADCASTD", fmt.Sprintf("%d(SI)(R14*1)", so+8), "Y29")
		a.op("VINSERTI64X4", "$1", "Y29", "Z28", "Z28")
		a.op("VPTESTMB", "Z30", "Z28", "K2")
	}
	a.op(w.shift, "Z14", "Z4", "Z4")
	a.op("VPANDD", "Z15", "Z4", "Z4")
	if w.u3() {
		a.op("VPADDB", "Z31", "Z4", "K2", "Z4")
	}
}

// pairDot writes the exact int32 dot products of both rows' blocks at src
// offset so with the activations at xq offset xo into Z3, converted to
// float32 (Z5 the activations in both halves).
func pairDot(a *asm, w width, so, xo int) {
	unpackPair(a, w, so)
	a.op("VBROADCASTI64X4", off(xo, "DI"), "Z5")
	a.op("VPXORD", "Z3", "Z3", "Z3")
	a.op("VPDPBUSD", "Z5", "Z4", "Z3")
	a.op("VCVTDQ2PS", "Z3", "Z3")
}

// halves writes Z<dst> = the 16 float16 at (base) (row 2p, 8 values) and
// (base)(R11*1) (row r+dist), converted to float32.
func halves(a *asm, base string, dst int) {
	x, y := reg("X", dst), reg("Y", dst)
	a.op("VMOVDQU", "("+base+")", x)
	a.op("VINSERTI128", "$1", "("+base+")(R11*1)", y, y)
	a.op("VCVTPH2PS", y, reg("Z", dst))
}

// pairRowKernel writes dotQ8x<bits>p2VNNI (see pairRowHeader).
func pairRowKernel(a *asm, w width) {
	name := fmt.Sprintf("dotQ8x%dp2VNNI", w.bits)
	l := labels(name)
	bb := w.blockBytes()
	a.blank()
	a.raw(fmt.Sprintf("// %d-bit codes: dotQ8x%dVNNI on row pairs.\n", w.bits, w.bits))
	a.text(name, pairRowArgs, 8, 96)
	a.movs([2]string{"src+24(FP)", "SI"}, [2]string{"scales+32(FP)", "R8"},
		[2]string{"zeros+40(FP)", "R9"}, [2]string{"ng+48(FP)", "R11"},
		[2]string{"y+72(FP)", "DX"}, [2]string{"rows+80(FP)", "BX"})
	// R14 = dist·ng·bpg·bb code bytes, R11 = 2·dist·ng scale bytes and
	// yoff = 4·dist output bytes from row r to row r+dist.
	a.op("IMULQ", "dist+88(FP)", "R11")
	a.op("MOVQ", "R11", "R14")
	a.op("IMULQ", "bpg+56(FP)", "R14")
	if bb == 12 {
		a.op("LEAQ", "(R14)(R14*2)", "R14")
		a.op("SHLQ", "$2", "R14")
	} else {
		a.op("SHLQ", imm(map[int]int{32: 5, 16: 4, 8: 3, 4: 2}[bb]), "R14")
	}
	a.op("SHLQ", "$1", "R11")
	a.op("MOVQ", "dist+88(FP)", "AX")
	a.op("SHLQ", "$2", "AX")
	a.op("MOVQ", "AX", "yoff-8(SP)")
	byteConsts(a, w, "Z", false)
	if w.bits != 8 {
		a.op("VMOVDQU64", fmt.Sprintf("q8pshift%d<>(SB)", w.shifts()), "Z14")
	}
	if w.u3() {
		hiConsts(a, "q8p")
	}
	for b := 0; b < 8; b++ {
		a.op("VMOVDQU64", fmt.Sprintf("q8pidx<>+%d(SB)", 64*b), reg("Z", 16+b))
	}

	rowStart(a, l)
	a.zero("X12", "X11", "X10", "X13", "X9")
	a.op("CMPQ", "bpg+56(FP)", "$1")
	a.jmp("JNE", l("group"))

	// Eight groups of one block: Z2 = d_b = s_b·S_b of both rows, Z1 =
	// s·z, the zero terms in Z10.
	a.label(l("oct"))
	a.op("CMPQ", "R10", "$8")
	a.jmp("JLT", l("tail"))
	halves(a, "R8", 0)
	a.op("VBROADCASTF64X4", "(R12)", "Z1")
	a.op("VMULPS", "Z1", "Z0", "Z2")
	a.op("TESTQ", "R9", "R9")
	a.jmp("JZ", l("octsym"))
	halves(a, "R9", 1)
	a.jmp("JMP", l("octz"))
	a.label(l("octsym"))
	a.op("VBROADCASTSS", "zsym+64(FP)", "Z1")
	a.label(l("octz"))
	a.op("VMULPS", "Z0", "Z1", "Z1")
	a.op("VBROADCASTF64X4", "(R13)", "Z3")
	a.op("VFMADD231PS", "Z3", "Z1", "Z10")
	for j := 0; j < 8*bb; j += 64 {
		a.op("PREFETCHT0", off(pfDist+j, "SI"))
		a.op("PREFETCHT0", fmt.Sprintf("%d(SI)(R14*1)", pfDist+j))
	}
	g := pfDist / bb * 2
	a.op("PREFETCHT0", off(g, "R8"))
	a.op("PREFETCHT0", fmt.Sprintf("%d(R8)(R11*1)", g))
	a.op("PREFETCHT0", off(g, "R9"))
	a.op("PREFETCHT0", fmt.Sprintf("%d(R9)(R11*1)", g))
	for b := 0; b < 8; b++ {
		pairDot(a, w, b*bb, b*32)
		a.op("VPERMPS", "Z2", reg("Z", 16+b), "Z6")
		a.op("VFMADD231PS", "Z6", "Z3", []string{"Z12", "Z11"}[b%2])
	}
	octNext(a, l, bb)

	a.label(l("tail"))
	a.op("TESTQ", "R10", "R10")
	a.jmp("JZ", l("done"))

	// One group at a time: s_g in X0 and X8, z_g in X1 and X2 (rows r and
	// r+dist), the group accumulators in Z5, Σ_b xsum_b in X7.
	a.label(l("group"))
	a.op("MOVWLZX", "(R8)", "AX")
	a.op("VMOVD", "AX", "X0")
	a.op("VCVTPH2PS", "X0", "X0")
	a.op("MOVWLZX", "(R8)(R11*1)", "AX")
	a.op("VMOVD", "AX", "X8")
	a.op("VCVTPH2PS", "X8", "X8")
	a.op("ADDQ", "$2", "R8")
	a.op("VMOVSS", "zsym+64(FP)", "X1")
	a.op("VMOVSS", "zsym+64(FP)", "X2")
	a.op("TESTQ", "R9", "R9")
	a.jmp("JZ", l("blocks"))
	a.op("MOVWLZX", "(R9)", "AX")
	a.op("VMOVD", "AX", "X1")
	a.op("VCVTPH2PS", "X1", "X1")
	a.op("MOVWLZX", "(R9)(R11*1)", "AX")
	a.op("VMOVD", "AX", "X2")
	a.op("VCVTPH2PS", "X2", "X2")
	a.op("ADDQ", "$2", "R9")
	a.label(l("blocks"))
	a.op("MOVQ", "bpg+56(FP)", "CX")
	a.zero("X7", "X5")
	a.label(l("block"))
	unpackPair(a, w, 0)
	a.op("VBROADCASTI64X4", "(DI)", "Z6")
	a.op("VPXORD", "Z3", "Z3", "Z3")
	a.op("VPDPBUSD", "Z6", "Z4", "Z3")
	a.op("VCVTDQ2PS", "Z3", "Z3")
	a.op("VBROADCASTSS", "(R12)", "Z6")
	a.op("VFMADD231PS", "Z6", "Z3", "Z5")
	a.op("VADDSS", "(R13)", "X7", "X7")
	blockStep(a, l, bb, true)
	a.op("VBROADCASTSS", "X0", "Y6")
	a.op("VBROADCASTSS", "X8", "Y3")
	a.op("VINSERTF64X4", "$1", "Y3", "Z6", "Z6")
	a.op("VFMADD231PS", "Z6", "Z5", "Z12")
	a.op("VMULSS", "X1", "X7", "X3")
	a.op("VFMADD231SS", "X0", "X3", "X13")
	a.op("VMULSS", "X2", "X7", "X3")
	a.op("VFMADD231SS", "X8", "X3", "X9")
	a.op("DECQ", "R10")
	a.jmp("JNZ", l("group"))

	a.label(l("done"))
	a.op("VADDPS", "Z11", "Z12", "Z12")
	a.op("VEXTRACTF64X4", "$1", "Z12", "Y4")
	a.op("VEXTRACTF64X4", "$1", "Z10", "Y5")
	reduceRow(a, 12, 10, "", "X13", "(DX)")
	a.op("MOVQ", "yoff-8(SP)", "AX")
	reduceRow(a, 4, 5, "", "X9", "(DX)(AX*1)")
	a.op("ADDQ", "$4", "DX")
	a.op("DECQ", "BX")
	a.jmp("JNZ", l("row"))
	a.op("VZEROUPPER")
	a.op("RET")
}

// pairRowFile returns qdot8p_amd64.s.
func pairRowFile() string {
	var a asm
	a.raw(pairRowHeader)
	for _, w := range widths[1:] {
		shiftTable(&a, "q8pshift", w, 2)
	}
	a.raw("\n// q8pidx<> row b: the VPERMPS index of d_b into the low half and d_{8+b}\n// (row 2p+1's d_b) into the high half.\n")
	a.data("q8pidx", 4, 128, func(k int) int { return k/16 + 8*(k%16/8) })
	hiTables(&a, "q8p", 2)
	for _, w := range widths {
		pairRowKernel(&a, w)
	}
	return a.b.String()
}
