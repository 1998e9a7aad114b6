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
}

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
// the one-row kernels and the Y-register block loops.
func unpack(a *asm, w width, so int) {
	if w.bits == 8 {
		a.op("VMOVDQU", off(so, "SI"), "Y4")
		return
	}
	a.op(w.load, off(so, "SI"), "Y4")
	a.op(w.shift, "Y14", "Y4", "Y4")
	a.op("VPAND", "Y15", "Y4", "Y4")
}
