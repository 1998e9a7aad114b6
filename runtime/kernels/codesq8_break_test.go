package kernels

import (
	"math"
	"testing"

	"github.com/lmpack/lmpack/quantize/kvq"
)

// q8BreakShapes are (bits, hd) beyond q8Shapes: head_dims 256–1024 (the
// heap buffer of codeQ8Round past 512 values, int32 sums past 2²⁴) and
// odd unit counts.
var q8BreakShapes = [][2]int{{2, 256}, {2, 320}, {2, 512}, {2, 1024}, {4, 160}, {4, 256}, {4, 512}, {4, 1024}, {8, 32}, {8, 48}, {8, 96}, {8, 256}, {8, 512}, {8, 1024}}

// TestBreakCodeDotsQ8Shapes runs TestCodeDotsQ8 and TestCodeDotsQ8F16
// (float64 references, the rounding bound, bits of the four-row kernel)
// over q8BreakShapes.
func TestBreakCodeDotsQ8Shapes(t *testing.T) {
	defer func(s [][2]int) { q8Shapes = s }(q8Shapes)
	q8Shapes = q8BreakShapes
	t.Run("CodeDotsQ8", TestCodeDotsQ8)
	t.Run("CodeDotsQ8F16", TestCodeDotsQ8F16)
}

// TestBreakCodeQ8QueryNaN checks that a query with a NaN element does
// not round to a finite scale (the float kernels give NaN scores for it;
// before fcbe969 math.Max carried the NaN into δ).
func TestBreakCodeQ8QueryNaN(t *testing.T) {
	q, _ := q8Case(1, 64, 1, 8)
	q[3] = float32(math.NaN())
	qb := make([]byte, CodeQ8Len(64))
	scale, sum := CodeQ8Query(qb, q, 8)
	if !math.IsNaN(float64(scale)) && !math.IsNaN(float64(sum)) {
		t.Errorf("NaN query: scale %g, sum %g, q8[3] %d: finite, so every score is finite", scale, sum, q8At(qb, 3, 1, 4))
	}
}

// TestBreakCodeQ8QueryTies checks codeQ8Round's claim of rounding x/δ half
// to even at exact ties: with max|q| = 381 (δ = 3), 4.5/δ = 1.5 rounds to
// 2 and 31.5/δ = 10.5 to 10 (math.RoundToEven(x/δ), as before fcbe969).
// The multiplication by 127/381 (not exact in float64) moves exact ties
// to one side; either result is within δ/2, so the score bound holds.
func TestBreakCodeQ8QueryTies(t *testing.T) {
	q := make([]float32, 16)
	q[0], q[1], q[2], q[3], q[4] = 381, 4.5, -4.5, 31.5, 7.5
	qb := make([]byte, CodeQ8Len(16))
	scale, _ := CodeQ8Query(qb, q, 8)
	d := float64(381) / 127
	for c, x := range q {
		want := int32(math.RoundToEven(float64(x) / d))
		if got := q8At(qb, c, 1, 1); got != want {
			t.Errorf("q[%d] = %g, δ %g: q8 %d, round half to even of %g is %d", c, x, scale, got, float64(x)/d, want)
		}
	}
}

// TestBreakCodeQ8QueryTieSweep counts exact ties (max|q| = 127·m, q_c =
// ±(k+½)·m, so q_c/δ = ±(k+½)) that codeQ8Round does not round half to
// even, over m < 2000 and k < 127.
func TestBreakCodeQ8QueryTieSweep(t *testing.T) {
	q := make([]float32, 256)
	qb := make([]byte, CodeQ8Len(256))
	bad, all := 0, 0
	for m := 1; m < 2000; m++ {
		q[0] = float32(127 * m)
		for k := 0; k < 127; k++ {
			q[1+k] = float32((float64(k) + 0.5) * float64(m))
			q[128+k] = -q[1+k]
		}
		CodeQ8Query(qb, q, 8)
		for k := 0; k < 127; k++ {
			want := int32(math.RoundToEven(float64(k) + 0.5))
			all += 2
			if q8At(qb, 1+k, 1, 16) != want {
				bad++
			}
			if q8At(qb, 128+k, 1, 16) != -want {
				bad++
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d exact ties not rounded half to even", bad, all)
	}
}

// TestBreakCodeAccumQ8NaN checks that a NaN weight reaches the output of
// CodeAccumQ8 as NaN on each path, as it does in CodeAccumF16 (the Go
// path's builtin max carries it into δ_B).
func TestBreakCodeAccumQ8NaN(t *testing.T) {
	const hd, n = 64, 32
	codes, _ := codeRowsCase(5, 2, hd, n, 16)
	params := make([]uint16, 2*n)
	for j := 0; j < n; j++ {
		params[2*j], params[2*j+1] = kvq.F16FromFloat32(0.05), kvq.F16FromFloat32(1.5)
	}
	vbmiOK, avx2OK := hasVBMI, hasQ8AVX2
	for _, path := range []string{"go", "avx2", "vbmi"} {
		if path == "vbmi" && !vbmiOK || path == "avx2" && !avx2OK {
			continue
		}
		for _, at := range []int{0, 7, 31} {
			p := make([]float32, n)
			for j := range p {
				p[j] = float32(j+1) / n
			}
			p[at] = float32(math.NaN())
			acc := make([]float32, hd)
			func() {
				defer func(v, a bool) { hasVBMI, hasQ8AVX2 = v, a }(hasVBMI, hasQ8AVX2)
				hasVBMI, hasQ8AVX2 = path == "vbmi", path == "avx2"
				CodeAccumQ8(acc, p, params, codes, 2, 16, n, make([]float32, hd))
			}()
			for c, v := range acc {
				if !math.IsNaN(float64(v)) {
					t.Errorf("%s path, NaN weight at %d: acc[%d] = %g, want NaN", path, at, c, v)
					break
				}
			}
		}
	}
}
