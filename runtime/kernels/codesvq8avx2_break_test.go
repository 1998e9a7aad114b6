package kernels

import (
	"fmt"
	"math"
	"testing"
)

// TestBreakAccumQ8NonFinite: the CodeAccumQ8 doc says a NaN or infinite
// weight makes every output NaN. Checked on the Go path (n < 16, or
// hasQ8AVX2 off) and the AVX2 path, with the bad weight in a full block
// or in the n%16 tail, and for NaN/Inf in the fp16 scale.
func TestBreakAccumQ8NonFinite(t *testing.T) {
	defer func(v, a bool) { hasVBMI, hasQ8AVX2 = v, a }(hasVBMI, hasQ8AVX2)
	avx2 := hasQ8AVX2
	hasVBMI = false
	for _, path := range []bool{false, true} {
		if path && !avx2 {
			continue
		}
		hasQ8AVX2 = path
		for _, hd := range []int{64, 128} {
			rb := hd / 4
			for _, n := range []int{1, 3, 15, 16, 17, 31, 32, 47, 200} {
				for _, bad := range []int{0, n - 1, n / 2} {
					for _, kind := range []string{"pNaN", "p+Inf", "p-Inf", "sNaN", "sInf", "zNaN", "zInf"} {
						for _, z := range []float32{0, 1, 2} {
							codes, _ := codeRowsCase(uint64(n), 2, hd, n, rb)
							p := make([]float32, n)
							params := make([]uint16, 2*n)
							for j := range p {
								p[j] = float32(j%5) * 0.1
								params[2*j], params[2*j+1] = halfBits(F16, 0.5), halfBits(F16, z)
							}
							switch kind {
							case "pNaN":
								p[bad] = float32(math.NaN())
							case "p+Inf":
								p[bad] = float32(math.Inf(1))
							case "p-Inf":
								p[bad] = float32(math.Inf(-1))
							case "sNaN":
								params[2*bad] = 0x7e00
								p[bad] = 0.3
							case "sInf":
								params[2*bad] = 0x7c00
								p[bad] = 0.3
							case "zNaN":
								params[2*bad+1] = 0x7e00
							case "zInf":
								params[2*bad+1] = 0x7c00
							}
							acc, tmp := make([]float32, hd), make([]float32, hd)
							CodeAccumQ8(acc, p, params, codes, 2, rb, n, tmp)
							for c, a := range acc {
								if a == a && (kind[0] == 'p' || kind[0] == 's') {
									t.Errorf("avx2=%v hd%d n%d bad row %d %s z=%g: acc[%d] = %g, want NaN", path, hd, n, bad, kind, z, c, a)
									break
								}
								if kind[0] == 'z' && !(math.IsNaN(float64(a)) || math.IsInf(float64(a), 0)) {
									t.Errorf("avx2=%v hd%d n%d bad row %d %s z=%g: acc[%d] = %g, want non-finite", path, hd, n, bad, kind, z, c, a)
									break
								}
							}
						}
					}
				}
			}
		}
	}
}

// TestBreakAccumQ8Extremes: one huge weight and many tiny, zero blocks,
// fp16 subnormal scales, negative weights, n from 1 to 300 (the 8-block
// super loop), against float64 and the doc's bound.
func TestBreakAccumQ8Extremes(t *testing.T) {
	defer func(v, a bool) { hasVBMI, hasQ8AVX2 = v, a }(hasVBMI, hasQ8AVX2)
	avx2 := hasQ8AVX2
	hasVBMI = false
	r := newRand(99)
	for _, path := range []bool{false, true} {
		if path && !avx2 {
			continue
		}
		hasQ8AVX2 = path
		for _, hd := range []int{64, 128} {
			rb := hd / 4
			for _, n := range []int{1, 2, 5, 15, 16, 17, 33, 127, 128, 129, 143, 144, 145, 300} {
				for mode := 0; mode < 6; mode++ {
					name := fmt.Sprintf("avx2=%v/hd%d/n%d/mode%d", path, hd, n, mode)
					codes, vals := codeRowsCase(uint64(n*7+mode), 2, hd, n, rb)
					p := make([]float32, n)
					params := make([]uint16, 2*n)
					for j := range p {
						s := float32(0.01 + 0.1*r.Float64())
						z := float32(r.IntN(4))
						switch mode {
						case 0: // one huge, rest tiny
							p[j] = 1e-6 * float32(r.Float64())
							if j == n/2 {
								p[j] = 1
							}
						case 1: // fp16 subnormal scales
							s = float32(r.IntN(1023)+1) * 0x1p-24
							p[j] = float32(r.Float64())
						case 2: // zeros with some signed
							if j%3 == 0 {
								p[j] = float32(-r.Float64())
							}
						case 3: // huge scales
							s = 60000
							p[j] = float32(r.Float64()) * 1e20
						case 4: // tiny below 1e-30 in some blocks
							p[j] = 1e-32 * float32(r.Float64())
							if j/16%2 == 1 {
								p[j] = float32(r.Float64())
							}
						case 5: // exact ties: w/δ = k + 0.5
							s = 1
							p[j] = float32(r.IntN(255)-127) + 0.5
							if j%16 == 0 {
								p[j] = 127
							}
						}
						params[2*j], params[2*j+1] = halfBits(F16, s), halfBits(F16, z)
					}
					acc := randSlice(r, hd)
					base := append([]float32(nil), acc...)
					tmp := make([]float32, hd)
					CodeAccumQ8(acc, p, params, codes, 2, rb, n, tmp)
					for c := 0; c < hd; c++ {
						ref, mag, rnd := accumRef(float64(base[c]), p, params, vals, c, 16)
						// below 1e-30 a block's rounding error is up to its whole sum
						var tinyErr float64
						for b0 := 0; b0 < n; b0 += 16 {
							var m, l1 float64
							for j := b0; j < min(n, b0+16); j++ {
								w := math.Abs(float64(p[j]) * float64(F16.Widen(params[2*j])))
								m = math.Max(m, w)
								l1 += w * (3 + 3)
							}
							if m < 1e-30 {
								tinyErr += l1
							}
						}
						fp := 2*(float64(n+4)*0x1p-24*mag) + 0x1p-23*math.Abs(ref) + 1e-40
						if d := math.Abs(float64(acc[c]) - ref); !(d <= rnd+fp+tinyErr) {
							t.Fatalf("%s: acc[%d] = %g, float64 %g (|err| %g > %g + %g)", name, c, acc[c], ref, d, rnd, fp)
						}
					}
				}
			}
		}
	}
}

// TestBreakAccumQ8AVX2vsGo: the AVX2 kernel's blocks have the Go path's
// rounding (the same w8 and δ): with n a multiple of 16, the two paths
// must agree to float32 summation order.
func TestBreakAccumQ8AVX2vsGo(t *testing.T) {
	if !hasQ8AVX2 {
		t.Skip("no AVX2")
	}
	defer func(v, a bool) { hasVBMI, hasQ8AVX2 = v, a }(hasVBMI, hasQ8AVX2)
	hasVBMI = false
	r := newRand(5)
	for _, hd := range []int{64, 128} {
		rb := hd / 4
		for _, n := range []int{16, 32, 128, 144, 256, 272} {
			codes, _ := codeRowsCase(uint64(n), 2, hd, n, rb)
			p := make([]float32, n)
			params := make([]uint16, 2*n)
			for j := range p {
				p[j] = float32(r.Float64() * math.Exp(-6*r.Float64()))
				params[2*j], params[2*j+1] = halfBits(F16, float32(0.01+0.1*r.Float64())), halfBits(F16, float32(r.Float64()*4))
			}
			a1, a2, tmp := make([]float32, hd), make([]float32, hd), make([]float32, hd)
			hasQ8AVX2 = true
			CodeAccumQ8(a1, p, params, codes, 2, rb, n, tmp)
			hasQ8AVX2 = false
			CodeAccumQ8(a2, p, params, codes, 2, rb, n, tmp)
			hasQ8AVX2 = true
			var s float64
			for j := range p {
				s += math.Abs(float64(p[j])) * 8
			}
			for c := range a1 {
				if d := math.Abs(float64(a1[c] - a2[c])); d > float64(n)*0x1p-22*s {
					t.Fatalf("hd%d n%d: acc[%d] AVX2 %g, Go %g", hd, n, c, a1[c], a2[c])
				}
			}
		}
	}
}
