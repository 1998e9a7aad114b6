package main

// actHeader is the comment block at the top of qdot8act_amd64.s.
const actHeader = `//go:build !purego

#include "textflag.h"

// QuantizeActQ8's blocks of 32 (qdot8.go), AVX2: per block max|x| as the
// largest absolute value's bits (vpmaxsd on the sign-cleared bits: for
// non-negative floats the integer order is the float order), d = mx/127
// and inv = 127/mx in float32 (vdivss), Q = clamp(round(x·inv), ±127) with
// x·inv in float32 and vcvtps2dq rounding to nearest even (MXCSR
// default), Sum = d·float32(ΣQ). An all-zero block (max bits 0) gets Q, S
// and Sum zero. A block whose max is not finite or below 2^−119 (where
// 127/mx could overflow) is left to the Go loop: it is counted in bad.
// Registers: SI x, DI q, R8 s, R9 sum, CX blocks left, R10 bad; Y15 the
// abs mask, Y14 int32 127, Y13 int32 −127, Y12 the byte order, X11 127.0.

`

// actVecs is the number of Y registers (eight float32 each) a block of 32
// activations occupies.
const actVecs = 4

// broadcastD writes the broadcast of the 32-bit immediate v into Y<n>
// through AX and X<n>.
func broadcastD(a *asm, v string, n int) {
	a.op("MOVL", v, "AX")
	a.op("VMOVD", "AX", reg("X", n))
	a.op("VPBROADCASTD", reg("X", n), reg("Y", n))
}

// eachVec writes mnemonic with operands f(j) for each of the block's Y
// registers j.
func eachVec(a *asm, mnemonic string, f func(j int) []string) {
	for j := 0; j < actVecs; j++ {
		a.op(mnemonic, f(j)...)
	}
}

// horizontal writes the reduction by mnemonic (an int32 lane operation)
// of the four vectors Y<s>..Y<s+3> to lane 0 of X<d>: Y<s>,Y<s+1> into
// Y<d> and Y<s+2>,Y<s+3> into Y<pair>, those two into Y<d>, then its
// halves and lanes, with X<lane> as scratch.
func horizontal(a *asm, mnemonic string, s, d, pair, lane int) {
	y, x, xl := reg("Y", d), reg("X", d), reg("X", lane)
	a.op(mnemonic, reg("Y", s+1), reg("Y", s), y)
	a.op(mnemonic, reg("Y", s+3), reg("Y", s+2), reg("Y", pair))
	a.op(mnemonic, reg("Y", pair), y, y)
	a.op("VEXTRACTI128", "$1", y, xl)
	a.op(mnemonic, xl, x, x)
	for _, sh := range []string{"$0x4e", "$0xb1"} {
		a.op("VPSHUFD", sh, x, xl)
		a.op(mnemonic, xl, x, x)
	}
}

// actFile returns qdot8act_amd64.s.
func actFile() string {
	var a asm
	a.raw(actHeader)
	// vpackssdw and vpacksswb interleave the four vectors' 128-bit lanes;
	// vpermd with this order puts the 32 bytes back in sequence.
	perm := []int{0, 4, 1, 5, 2, 6, 3, 7}
	a.data("q8actperm", 4, 8, func(k int) int { return perm[k] })
	a.blank()
	const name = "quantActQ8x32"
	l := labels(name)
	a.text(name, "(x *float32, q *int8, s, sum *float32, nb int) (bad int)", 0, 48)
	a.movs([2]string{"x+0(FP)", "SI"}, [2]string{"q+8(FP)", "DI"}, [2]string{"s+16(FP)", "R8"},
		[2]string{"sum+24(FP)", "R9"}, [2]string{"nb+32(FP)", "CX"})
	a.op("XORQ", "R10", "R10")
	broadcastD(&a, "$0x7fffffff", 15)
	broadcastD(&a, "$127", 14)
	broadcastD(&a, "$-127", 13)
	a.op("VMOVDQU", "q8actperm<>(SB)", "Y12")
	a.op("MOVL", "$0x42fe0000", "AX") // 127.0
	a.op("VMOVD", "AX", "X11")
	a.op("TESTQ", "CX", "CX")
	a.jmp("JZ", l("end"))

	a.label(l("block"))
	eachVec(&a, "VMOVUPS", func(j int) []string { return []string{off(32*j, "SI"), reg("Y", j)} })
	eachVec(&a, "VPAND", func(j int) []string { return []string{"Y15", reg("Y", j), reg("Y", 4+j)} })
	horizontal(&a, "VPMAXSD", 4, 4, 6, 5) // max |x| bits into X4
	a.op("VMOVD", "X4", "AX")
	a.op("TESTL", "AX", "AX")
	a.jmp("JZ", l("zero"))
	a.op("CMPL", "AX", "$0x04000000") // 2^−119
	a.jmp("JB", l("bad"))
	a.op("CMPL", "AX", "$0x7f800000") // +Inf
	a.jmp("JAE", l("bad"))
	a.op("VDIVSS", "X4", "X11", "X5")
	a.op("VDIVSS", "X11", "X4", "X6")
	a.op("VBROADCASTSS", "X5", "Y5")
	eachVec(&a, "VMULPS", func(j int) []string { return []string{"Y5", reg("Y", j), reg("Y", j)} })
	eachVec(&a, "VCVTPS2DQ", func(j int) []string { return []string{reg("Y", j), reg("Y", j)} })
	eachVec(&a, "VPMINSD", func(j int) []string { return []string{"Y14", reg("Y", j), reg("Y", j)} })
	eachVec(&a, "VPMAXSD", func(j int) []string { return []string{"Y13", reg("Y", j), reg("Y", j)} })
	horizontal(&a, "VPADDD", 0, 8, 9, 9) // ΣQ into X8
	a.op("VCVTDQ2PS", "X8", "X8")
	a.op("VMULSS", "X6", "X8", "X8")
	a.op("VPACKSSDW", "Y1", "Y0", "Y0")
	a.op("VPACKSSDW", "Y3", "Y2", "Y2")
	a.op("VPACKSSWB", "Y2", "Y0", "Y0")
	a.op("VPERMD", "Y0", "Y12", "Y0")
	a.op("VMOVDQU", "Y0", "(DI)")
	a.op("VMOVSS", "X6", "(R8)")
	a.op("VMOVSS", "X8", "(R9)")
	a.jmp("JMP", l("next"))

	a.label(l("zero"))
	a.op("VPXOR", "Y0", "Y0", "Y0")
	a.op("VMOVDQU", "Y0", "(DI)")
	a.op("MOVL", "$0", "(R8)")
	a.op("MOVL", "$0", "(R9)")
	a.jmp("JMP", l("next"))

	a.label(l("bad"))
	a.op("INCQ", "R10")

	a.label(l("next"))
	a.op("ADDQ", imm(4*32), "SI")
	a.op("ADDQ", "$32", "DI")
	a.op("ADDQ", "$4", "R8")
	a.op("ADDQ", "$4", "R9")
	a.op("DECQ", "CX")
	a.jmp("JNZ", l("block"))

	a.label(l("end"))
	a.op("MOVQ", "R10", "bad+40(FP)")
	a.op("VZEROUPPER")
	a.op("RET")
	return a.b.String()
}
