package kvq

import "fmt"

// checkBits panics unless bits is 2, 4 or 8 (a kernel precondition: the
// cache or caller picked the width).
func checkBits(fn string, bits int) {
	if bits != 2 && bits != 4 && bits != 8 {
		panic(fmt.Sprintf("kvq: %s: bits=%d, want 2, 4 or 8", fn, bits))
	}
}

// PackedLen returns the bytes that n codes of the given width take when
// packed: ⌈n·bits/8⌉. bits is 2, 4 or 8; it panics otherwise.
func PackedLen(n, bits int) int {
	checkBits("PackedLen", bits)
	return (n*bits + 7) / 8
}

// Pack packs codes (each < 2^bits, higher bits ignored) into dst, LSB
// first: code i goes to byte i·bits/8 at bit (i·bits) mod 8. dst must hold
// PackedLen(len(codes), bits) bytes; unused high bits of the last byte are
// zeroed. It panics on a bad width or a short dst.
func Pack(dst []byte, codes []uint8, bits int) {
	checkBits("Pack", bits)
	need := PackedLen(len(codes), bits)
	if len(dst) < need {
		panic(fmt.Sprintf("kvq: Pack: dst has %d bytes, want %d", len(dst), need))
	}
	clear(dst[:need])
	per := 8 / bits
	mask := uint8(1)<<bits - 1
	for i, c := range codes {
		dst[i/per] |= (c & mask) << ((i % per) * bits)
	}
}

// Unpack is the inverse of Pack: it reads len(dst) codes of the given
// width from src (PackedLen(len(dst), bits) bytes, LSB first). It panics
// on a bad width or a short src.
func Unpack(dst []uint8, src []byte, bits int) {
	checkBits("Unpack", bits)
	need := PackedLen(len(dst), bits)
	if len(src) < need {
		panic(fmt.Sprintf("kvq: Unpack: src has %d bytes, want %d", len(src), need))
	}
	per := 8 / bits
	mask := uint8(1)<<bits - 1
	for i := range dst {
		dst[i] = src[i/per] >> ((i % per) * bits) & mask
	}
}
