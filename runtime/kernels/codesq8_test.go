package kernels

import (
	"fmt"
	"math"
	"testing"

	"github.com/lmpack/lmpack/quantize/kvq"
)

// q8Paths runs f with the assembly kernels off (portable Go), with the
// AVX2 ones (VNNI off) and with the VNNI ones, each where the CPU has it.
func q8Paths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	defer func(v, a bool) { hasVNNI512, hasQ8AVX2 = v, a }(hasVNNI512, hasQ8AVX2)
	vnni, avx2 := hasVNNI512, hasQ8AVX2
	t.Run("go", func(t *testing.T) { hasVNNI512, hasQ8AVX2 = false, false; f(t) })
	if avx2 {
		t.Run("avx2", func(t *testing.T) { hasVNNI512, hasQ8AVX2 = false, true; f(t) })
	} else {
		t.Log("no AVX2, FMA and F16C in this build or CPU; the AVX2 path did not run")
	}
	if !vnni {
		t.Log("no AVX-512 VNNI in this build or CPU; the VNNI path did not run")
		return
	}
	t.Run("vnni", func(t *testing.T) { hasVNNI512, hasQ8AVX2 = true, avx2; f(t) })
}

// q8Shapes are the (bits, hd) CodeDotsQ8 takes (rows of whole 16-byte
// units), rb paddings included by the test.
var q8Shapes = [][2]int{{2, 64}, {2, 128}, {2, 192}, {4, 32}, {4, 64}, {4, 96}, {4, 128}, {8, 16}, {8, 64}, {8, 80}, {8, 128}}

// q8Case returns a query ([hd], N(0,1)-ish with one outlier), random
// scales in [0.01, 0.1) and zeros in [0, 2^bits), [n, 2].
func q8Case(seed uint64, hd, n, bits int) ([]float32, []float32) {
	r := newRand(seed)
	q := randSlice(r, hd)
	q[r.IntN(hd)] = 3
	sz := make([]float32, 2*n)
	for j := 0; j < n; j++ {
		sz[2*j] = float32(0.01 + 0.09*r.Float64())
		sz[2*j+1] = float32(r.Float64() * float64(int(1)<<bits))
	}
	return q, sz
}

// TestCodeDotsQ8 checks CodeDotsQ8 (Go and VNNI paths) against float64
// dequantise-then-dot references over odd row counts (1, 3, 7, 13, 65:
// not multiples of the 4-row kernel) and padded strides:
//
//   - against the rounded query q̃ (δ·q8 recovered from CodeQ8Query's
//     layout): the int32 sums are exact, so only the float32 arithmetic
//     on them differs: |err| ≤ 4·2⁻²⁴·(|s·δ·t| + |s·z·Σq̃|) + 1e-30;
//   - against the float query q, the rounding bound of codesq8.go:
//     |err| ≤ (max|q|/254)·‖x̂_j‖₁ plus the float32 term above; the test
//     also checks the bound is not vacuous (the worst row uses > 1% of it).
func TestCodeDotsQ8(t *testing.T) {
	q8Paths(t, func(t *testing.T) {
		for _, sh := range q8Shapes {
			bits, hd := sh[0], sh[1]
			R := hd * bits / 8
			for _, n := range []int{1, 3, 7, 13, 65} {
				for _, pad := range []int{0, 5} {
					name := fmt.Sprintf("b%d/hd%d/n%d/pad%d", bits, hd, n, pad)
					rb := R + pad
					codes, vals := codeRowsCase(uint64(100*bits+hd+7*n+pad), bits, hd, n, rb)
					q, sz := q8Case(uint64(hd+n+pad), hd, n, bits)
					qb := make([]byte, CodeQ8Len(hd))
					scale, sum := CodeQ8Query(qb, q, bits)
					P, u := 8/bits, hd*bits/128
					var amax, qsum float64
					qt := make([]float64, hd)
					for c := range q {
						amax = math.Max(amax, math.Abs(float64(q[c])))
						qt[c] = float64(scale) * float64(q8At(qb, c, P, u))
						qsum += qt[c]
						if d := math.Abs(qt[c] - float64(q[c])); d > float64(scale)/2*(1+1e-6) {
							t.Fatalf("%s: q̃[%d] = %g, q %g: off by more than δ/2 = %g", name, c, qt[c], q[c], scale/2)
						}
					}
					if math.Abs(qsum-float64(sum)) > 1e-6*math.Abs(qsum)+1e-6 {
						t.Fatalf("%s: Σq̃ = %g, CodeQ8Query %g", name, qsum, sum)
					}
					out := make([]float32, n+1)
					out[n] = 42
					CodeDotsQ8(out, qb, scale, sum, codes, bits, rb, n, sz)
					if out[n] != 42 {
						t.Fatalf("%s: wrote past n rows", name)
					}
					worst := 0.0
					for j := 0; j < n; j++ {
						s, z := float64(sz[2*j]), float64(sz[2*j+1])
						var refT, ref, l1, it float64
						for c, v := range vals[j] {
							x := s * (float64(v) - z)
							refT += qt[c] * x
							ref += float64(q[c]) * x
							l1 += math.Abs(x)
							it += float64(q8At(qb, c, P, u)) * float64(v)
						}
						fp := 4*0x1p-24*(math.Abs(s*float64(scale)*it)+math.Abs(s*z*float64(sum))) + 1e-30
						if d := math.Abs(float64(out[j]) - refT); d > fp {
							t.Fatalf("%s row %d: %g, q̃ reference %g (|err| %g > %g)", name, j, out[j], refT, d, fp)
						}
						bound := amax/254*l1 + fp
						d := math.Abs(float64(out[j]) - ref)
						if d > bound {
							t.Fatalf("%s row %d: %g, q reference %g (|err| %g > bound %g)", name, j, out[j], ref, d, bound)
						}
						worst = math.Max(worst, d/bound)
					}
					if n >= 13 && worst < 0.01 {
						t.Errorf("%s: worst error %.2g of the bound: the bound is vacuous here", name, worst)
					}
				}
			}
		}
	})
}

// TestCodeQ8QueryZero checks a zero query scores 0 (scale 0, no NaN).
func TestCodeQ8QueryZero(t *testing.T) {
	qb := make([]byte, CodeQ8Len(64))
	for i := range qb {
		qb[i] = 0x55
	}
	scale, sum := CodeQ8Query(qb, make([]float32, 64), 4)
	if scale != 0 || sum != 0 {
		t.Fatalf("zero query: scale %g, sum %g", scale, sum)
	}
	codes, _ := codeRowsCase(1, 4, 64, 5, 32)
	out := make([]float32, 5)
	CodeDotsQ8(out, qb, scale, sum, codes, 4, 32, 5, []float32{1, 2, 1, 2, 1, 2, 1, 2, 1, 2})
	for j, v := range out {
		if v != 0 {
			t.Fatalf("row %d: %g, want 0", j, v)
		}
	}
}

// TestCodeDotsQ8F16 checks the fp16-parameter kernels against
// CodeDotsQ8 (TestCodeDotsQ8: float64 references and the rounding bound)
// with sz the exactly widened params, bit for bit on each path, over odd
// row counts and padded strides: CodeDotsQ8F16 for one query, and
// CodeDotsQ8F16x4 for four (CodeQ8Query4 must give each row the int8
// values CodeQ8Query gives it, and each row's scores the one-query bits).
func TestCodeDotsQ8F16(t *testing.T) {
	q8Paths(t, func(t *testing.T) {
		for _, sh := range q8Shapes {
			bits, hd := sh[0], sh[1]
			R := hd * bits / 8
			for _, n := range []int{1, 3, 4, 7, 13, 65} {
				for _, pad := range []int{0, 5} {
					name := fmt.Sprintf("b%d/hd%d/n%d/pad%d", bits, hd, n, pad)
					rb := R + pad
					codes, _ := codeRowsCase(uint64(300*bits+hd+7*n+pad), bits, hd, n, rb)
					params := make([]uint16, 2*n)
					sz := make([]float32, 2*n)
					var q4 []float32
					for r := 0; r < 4; r++ {
						q, szr := q8Case(uint64(10*r+hd+n+pad), hd, n, bits)
						for c := range q {
							q[c] *= float32(1 + 0.37*float64(r)) // distinct scales per row
						}
						q4 = append(q4, q...)
						if r == 0 {
							for i, v := range szr {
								params[i] = kvq.F16FromFloat32(v)
								sz[i] = kvq.F16ToFloat32(params[i])
							}
						}
					}
					ldo := n + 3
					out4 := make([]float32, 4*ldo)
					for i := range out4 {
						out4[i] = 42
					}
					qb4 := make([]byte, 4*CodeQ8Len(hd))
					coef := make([]float32, 8)
					CodeQ8Query4(qb4, q4, bits, coef)
					CodeDotsQ8F16x4(out4, ldo, qb4, coef, codes, bits, rb, n, params)
					for r := 0; r < 4; r++ {
						qb := make([]byte, CodeQ8Len(hd))
						scale, sum := CodeQ8Query(qb, q4[r*hd:(r+1)*hd], bits)
						if scale != coef[2*r] || sum != coef[2*r+1] {
							t.Fatalf("%s row %d: CodeQ8Query4 scale, sum %g %g; CodeQ8Query %g %g", name, r, coef[2*r], coef[2*r+1], scale, sum)
						}
						P, u := 8/bits, hd*bits/128
						for c := 0; c < hd; c++ {
							if a, b := q8AtN(qb4, c, P, u, 4, r), q8At(qb, c, P, u); a != b {
								t.Fatalf("%s row %d: q8[%d] %d in the four-row layout, %d alone", name, r, c, a, b)
							}
						}
						want := make([]float32, n)
						CodeDotsQ8(want, qb, scale, sum, codes, bits, rb, n, sz)
						got := make([]float32, n+1)
						got[n] = 42
						CodeDotsQ8F16(got, qb, scale, sum, codes, bits, rb, n, params)
						if got[n] != 42 {
							t.Fatalf("%s: CodeDotsQ8F16 wrote past n rows", name)
						}
						for j := 0; j < n; j++ {
							if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
								t.Fatalf("%s row %d score %d: CodeDotsQ8F16 %g, CodeDotsQ8 %g", name, r, j, got[j], want[j])
							}
							if math.Float32bits(out4[r*ldo+j]) != math.Float32bits(want[j]) {
								t.Fatalf("%s row %d score %d: CodeDotsQ8F16x4 %g, CodeDotsQ8 %g", name, r, j, out4[r*ldo+j], want[j])
							}
						}
						for j := n; j < ldo; j++ {
							if out4[r*ldo+j] != 42 {
								t.Fatalf("%s row %d: CodeDotsQ8F16x4 wrote past n at %d", name, r, j)
							}
						}
					}
				}
			}
		}
	})
}

// BenchmarkCodeQ8Query measures rounding one head_dim-64 query row for
// 2- and 8-bit codes (once per head and decode step; at short contexts
// it is a visible part of scoring): ns per row.
func BenchmarkCodeQ8Query(b *testing.B) {
	for _, bits := range []int{2, 8} {
		b.Run(fmt.Sprintf("b%d", bits), func(b *testing.B) {
			q, _ := q8Case(1, 64, 1, bits)
			qb := make([]byte, CodeQ8Len(64))
			for i := 0; i < b.N; i++ {
				CodeQ8Query(qb, q, bits)
			}
		})
	}
}
