package main

import "fmt"

// multiRowHeader is the comment block at the top of qdot8m_amd64.s.
const multiRowHeader = `//go:build !purego

#include "textflag.h"

// Integer dot products of packed weight rows with four int8 activation
// rows at once (qdot8.go, DotQ8Matrix): each block of 32 codes is unpacked
// once and multiplied with the four rows' Q. Arguments as the one-row
// kernels of qdot8_amd64.s (the same shift tables, copied: <> symbols
// are local to a file),
// with row i < 4 of the activations at xq + i·xstride, xs + i·sstride and
// xsum + i·sstride (bytes), and the result of packed row r against it at
// y + i·ystride + 4r.
// Every activation row goes through exactly the float32 operations, in
// the same order, as in the one-row kernel for the same width (the VNNI
// kernels run the runs of eight groups of 32 on Z registers, blocks 2p
// and 2p+1 in the low and high halves: the one-row kernel's totals of
// even and odd blocks, lane for lane): the same
// int32 lanes per block, the same FMAs into the two alternating totals
// (group 32) or the group accumulator, the same vector and scalar zero
// terms (kept on the stack here: the 16 vector registers hold the four
// rows' totals), the same final reduction; so every output is bit for bit
// the one-row kernel's.
// Registers: SI src, R8 scales, R9 zeros, R10 groups left, R11 bpg, CX
// blocks left, DI xq, R12 xs, R13 xsum, R14 xstride, DX 3·xstride, R15
// sstride, BX 3·sstride; Y5-Y8 the rows' totals (even blocks), Y10-Y13
// their totals of odd blocks, or (spilled to the stack) the group
// accumulators; Y15 (VNNI: Z15) the byte constant, Y14 (Z14) the shifts
// (8 bits: int16 ones), Y9 int16 ones (VNNI: Z9 the qword or dword index
// that spreads two blocks' codes, K1 the mask of the high half, Y16-Y19
// the rows' d_b = s_b·S_b of a run of eight groups and Z20-Z23 the
// VPERMPS indices that put d_2p and d_2p+1 in the two halves; 3 bits:
// Z28-Z31, K2); Y0-Y4 scratch. Stack: 0 the rows' d_b (AVX2; 8 floats
// each), 128 the vector zero terms, 256 the spilled odd totals,
// 384 the scalar zero terms, 400 s_g, 404 z_g, 408 y, 416 rows left.

`

// multiRows is the number of activation rows of the multi-row kernels;
// the register assignment (four totals of even and of odd blocks, the
// strides 1·, 2· and 3· in index registers) is written for four.
const multiRows = 4

// Stack layout of the multi-row kernels (bytes from SP), as multiRowHeader.
const (
	stackD     = 0   // d_b = s_b·S_b: 8 floats a row
	stackVZ    = 128 // vector zero terms: 8 floats a row
	stackOdd   = 256 // spilled totals of odd blocks: 8 floats a row
	stackSZ    = 384 // scalar zero terms: 1 float a row
	stackSG    = 400 // s_g
	stackZG    = 404 // z_g
	stackY     = 408 // y
	stackRows  = 416 // rows left
	stackFrame = 424
)

// multiRowArgs is the Go signature shared by the multi-row kernels.
const multiRowArgs = "(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)"

// rowAddr is activation row i's operand at base + disp: base, then
// base + xstride, + 2·xstride, + 3·xstride (idx the stride register, idx3
// the register holding three strides). disp < 0 writes no displacement.
func rowAddr(disp int, base, idx, idx3 string, i int) string {
	s := fmt.Sprintf("(%s)", base)
	if disp >= 0 {
		s = fmt.Sprintf("%d%s", disp, s)
	}
	switch i {
	case 1:
		s += "(" + idx + "*1)"
	case 2:
		s += "(" + idx + "*2)"
	case 3:
		s += "(" + idx3 + "*1)"
	}
	return s
}

// xqRow, sRow: activation row i's int8 Q at xq offset d, its float32
// block values (xs or xsum pointer base) at the current block.
func xqRow(d, i int) string          { return rowAddr(d, "DI", "R14", "DX", i) }
func sRow(base string, i int) string { return rowAddr(-1, base, "R15", "BX", i) }

// sp is a stack operand.
func sp(d int) string { return fmt.Sprintf("%d(SP)", d) }

// multiRowDot writes, for activation row i, the exact int32 dot product
// with the unpacked block in Y4 (8-bit AVX2: |c−128| in Y3, the signs in
// Y4) at xq offset xo, into the class's register 0, converted to float32.
func multiRowDot(a *asm, w width, k isa, class string, xo, i int) {
	r0 := class + "0"
	switch {
	case k == vnni:
		if class == "Z" {
			a.op("VPXORD", r0, r0, r0)
		} else {
			a.op("VPXOR", r0, r0, r0)
		}
		a.op("VPDPBUSD", xqRow(xo, i), class+"4", r0)
	case w.bits == 8:
		a.op("VMOVDQU", xqRow(xo, i), "Y0")
		a.op("VPSIGNB", "Y4", "Y0", "Y0")
		a.op("VPMADDUBSW", "Y0", "Y3", "Y0")
		a.op("VPMADDWD", "Y14", "Y0", "Y0")
	default:
		a.op("VPMADDUBSW", xqRow(xo, i), "Y4", "Y0")
		a.op("VPMADDWD", "Y9", "Y0", "Y0")
	}
	a.op("VCVTDQ2PS", r0, r0)
}

// multiUnpack writes the Y-register unpacking of the block at src offset
// so (8-bit AVX2: also the sign split).
func multiUnpack(a *asm, w width, k isa, so int) {
	unpack(a, w, k, so, "Y2", "q8m")
	if w.bits == 8 && k == avx2 {
		a.op("VPXOR", "Y15", "Y4", "Y4")
		a.op("VPSIGNB", "Y4", "Y4", "Y3")
	}
}

// pairUnpack writes the VNNI unpacking of blocks 2p and 2p+1 into the low
// and high halves of Z4.
func pairUnpack(a *asm, w width, p int) {
	so := 2 * p * w.blockBytes()
	if w.bits == 8 {
		a.op("VMOVDQU64", off(so, "SI"), "Z4")
		return
	}
	if w.u3() {
		// Each block's two planes by broadcasts, the high dwords of both
		// tested at once.
		bb := w.blockBytes()
		a.op("VPBROADCASTQ", off(so, "SI"), "Y4")
		a.op("VPBROADCASTQ", off(so+bb, "SI"), "Y29")
		a.op("VINSERTI64X4", "$1", "Y29", "Z4", "Z4")
		a.op("VPBROADCASTD", off(so+8, "SI"), "Y28")
		a.op("VPBROADCASTD", off(so+bb+8, "SI"), "Y29")
		a.op("VINSERTI64X4", "$1", "Y29", "Z28", "Z28")
		a.op("VPTESTMB", "Z30", "Z28", "K2")
		a.op(w.shift, "Z14", "Z4", "Z4")
		a.op("VPANDD", "Z15", "Z4", "Z4")
		a.op("VPADDB", "Z31", "Z4", "K2", "Z4")
		return
	}
	a.op(w.pairLoad, off(so, "SI"), w.pairClass+"4")
	a.raw("\t" + w.spread + "\n")
	a.op(w.shift, "Z14", "Z4", "Z4")
	a.op("VPANDD", "Z15", "Z4", "Z4")
}

// multiRowKernel writes dotQ8x<bits>m4<isa> (see multiRowHeader).
func multiRowKernel(a *asm, w width, k isa) {
	name := fmt.Sprintf("dotQ8x%dm4%s", w.bits, k)
	l := labels(name)
	shifted := zoffShifted(w, k)
	bb := w.blockBytes()
	even := func(i int) int { return 5 + i }
	odd := func(i int) int { return 10 + i }
	a.blank()
	a.text(name, multiRowArgs, stackFrame, 112)
	if k == avx2 {
		byteConsts(a, w, "Y", true)
		if w.bits == 8 {
			a.op("VMOVDQU", "Y9", "Y14")
		} else {
			a.op("VMOVDQU", fmt.Sprintf("q8mshift%d<>(SB)", w.shifts()), "Y14")
		}
	} else {
		byteConsts(a, w, "Z", false)
		if w.bits != 8 {
			a.op("VMOVDQU64", fmt.Sprintf("q8mshift%d<>(SB)", w.shifts()), "Z14")
		}
		if w.u3() {
			hiConsts(a, "q8m")
		}
		for p := 0; p < 4; p++ {
			a.op("VMOVDQU64", fmt.Sprintf("q8mdidx<>+%d(SB)", 64*p), reg("Z", 20+p))
		}
		if w.idx != "" {
			a.op("VMOVDQU64", w.idx+"<>(SB)", "Z9")
		}
		a.op("MOVL", "$0xff00", "AX")
		a.op("KMOVW", "AX", "K1")
	}
	a.movs([2]string{"src+24(FP)", "SI"}, [2]string{"scales+32(FP)", "R8"},
		[2]string{"zeros+40(FP)", "R9"}, [2]string{"bpg+56(FP)", "R11"},
		[2]string{"y+72(FP)", "AX"}, [2]string{"AX", sp(stackY)},
		[2]string{"rows+80(FP)", "AX"}, [2]string{"AX", sp(stackRows)},
		[2]string{"xstride+88(FP)", "R14"}, [2]string{"sstride+96(FP)", "R15"})
	a.op("LEAQ", "(R14)(R14*2)", "DX")
	a.op("LEAQ", "(R15)(R15*2)", "BX")

	rowStart(a, l)
	for i := 0; i < multiRows; i++ {
		a.zero(reg("Y", even(i)))
	}
	for i := 0; i < multiRows; i++ {
		a.zero(reg("Y", odd(i)))
	}
	for i := 0; i < multiRows; i++ {
		a.op("VMOVUPS", "Y5", sp(stackVZ+32*i))
	}
	a.op("VMOVUPS", "X5", sp(stackSZ))
	a.op("CMPQ", "R11", "$1")
	a.jmp("JNE", l("spill"))

	// Eight groups of one block.
	octStart(a, l, none, func() {
		if shifted {
			a.op("VBROADCASTSS", "zoff+68(FP)", "Y2")
			a.op("VSUBPS", "Y2", "Y1", "Y1")
		}
	})
	for i := 0; i < multiRows; i++ {
		if k == vnni {
			// d_b kept in Y16+i and spread by VPERMPS: two broadcasts
			// from the stack a block pair and row were the four-row
			// kernels' bottleneck (BenchmarkQ8GEMV m=16, AVX-512 VNNI:
			// 8 bits 2.6–3.2 → 3.8–4.3 GB/s, 4 bits 1.3–1.6 → 1.8–1.9;
			// the same bits, VPERMPS copies the lane).
			a.op("VMULPS", sRow("R12", i), "Y0", reg("Y", 16+i))
		} else {
			a.op("VMULPS", sRow("R12", i), "Y0", "Y2")
			a.op("VMOVUPS", "Y2", sp(stackD+32*i))
		}
		a.op("VMOVUPS", sp(stackVZ+32*i), "Y3")
		a.op("VFMADD231PS", sRow("R13", i), "Y1", "Y3")
		a.op("VMOVUPS", "Y3", sp(stackVZ+32*i))
	}
	if k == avx2 {
		for b := 0; b < 8; b++ {
			multiUnpack(a, w, k, b*bb)
			for i := 0; i < multiRows; i++ {
				multiRowDot(a, w, k, "Y", 32*b, i)
				a.op("VBROADCASTSS", sp(stackD+32*i+4*b), "Y1")
				t := even(i)
				if b%2 == 1 {
					t = odd(i)
				}
				a.op("VFMADD231PS", "Y1", "Y0", reg("Y", t))
			}
		}
	} else {
		for p := 0; p < 4; p++ {
			pairUnpack(a, w, p)
			for i := 0; i < multiRows; i++ {
				multiRowDot(a, w, k, "Z", 64*p, i)
				a.op("VPERMPS", reg("Z", 16+i), reg("Z", 20+p), "Z1")
				a.op("VFMADD231PS", "Z1", "Z0", reg("Z", even(i)))
			}
		}
	}
	octNext(a, l, bb)

	a.label(l("tail"))
	if k == vnni {
		// The high halves are the totals of odd blocks.
		for i := 0; i < multiRows; i++ {
			a.op("VEXTRACTF64X4", "$1", reg("Z", even(i)), reg("Y", odd(i)))
		}
	}
	a.op("TESTQ", "R10", "R10")
	a.jmp("JZ", l("reduce"))

	a.label(l("spill"))
	for i := 0; i < multiRows; i++ {
		a.op("VMOVUPS", reg("Y", odd(i)), sp(stackOdd+32*i))
	}

	// One group at a time: s_g, z_g on the stack, the group accumulators
	// in the odd totals' registers.
	groupStart(a, l, func() { a.op("VMOVSS", "X0", sp(stackSG)) }, func() {
		if shifted {
			a.op("VMOVSS", "zoff+68(FP)", "X2")
			a.op("VSUBSS", "X2", "X1", "X1")
		}
	})
	a.op("VMOVSS", "X1", sp(stackZG))
	a.op("MOVQ", "R11", "CX")
	for i := 0; i < multiRows; i++ {
		a.zero(reg("Y", odd(i)))
	}
	a.label(l("block"))
	multiUnpack(a, w, k, 0)
	for i := 0; i < multiRows; i++ {
		multiRowDot(a, w, k, "Y", 0, i)
		a.op("VBROADCASTSS", sRow("R12", i), "Y1")
		a.op("VFMADD231PS", "Y1", "Y0", reg("Y", odd(i)))
	}
	blockStep(a, l, bb, false)
	a.op("VBROADCASTSS", sp(stackSG), "Y0")
	for i := 0; i < multiRows; i++ {
		a.op("VFMADD231PS", "Y0", reg("Y", odd(i)), reg("Y", even(i)))
	}
	a.op("MOVQ", "R11", "CX")
	for i := 0; i < multiRows; i++ {
		a.zero(reg("X", i))
	}
	a.label(l("zsum"))
	for i := 0; i < multiRows; i++ {
		a.op("VADDSS", sRow("R13", i), reg("X", i), reg("X", i))
	}
	a.op("ADDQ", "$4", "R13")
	a.op("DECQ", "CX")
	a.jmp("JNZ", l("zsum"))
	a.blank()
	for i := 0; i < multiRows; i++ {
		x := reg("X", i)
		a.op("VMULSS", sp(stackZG), x, x)
		a.op("VMOVSS", sp(stackSZ+4*i), "X4")
		a.op("VFMADD231SS", sp(stackSG), x, "X4")
		a.op("VMOVSS", "X4", sp(stackSZ+4*i))
	}
	a.op("DECQ", "R10")
	a.jmp("JNZ", l("group"))
	for i := 0; i < multiRows; i++ {
		a.op("VMOVUPS", sp(stackOdd+32*i), reg("Y", odd(i)))
	}

	a.label(l("reduce"))
	a.op("MOVQ", sp(stackY), "AX")
	a.op("MOVQ", "ystride+104(FP)", "CX")
	a.op("LEAQ", "(CX)(CX*2)", "R10")
	for i := 0; i < multiRows; i++ {
		a.op("VADDPS", reg("Y", odd(i)), reg("Y", even(i)), reg("Y", even(i)))
		reduceRow(a, even(i), 2, sp(stackVZ+32*i), sp(stackSZ+4*i), rowAddr(-1, "AX", "CX", "R10", i))
	}
	a.op("ADDQ", "$4", "AX")
	a.op("MOVQ", "AX", sp(stackY))
	a.op("DECQ", sp(stackRows))
	a.jmp("JNZ", l("row"))
	a.op("VZEROUPPER")
	a.op("RET")
}

// multiRowFile returns qdot8m_amd64.s.
func multiRowFile() string {
	var a asm
	a.raw(multiRowHeader)
	for _, w := range widths[1:] {
		shiftTable(&a, "q8mshift", w, 2)
	}
	a.data("q8midx2", 8, 8, func(k int) int { return k / 4 })
	a.data("q8midx1", 4, 16, func(k int) int { return k / 8 })
	hiTables(&a, "q8m", 2)
	a.data("q8mdidx", 4, 64, func(k int) int { return 2*(k/16) + k%16/8 })
	for _, w := range widths {
		for _, k := range []isa{avx2, vnni} {
			multiRowKernel(&a, w, k)
		}
	}
	return a.b.String()
}
