package main

import "fmt"

// oneRowHeader is the comment block at the top of qdot8_amd64.s.
const oneRowHeader = `//go:build !purego

#include "textflag.h"

// Integer dot products of one packed weight row with one int8 activation
// row (qdot8.go, DotQ8Rows). Arguments of every kernel:
//   xq     int8 activations [ng·bpg·32]: Q (8-bit kernels), or Q in
//          the order of Q8Act.Prepare for the width (4, 2, 1 bits)
//   xs     block scales S [ng·bpg]; xsum S·ΣQ per block [ng·bpg]
//   src    the row's packed codes (bits·4 bytes a block of 32)
//   scales, zeros  float16 per group (zeros nil: zsym for every group)
//   ng >= 1 groups of bpg >= 1 blocks of 32 codes
//   y, rows  rows >= 1 consecutive packed rows (codes, scales and zeros
//          each contiguous from row to row), y[r] the result of row r
//          against the same activation row; zoff unused but by the
//          8-bit AVX2 kernel
// Per block the 32 code·Q products are summed exactly into eight int32
// lanes and converted to float32. With one block per group (group 32),
// eight groups at a time: their scales and zero-points are converted in
// one vcvtph2ps each, d_b = s_b·S_b is kept in an 8-float stack buffer and
// broadcast from it into an FMA per block, and the zero terms
// s_b·z_b·xsum_b are accumulated as a vector. Otherwise (and for the
// groups left over), per group: each block's lanes are FMAed with S_b
// (broadcast from memory) into a group accumulator, scaled by s_g into the
// total at the end of the group, and the zero term s_g·z_g·Σ_b xsum_b is
// accumulated in a scalar. The result is the horizontal sum of the total
// minus the zero terms. Between rows the weight pointers run on, the
// activation pointers restart.
// Registers: DX y, BX rows left, DI xq, R12 xs, R13 xsum, SI src, R8 scales, R9 zeros,
// R10 groups left, R11 bpg, CX blocks left; Y12, Y11 totals, Y10 vector
// zero terms, X13 scalar zero terms, Y14 int16 ones or the nibble shifts,
// Y15 the byte constant, Y9 int16 ones, X2 zoff; Y0-Y8 scratch.

// Per-lane right shifts that bring a block's codes to bit 0: 4 bits,
// qwords (0, 0, 4, 4); 2 bits, qwords (0, 2, 4, 6); 1 bit, dwords 0..7.
`

// oneRowDoc is the comment above each one-row kernel, by width and ISA.
var oneRowDoc = map[int]map[isa]string{
	8: {
		avx2: `// 8-bit codes, AVX2: c − 128 as signed bytes (so zsym and the zeros come
// shifted by zoff = 128), |c−128| times Q·sign(c−128) by vpmaddubsw
// (pairs ≤ 2·128·127, no saturation), vpmaddwd into int32.
`,
		vnni: "// 8-bit codes, AVX-512 VNNI (VL): vpdpbusd of the unsigned codes and Q.\n",
	},
	4: {
		avx2: `// 4-bit codes, AVX2: the 16 bytes in both lanes, the upper lane shifted
// right by 4 (vpsrlvq), masked to nibbles: even codes, then odd codes, the
// order of Prepare(4); vpmaddubsw with it (pairs ≤ 2·15·127), vpmaddwd into int32.
`,
		vnni: "// 4-bit codes, AVX-512 VNNI (VL): the nibbles as for dotQ8x4AVX2, vpdpbusd.\n",
	},
	2: {
		avx2: `// 2-bit codes, AVX2: the 8 bytes in all four qwords, qword t shifted right
// by 2t (vpsrlvq) and masked to 2 bits: codes 4i+t at byte 8t+i, the order
// of Prepare(2); vpmaddubsw, vpmaddwd into int32.
`,
		vnni: "// 2-bit codes, AVX-512 VNNI (VL): the codes as for dotQ8x2AVX2, vpdpbusd.\n",
	},
	1: {
		avx2: `// 1-bit codes, AVX2: the 4 bytes in all eight dwords, dword t shifted right
// by t (vpsrlvd) and masked to 1 bit: codes 8i+t at byte 4t+i, the order
// of Prepare(1); vpmaddubsw, vpmaddwd into int32.
`,
		vnni: "// 1-bit codes, AVX-512 VNNI (VL): the codes as for dotQ8x1AVX2, vpdpbusd.\n",
	},
	3: {
		avx2: `// 3-bit codes (SplitU3's blocks of 12 bytes), AVX2: the 2-bit plane's 8
// bytes unpacked as for dotQ8x2AVX2, 4 added to (or'ed into) the bytes
// whose high bit is set (the high dword broadcast, vpand and vpcmpeqb
// with q8hbit, vpand with q8four): the order of Prepare(2); vpmaddubsw
// (pairs ≤ 2·7·127), vpmaddwd into int32.
`,
		vnni: `// 3-bit codes, AVX-512 VNNI (VL, BW): the 2-bit plane as for
// dotQ8x2AVX2, vptestmb of the broadcast high dword with q8hbit into K2,
// a K2-masked vpaddb of 4; vpdpbusd.
`,
	},
}

// oneRowArgs is the Go signature shared by the one-row kernels.
const oneRowArgs = "(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)"

// zoffShifted reports whether a kernel subtracts zoff from the stored
// zero-points: only the 8-bit AVX2 kernels, which compute with c−128.
func zoffShifted(w width, k isa) bool { return w.bits == 8 && k == avx2 }

// byteConsts writes the prologue's constants common to the AVX2 kernels:
// the byte constant in Y15 (class Y) or Z15 (class Z) and, for AVX2, int16
// ones in Y9.
func byteConsts(a *asm, w width, class string, ones bool) {
	a.op("MOVL", "$"+w.mask, "AX")
	a.op("VMOVD", "AX", "X15")
	a.op("VPBROADCASTB", "X15", class+"15")
	if ones {
		a.op("VPCMPEQW", "Y9", "Y9", "Y9")
		a.op("VPSRLW", "$15", "Y9", "Y9")
	}
}

// oneRowDot writes the exact int32 dot product of the block at src offset
// so with the activations at xq offset xo into Y3, converted to float32.
func oneRowDot(a *asm, w width, k isa, so, xo int) {
	oneRowDotAt(a, w, k, func(d int) string { return off(d, "SI") }, so, xo)
}

// oneRowDotAt is oneRowDot with the block's codes at src(so).
func oneRowDotAt(a *asm, w width, k isa, src func(int) string, so, xo int) {
	unpackAt(a, w, k, src, so, "Y8", "q8")
	switch {
	case k == vnni:
		a.op("VPXOR", "Y3", "Y3", "Y3")
		a.op("VPDPBUSD", off(xo, "DI"), "Y4", "Y3")
	case w.bits == 8:
		a.op("VPXOR", "Y15", "Y4", "Y4")
		a.op("VMOVDQU", off(xo, "DI"), "Y8")
		a.op("VPSIGNB", "Y4", "Y4", "Y3")
		a.op("VPSIGNB", "Y4", "Y8", "Y8")
		a.op("VPMADDUBSW", "Y8", "Y3", "Y3")
		a.op("VPMADDWD", "Y14", "Y3", "Y3")
	default:
		a.op("VPMADDUBSW", off(xo, "DI"), "Y4", "Y3")
		a.op("VPMADDWD", "Y9", "Y3", "Y3")
	}
	a.op("VCVTDQ2PS", "Y3", "Y3")
}

// oneRowKernel writes dotQ8x<bits><isa> (see oneRowHeader).
func oneRowKernel(a *asm, w width, k isa) {
	name := fmt.Sprintf("dotQ8x%d%s", w.bits, k)
	l := labels(name)
	bb := w.blockBytes()
	shifted := zoffShifted(w, k)
	a.blank()
	a.raw(oneRowDoc[w.bits][k])
	a.text(name, oneRowArgs, 32, 88)
	a.movs([2]string{"src+24(FP)", "SI"}, [2]string{"scales+32(FP)", "R8"},
		[2]string{"zeros+40(FP)", "R9"}, [2]string{"bpg+56(FP)", "R11"},
		[2]string{"y+72(FP)", "DX"}, [2]string{"rows+80(FP)", "BX"})
	if shifted {
		a.op("VBROADCASTSS", "zoff+68(FP)", "Y2")
	}
	byteConsts(a, w, "Y", true)
	if w.bits == 8 {
		a.op("VMOVDQU", "Y9", "Y14")
	} else {
		a.op("VMOVDQU", fmt.Sprintf("q8shift%d<>(SB)", w.shifts()), "Y14")
	}
	if w.u3() && k == vnni {
		hiConsts(a, "q8")
	}

	rowStart(a, l)
	a.zero("Y12", "Y11", "Y10", "X13")
	a.op("CMPQ", "R11", "$1")
	a.jmp("JNE", l("group"))

	// Eight groups of one block: d_b in the 8-float stack buffer, the zero
	// terms as a vector in Y10.
	octStart(a, l, func() {
		a.op("VMULPS", "(R12)", "Y0", "Y1")
		a.op("VMOVUPS", "Y1", "tmp-32(SP)")
	}, func() {
		if shifted {
			a.op("VSUBPS", "Y2", "Y1", "Y1")
		}
	})
	a.op("VFMADD231PS", "(R13)", "Y1", "Y10")
	octPrefetch(a, bb)
	for b := 0; b < 8; b++ {
		oneRowDot(a, w, k, b*bb, b*32)
		a.op("VBROADCASTSS", fmt.Sprintf("tmp-%d(SP)", 32-4*b), "Y6")
		a.op("VFMADD231PS", "Y6", "Y3", []string{"Y12", "Y11"}[b%2])
	}
	octNext(a, l, bb)

	a.label(l("tail"))
	a.op("TESTQ", "R10", "R10")
	a.jmp("JZ", l("done"))

	// One group at a time: s_g in X0, z_g in X1, the group accumulator in
	// Y5, Σ_b xsum_b in X7.
	groupStart(a, l, none, func() {
		if shifted {
			a.op("VSUBSS", "X2", "X1", "X1")
		}
	})
	a.op("MOVQ", "R11", "CX")
	a.zero("X7", "Y5")
	a.label(l("block"))
	oneRowDot(a, w, k, 0, 0)
	a.op("VBROADCASTSS", "(R12)", "Y6")
	a.op("VFMADD231PS", "Y6", "Y3", "Y5")
	a.op("VADDSS", "(R13)", "X7", "X7")
	blockStep(a, l, bb, true)
	a.op("VBROADCASTSS", "X0", "Y6")
	a.op("VFMADD231PS", "Y6", "Y5", "Y12")
	a.op("VMULSS", "X1", "X7", "X7")
	a.op("VFMADD231SS", "X0", "X7", "X13")
	a.op("DECQ", "R10")
	a.jmp("JNZ", l("group"))

	a.label(l("done"))
	a.op("VADDPS", "Y11", "Y12", "Y12")
	reduceRow(a, 12, 10, "", "X13", "(DX)")
	a.op("ADDQ", "$4", "DX")
	a.op("DECQ", "BX")
	a.jmp("JNZ", l("row"))
	a.op("VZEROUPPER")
	a.op("RET")
}

// reduceRow writes the final reduction of one result: the total in Y<t>
// (both totals already added) folded to X<t>, minus the vector zero terms
// in Y<vz> folded to X<vz> (first loaded from the stack operand loadVZ
// where that is not empty), horizontally summed, minus the scalar zero
// terms sz, stored to dst. X3 is scratch.
func reduceRow(a *asm, t, vz int, loadVZ, sz, dst string) {
	x, z := reg("X", t), reg("X", vz)
	a.op("VEXTRACTF128", "$1", reg("Y", t), "X3")
	a.op("VADDPS", "X3", x, x)
	if loadVZ != "" {
		a.op("VMOVUPS", loadVZ, reg("Y", vz))
	}
	a.op("VEXTRACTF128", "$1", reg("Y", vz), "X3")
	a.op("VADDPS", "X3", z, z)
	a.op("VSUBPS", z, x, x)
	a.op("VHADDPS", x, x, x)
	a.op("VHADDPS", x, x, x)
	a.op("VSUBSS", sz, x, x)
	a.op("VMOVSS", x, dst)
}

// oneRowFile returns qdot8_amd64.s.
func oneRowFile() string {
	var a asm
	a.raw(oneRowHeader)
	for _, w := range widths[1:] {
		shiftTable(&a, "q8shift", w, 1)
	}
	hiTables(&a, "q8", 2)
	for _, w := range widths {
		for _, k := range []isa{avx2, vnni} {
			oneRowKernel(&a, w, k)
		}
	}
	for _, w := range widths {
		if pairsAVX2Width(w) {
			pairAVX2Kernel(&a, w)
		}
	}
	return a.b.String()
}

// pfDist is the distance in code bytes ahead of the loads at which the
// one-row kernels' oct loop prefetches the packed codes (PREFETCHT0 on
// every 64-byte line of the next eight groups' codes), and the scales and
// zero-points the same number of groups ahead. A single decode thread's
// hardware prefetch alone leaves DRAM reads well under the copy bandwidth
// (runtime/kernels BenchmarkGEMVDRAM, 1 thread, EPYC Zen 4: 4-bit g32 15
// GB/s without, 19.7 with; 8-bit 19 → 23; distances 1024 and 4096 did
// less).
const pfDist = 2048

// octPrefetch writes the oct loop's prefetches for blocks of bb code
// bytes (pfDist). With zeros nil, R9 is 0 and its prefetch, of an
// unmapped address, is dropped by the CPU (prefetches never fault).
func octPrefetch(a *asm, bb int) {
	for j := 0; j < 8*bb; j += 64 {
		a.op("PREFETCHT0", off(pfDist+j, "SI"))
	}
	g := pfDist / bb * 2 // bytes of scales (zeros) pfDist/bb groups ahead
	a.op("PREFETCHT0", off(g, "R8"))
	a.op("PREFETCHT0", off(g, "R9"))
}
