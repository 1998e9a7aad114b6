package kernels

import "math"

// Softmax replaces x with softmax(x) = e^(x[i]−max x) / Σ_j e^(x[j]−max x)
// in place; subtracting the maximum keeps every exponent ≤ 0 so nothing
// overflows. It is SoftmaxScaled(1, x): see there for the paths, the
// rounding and NaN.
func Softmax(x []float32) { SoftmaxScaled(1, x) }

// SoftmaxScaled replaces the float32 vector x with softmax(alpha·x) in
// place: p_i = e^(alpha·x_i − m) / Σ_j e^(alpha·x_j − m) with m =
// alpha·max_j x_j rounded to float32 (for alpha > 0 that is the largest
// scaled element, so every exponent is at most half an ulp of m above 0
// and nothing overflows). This is attention's softmax(q·kᵀ/√head_dim) over
// raw dot products, with alpha = 1/√head_dim, in three passes over x (max;
// exp and sum; normalise) instead of the four of Scale then Softmax. Each
// exponent alpha·x_i − m is rounded once (an FMA), which is more accurate
// than rounding alpha·x_i first.
//
// The exponential is exp.go's; the normalising sum is accumulated in
// float32 (vector lanes, then a tree). Paths: AVX-512 F on any n, its tail
// under a lane mask (softmax_amd64.s: 16-lane EXP with VSCALEFPS, outputs
// bit-identical to the AVX2 EXP's); AVX2+FMA on n rounded down to 8 with
// the Go loop for the rest; portable Go. All match the float64 softmax of
// alpha·x within 1e-5 relative (TestSoftmaxScaled).
//
// An empty x is left alone. alpha ≤ 0, +Inf or NaN is computed as
// Scale(alpha, x) then the alpha = 1 softmax. If every element is −Inf, or
// any is NaN or +Inf, the result is NaN everywhere: exp spreads NaN into
// the sum, and the final scaling by 1/sum spreads it to every element.
func SoftmaxScaled(alpha float32, x []float32) {
	n := len(x)
	if n == 0 {
		return
	}
	if !(alpha > 0) || alpha > math.MaxFloat32 {
		Scale(alpha, x)
		alpha = 1
	}
	if useAsm && hasSoftmax512 {
		m := alpha * max512(&x[0], n)
		s := expScaleSubSum512(&x[0], n, alpha, m)
		scale512(1/s, &x[0], n)
		return
	}
	n8 := n &^ 7
	if useAsm && n8 > 0 {
		mx := maxAVX2(&x[0], n8)
		if n8 < n {
			mx = max(mx, maxGo(x[n8:]))
		}
		m := alpha * mx
		s := expScaleSubSumAVX2(&x[0], n8, alpha, m) + expScaleSubSumGo(x[n8:], alpha, m)
		scaleAVX2(1/s, &x[0], n8)
		scaleGo(1/s, x[n8:])
		return
	}
	m := alpha * maxGo(x)
	s := expScaleSubSumGo(x, alpha, m)
	scaleGo(1/s, x)
}
