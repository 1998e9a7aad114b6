package main

// width describes one code width of the packed weights: how a block of 32
// codes is stored and how it is brought to one code a byte, the layout
// Q8Act.Prepare orders the activations for (runtime/kernels/qdot8.go).
type width struct {
	bits int
	// mask is the byte constant broadcast into Y15/Z15: 0x80 flips 8-bit
	// codes to c−128; otherwise the mask of one code.
	mask string
	// load brings a block's bits·4 bytes into every lane that needs them
	// (one-row kernels and the Y-register block loops); empty for 8 bits,
	// whose 32 bytes are loaded whole.
	load string
	// shift is the per-lane variable right shift (qwords or dwords) by the
	// shift table q8shift<bits>.
	shift string
	// pairLoad, pairClass and spread bring two consecutive blocks into the
	// low and high halves of Z4 in the VNNI m4 kernels: pairLoad into
	// register class pairClass, then the spread instruction (empty for 8
	// bits, loaded whole by VMOVDQU64).
	pairLoad, pairClass, spread string
	// idx is the name of the VNNI m4 permutation index table loaded into Z9
	// (empty where none is needed).
	idx string
	// table is the width whose shift table the kernels load (3 bits: the
	// 2-bit table of their low plane).
	table int
}

// u3 reports whether w is the 3-bit width: blocks of 12 bytes, the 8
// bytes of a 2-bit plane (codes c & 3, the 2-bit layout) then the 4 bytes
// of the high bits c >> 2 in the order hiBitTable tests them
// (runtime/kernels qdot8u3.go, SplitU3). A block is unpacked as the 2-bit
// codes, then 4 is added to every byte whose high bit is set: AVX-512,
// vptestmb of the broadcast high dword against hiBitTable into K2 and a
// byte-masked vpaddb of 4; AVX2, vpand and vpcmpeqb against the table, a
// vpand with the 4s and a vpor.
func (w width) u3() bool { return w.bits == 3 }

// blockBytes is the bytes of packed codes in a block of 32.
func (w width) blockBytes() int { return w.bits * 4 }

var widths = []width{
	{bits: 8, mask: "0x80"},
	{bits: 4, mask: "0x0f", load: "VBROADCASTI128", shift: "VPSRLVQ",
		pairLoad: "VMOVDQU", pairClass: "Y", spread: "VSHUFI64X2 $0x50, Z4, Z4, Z4"},
	{bits: 2, mask: "0x03", load: "VPBROADCASTQ", shift: "VPSRLVQ",
		pairLoad: "VMOVDQU", pairClass: "X", spread: "VPERMQ Z4, Z9, Z4", idx: "q8midx2"},
	{bits: 1, mask: "0x01", load: "VPBROADCASTD", shift: "VPSRLVD",
		pairLoad: "VMOVQ", pairClass: "X", spread: "VPERMD Z4, Z9, Z4", idx: "q8midx1"},
	{bits: 3, mask: "0x03", load: "VPBROADCASTQ", shift: "VPSRLVQ", table: 2},
}

// shifts is the width whose shift table w loads.
func (w width) shifts() int {
	if w.table != 0 {
		return w.table
	}
	return w.bits
}

// hiTables writes the 3-bit kernels' tables, reps times 32 bytes each:
// <prefix>hbit, byte j = 1 << (j%32/4), the bit of the high dword's byte
// j%4 that holds the high bit of the code at byte j of the unpacked
// block, and <prefix>four, bytes of 4.
func hiTables(a *asm, prefix string, reps int) {
	a.data(prefix+"hbit", 1, 32*reps, func(k int) int { return 1 << (k % 32 / 4) })
	a.data(prefix+"four", 1, 32*reps, func(int) int { return 4 })
}

// isa is the instruction set a kernel is written for.
type isa string

const (
	avx2 isa = "AVX2" // AVX2 + FMA: vpmaddubsw and vpmaddwd
	vnni isa = "VNNI" // AVX-512 VNNI with VL: vpdpbusd
)

// shiftTable writes the table of per-lane right shifts for a width
// (none for 8 bits), repeated reps times (1 for Y registers, 2 for Z).
func shiftTable(a *asm, prefix string, w width, reps int) {
	switch w.bits {
	case 4:
		a.data(prefix+"4", 8, 4*reps, func(k int) int { return []int{0, 0, 4, 4}[k%4] })
	case 2:
		a.data(prefix+"2", 8, 4*reps, func(k int) int { return 2 * (k % 4) })
	case 1:
		a.data(prefix+"1", 4, 8*reps, func(k int) int { return k % 8 })
	}
}

// unpack writes the instructions that bring the block at src offset so
// into Y4 as one code a byte (for 8 bits: the codes xored with 0x80), for
// the one-row kernels and the Y-register block loops. For 3 bits the
// AVX2 kernels use the Y register scratch and the tables <prefix>hbit and
// <prefix>four from memory; the VNNI kernels Y28 and the tables in Y30,
// Y31 (hiConsts).
func unpack(a *asm, w width, k isa, so int, scratch, prefix string) {
	unpackAt(a, w, k, func(d int) string { return off(d, "SI") }, so, scratch, prefix)
}

// unpackAt is unpack with the code bytes at src(so) instead of so(SI).
func unpackAt(a *asm, w width, k isa, src func(int) string, so int, scratch, prefix string) {
	if w.bits == 8 {
		a.op("VMOVDQU", src(so), "Y4")
		return
	}
	a.op(w.load, src(so), "Y4")
	if w.u3() {
		h := scratch
		if k == vnni {
			h = "Y28"
		}
		a.op("VPBROADCASTD", src(so+8), h)
		if k == vnni {
			a.op("VPTESTMB", "Y30", h, "K2")
		} else {
			a.op("VPAND", prefix+"hbit<>(SB)", h, h)
			a.op("VPCMPEQB", prefix+"hbit<>(SB)", h, h)
			a.op("VPAND", prefix+"four<>(SB)", h, h)
		}
	}
	a.op(w.shift, "Y14", "Y4", "Y4")
	a.op("VPAND", "Y15", "Y4", "Y4")
	if w.u3() {
		if k == vnni {
			a.op("VPADDB", "Y31", "Y4", "K2", "Y4")
		} else {
			a.op("VPOR", scratch, "Y4", "Y4")
		}
	}
}

// hiConsts loads the 3-bit VNNI kernels' tables <prefix>hbit and
// <prefix>four (64 bytes each) into Z30 and Z31.
func hiConsts(a *asm, prefix string) {
	a.op("VMOVDQU64", prefix+"hbit<>(SB)", "Z30")
	a.op("VMOVDQU64", prefix+"four<>(SB)", "Z31")
}
