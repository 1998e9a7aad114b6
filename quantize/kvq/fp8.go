package kvq

import "math"

// OCP FP8 E4M3 ("E4M3FN", the float8_e4m3fn of PyTorch and vLLM's fp8 KV
// cache): 1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits, no
// infinities, NaN only as S.1111.111. Normals are (1 + m/8)·2^(e−7) for
// exponent field e in 1..15 (m ≤ 6 when e = 15), subnormals m/8·2^-6; the
// largest finite value is 448, the smallest positive one 2^-9.

// E4M3Max is the largest finite FP8 E4M3 value.
const E4M3Max = 448

// e4m3Pos holds the 127 non-negative finite E4M3 values in code order
// (code c ∈ [0, 126] has value e4m3Pos[c]); codes are monotonic in value.
var e4m3Pos = func() (t [127]float32) {
	for c := range t {
		e, m := c>>3, c&7
		if e == 0 {
			t[c] = float32(m) / 8 / 64
		} else {
			t[c] = float32(math.Ldexp(1+float64(m)/8, e-7))
		}
	}
	return t
}()

// e4m3All maps every E4M3 byte to its float32 value.
var e4m3All = func() (t [256]float32) {
	for b := range t {
		c := b & 0x7f
		switch {
		case c == 0x7f:
			t[b] = float32(math.NaN())
		case b&0x80 != 0:
			t[b] = -e4m3Pos[c]
		default:
			t[b] = e4m3Pos[c]
		}
	}
	return t
}()

// F8E4M3ToFloat32 returns the float32 value of an FP8 E4M3 byte (exact;
// 0x7f and 0xff are NaN).
func F8E4M3ToFloat32(b uint8) float32 { return e4m3All[b] }

// F8E4M3FromFloat32 converts f to FP8 E4M3, rounding to nearest with ties
// to even and saturating: |f| beyond 448 (±Inf included) becomes ±448, as
// CUDA's __nv_cvt_float_to_fp8(…, __NV_SATFINITE, __NV_E4M3) and Triton's
// float8e4nv cast on Hopper do; NaN becomes 0x7f.
func F8E4M3FromFloat32(f float32) uint8 {
	if f != f {
		return 0x7f
	}
	var sign uint8
	a := f
	if math.Signbit(float64(f)) {
		sign, a = 0x80, -f
	}
	if a >= E4M3Max {
		return sign | 126
	}
	x := float64(a)
	if x < 1.0/64 {
		// Subnormals m/8·2^-6 (m = 8 is the smallest normal, code 8).
		return sign | uint8(math.RoundToEven(x*512))
	}
	// x = m·2^(e−3) with m ∈ [8, 16); code (e+6)·8 + round(m), where
	// round(m) = 16 carries into the next exponent.
	_, exp := math.Frexp(x)
	e := exp - 1
	m := math.RoundToEven(math.Ldexp(x, 3-e))
	return sign | uint8((e+6)*8+int(m))
}
