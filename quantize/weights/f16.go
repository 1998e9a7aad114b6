package weights

import "math"

// fp16 helpers: IEEE 754 binary16 bit patterns stored in uint16.

// f16FromFloat rounds x to the nearest binary16 value (ties to even) and
// returns its bits. Values at or beyond 65520 in magnitude become ±Inf.
func f16FromFloat(x float64) uint16 {
	var sign uint16
	if math.Signbit(x) {
		sign = 0x8000
		x = -x
	}
	switch {
	case math.IsNaN(x):
		return 0x7e00
	case x == 0:
		return sign
	case x >= 65520:
		return sign | 0x7c00
	case x < 0x1p-14: // subnormal range: multiples of 2^-24
		// 1024·2^-24 = 2^-14 is the smallest normal, whose bits are 0x0400,
		// so a round-up to it is still correct.
		return sign | uint16(math.RoundToEven(x*0x1p24))
	}
	frac, exp := math.Frexp(x) // x = frac·2^exp, frac ∈ [0.5, 1)
	e := exp - 1
	mant := math.RoundToEven((frac*2 - 1) * 1024)
	if mant == 1024 {
		mant = 0
		e++
	}
	if e > 15 {
		return sign | 0x7c00
	}
	return sign | uint16(e+15)<<10 | uint16(mant)
}

// f16ToFloat returns the value of binary16 bits h.
func f16ToFloat(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	exp := int(h>>10) & 0x1f
	mant := float64(h & 0x3ff)
	switch exp {
	case 0:
		return sign * mant * 0x1p-24
	case 31:
		if mant != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	}
	return sign * (1 + mant/1024) * math.Ldexp(1, exp-15)
}

// f16RoundUp returns the bits of the smallest binary16 value ≥ x, for
// finite x > 0. The result may be +Inf (0x7c00) when x > 65504.
func f16RoundUp(x float64) uint16 {
	h := f16FromFloat(x)
	for h < 0x7c00 && f16ToFloat(h) < x {
		h++ // positive binary16 bit patterns are ordered like their values
	}
	return h
}
