package kvq

import (
	"math"
	"sync"
)

// F16FromFloat32 converts f to IEEE 754 binary16 bits, rounding to nearest
// with ties to even. Values beyond ±65504 become ±Inf, values below the
// smallest subnormal (2^-24) round to ±0, NaN stays NaN (quiet).
func F16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b >> 23 & 0xff)
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Subnormal half: m·2^-24 with m = 1.mant·2^(exp-127+24).
		if e < -10 {
			return sign
		}
		full := mant | 0x800000
		shift := uint(14 - e)
		m := full >> shift
		rem := full & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && m&1 == 1) {
			m++
		}
		return sign | uint16(m)
	}
	h := uint32(e)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
		h++ // a carry into the exponent is correct, up to Inf
	}
	return sign | uint16(h)
}

// F16ToFloat32 converts IEEE 754 binary16 bits to float32 (exact: every
// half is a float32).
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case 0:
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			return -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
}

// RoundF16 returns f rounded to the nearest binary16 value, as float32.
func RoundF16(f float32) float32 { return F16ToFloat32(F16FromFloat32(f)) }

// EncodeF16 converts src to binary16 bits in dst (len(dst) ≥ len(src)),
// like F16FromFloat32 element by element, with an inlined path for values
// whose magnitude is a normal half (2^-14 ≤ |x| < 65520).
func EncodeF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		b := math.Float32bits(f)
		a := b & 0x7fffffff
		if a-0x38800000 < 0x477ff000-0x38800000 {
			// Rebias the exponent (127 → 15) and round to nearest even.
			dst[i] = uint16(b>>16)&0x8000 | uint16((a-0x38000000+0xfff+(a>>13&1))>>13)
			continue
		}
		dst[i] = F16FromFloat32(f)
	}
}

// f16Table maps every binary16 bit pattern to its float32 value (256 KiB,
// built on first use by DecodeF16).
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = F16ToFloat32(uint16(i))
	}
	return &t
})

// DecodeF16 converts binary16 bits in src to float32 in dst
// (len(dst) ≥ len(src)), exactly like F16ToFloat32, through a 65536-entry
// table.
func DecodeF16(dst []float32, src []uint16) {
	t := f16Table()
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = t[h]
	}
}
