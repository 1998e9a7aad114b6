package kernels

import "math"

// The exponential used by Exp, Softmax and SiLUMul.
//
// Both paths follow the same textbook scheme (Cody and Waite range
// reduction, e.g. J.-M. Muller, "Elementary Functions", ch. 6):
//
//	x is clamped to [-104, 88.8] (exp is 0 below and +Inf above in float32);
//	n = round(x·log2 e), r = x − n·ln2 with ln2 = ln2hi + ln2lo, |r| ≤ ln2/2;
//	e^r ≈ Σ_{i≤7} r^i/i! (truncation error < 6e-9 relative on |r| ≤ ln2/2);
//	exp(x) = e^r · 2^n.
//
// The AVX2 path evaluates this in float32 with FMA and applies 2^n as two
// factors 2^(n>>1)·2^(n−(n>>1)) so both are normal floats; its error is a
// few float32 ulps (max relative error measured by TestExp, bound 1e-6).
// The portable path evaluates the same polynomial in float64 and rounds
// once, so it is within half an ulp plus the truncation error.
const (
	expClampHi = 88.8
	expClampLo = -104
)

// expGo returns exp(x) rounded to float32; NaN gives NaN.
func expGo(x float32) float32 {
	if !(x < expClampHi) { // also catches NaN
		if x != x {
			return x
		}
		return float32(math.Inf(1))
	}
	if x < expClampLo {
		return 0
	}
	xd := float64(x)
	n := math.RoundToEven(xd * math.Log2E)
	r := xd - n*math.Ln2
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720+r*(1.0/5040)))))))
	// n is in [-150, 129]: 2^n is a normal float64.
	return float32(p * math.Float64frombits(uint64(int64(n)+1023)<<52))
}
