package kernels

import "fmt"

// useAsm selects the AVX2+FMA assembly kernels. It starts as hasAsm and is
// only changed by tests, which run every kernel on both paths.
var useAsm = hasAsm

// Impl names the kernel implementation this process uses: "avx2+fma" when
// the amd64 assembly is active, "generic" for the portable Go code (other
// architectures, CPUs without AVX2/FMA, or builds with the purego tag).
func Impl() string {
	if useAsm {
		return "avx2+fma"
	}
	return "generic"
}

func panicf(format string, args ...any) {
	panic(fmt.Sprintf("kernels: "+format, args...))
}

// Dot returns Σ a[i]·b[i] over float32 vectors of equal length. The sum is
// accumulated in float32 (32 partial sums on the AVX2 path, 4 on the
// portable path) and then added pairwise, so the result differs from a
// sequential sum by rounding. It panics if len(a) != len(b).
func Dot(a, b []float32) float32 {
	if len(a) != len(b) {
		panicf("Dot: len(a)=%d != len(b)=%d", len(a), len(b))
	}
	if useAsm {
		return dotAsm(a, b)
	}
	return dotGo(a, b)
}

func dotAsm(a, b []float32) float32 {
	n := len(a)
	n8 := n &^ 7
	var s float32
	if n8 > 0 {
		s = dotAVX2(&a[0], &b[0], n8)
	}
	if n8 < n {
		s += dotGo(a[n8:], b[n8:n])
	}
	return s
}

// Axpy computes y[i] += alpha·x[i] for float32 vectors of equal length. It
// panics if len(x) != len(y).
func Axpy(alpha float32, x, y []float32) {
	if len(x) != len(y) {
		panicf("Axpy: len(x)=%d != len(y)=%d", len(x), len(y))
	}
	n8 := len(x) &^ 7
	if useAsm && n8 > 0 {
		axpyAVX2(alpha, &x[0], &y[0], n8)
		axpyGo(alpha, x[n8:], y[n8:])
		return
	}
	axpyGo(alpha, x, y)
}

// Scale computes x[i] *= alpha in place.
func Scale(alpha float32, x []float32) {
	n8 := len(x) &^ 7
	if useAsm && n8 > 0 {
		scaleAVX2(alpha, &x[0], n8)
		scaleGo(alpha, x[n8:])
		return
	}
	scaleGo(alpha, x)
}

// Exp computes x[i] = e^x[i] in place. The maximum relative error against
// math.Exp is below 1e-6 for results in the normal float32 range (TestExp
// checks it; see exp.go for the method). Inputs above 88.8 give +Inf,
// below -104 give 0, NaN gives NaN; results below 2^-126 are subnormal and
// carry only their remaining precision.
func Exp(x []float32) {
	n8 := len(x) &^ 7
	if useAsm && n8 > 0 {
		expAVX2(&x[0], n8)
		expSliceGo(x[n8:])
		return
	}
	expSliceGo(x)
}

// RMSNorm writes out[i] = x[i] / sqrt(mean(x²) + eps) · weight[i] for
// float32 vectors of one length d (Zhang & Sennrich 2019, "Root Mean Square
// Layer Normalization", as used by Llama). out may be x itself. The sum of
// squares is accumulated in float32 vector lanes (32 partial sums) on the
// AVX2 path and in float64 on the portable path; the final 1/sqrt is taken
// in float64. It panics if the three lengths differ.
func RMSNorm(out, x, weight []float32, eps float32) {
	if len(out) != len(x) || len(weight) != len(x) {
		panicf("RMSNorm: len(out)=%d, len(x)=%d, len(weight)=%d must be equal", len(out), len(x), len(weight))
	}
	n := len(x)
	if n == 0 {
		return
	}
	n8 := n &^ 7
	if useAsm && n8 > 0 {
		ss := float64(dotAsm(x, x))
		s := rsqrtMean(ss, n, eps)
		scaleMulAVX2(&out[0], &x[0], &weight[0], n8, s)
		scaleMulGo(out[n8:], x[n8:], weight[n8:], s)
		return
	}
	scaleMulGo(out, x, weight, rsqrtMean(sumSquaresGo(x), n, eps))
}

// SiLUMul computes gate[i] = silu(gate[i]) · up[i] in place, where
// silu(g) = g / (1 + e^-g) (the SwiGLU feed-forward of Llama; Shazeer 2020,
// "GLU Variants Improve Transformer"). gate and up are float32 vectors of
// equal length [ffn]; it panics if they differ.
func SiLUMul(gate, up []float32) {
	if len(gate) != len(up) {
		panicf("SiLUMul: len(gate)=%d != len(up)=%d", len(gate), len(up))
	}
	n8 := len(gate) &^ 7
	if useAsm && n8 > 0 {
		siluMulAVX2(&gate[0], &up[0], n8)
		siluMulGo(gate[n8:], up[n8:])
		return
	}
	siluMulGo(gate, up)
}
