package kernels

import (
	"fmt"
	"math"
	"testing"
)

// accumRef is the float64 value sum base + Σ_j w_j·(vals[j][c] − z_j),
// w_j = p_j·s_j with the fp16 scales and zeros of params widened exactly,
// over the rows of p; mag is Σ_j |w_j|·(|code| + |z_j|) (the float32
// bounds' scale) and rnd the int8 weight rounding's bound for blocks of
// block rows, Σ_B (max_{j∈B}|w_j|/254)·Σ_{j∈B} |code_jc − z_j|·(1+1e-5).
func accumRef(base float64, p []float32, params []uint16, vals [][]int, c, block int) (ref, mag, rnd float64) {
	ref = base
	for b0 := 0; b0 < len(p); b0 += block {
		var m, l1 float64
		for j := b0; j < min(len(p), b0+block); j++ {
			w := float64(p[j]) * float64(F16.Widen(params[2*j]))
			z := float64(F16.Widen(params[2*j+1]))
			ref += w * (float64(vals[j][c]) - z)
			mag += math.Abs(w) * (float64(vals[j][c]) + math.Abs(z))
			m = math.Max(m, math.Abs(w))
			l1 += math.Abs(float64(vals[j][c]) - z)
		}
		rnd += m / 254 * l1 * (1 + 1e-5)
	}
	return ref, mag, rnd
}

// TestCodeAccumF16 checks CodeAccumF16 (Go and AVX-512 paths) against
// the float64 sum Σ_j p_j·s_j·(code_jc − z_j) with the fp16 scales and
// zeros widened exactly, onto a non-zero acc, over odd row counts (1, 2,
// 3, 7, 65, 201: odd tails of the two-row loop) and padded strides, head
// dims of one to three 64-channel chunks (and 32, 40: the Go loop).
// Bound: w_j = p_j·s_j rounded once, then float32 sums of n terms (two
// partial sums) and the zero term: |err| ≤ (n+4)·2⁻²⁴·Σ_j |p_j s_j|·
// (|code_jc| + |z_j|) + 2⁻²³·|acc[c]|.
func TestCodeAccumF16(t *testing.T) {
	defer func(v bool) { hasAVX512 = v }(hasAVX512)
	have := hasAVX512
	for _, path := range []string{"go", "avx512"} {
		if path == "avx512" && !have {
			t.Log("no AVX-512 in this build or CPU; only the Go path ran")
			continue
		}
		hasAVX512 = path == "avx512"
		t.Run(path, func(t *testing.T) {
			for _, sh := range [][2]int{{2, 64}, {2, 128}, {2, 192}, {2, 32}, {4, 64}, {4, 128}, {4, 40}, {8, 64}, {8, 192}, {8, 40}} {
				bits, hd := sh[0], sh[1]
				for _, n := range []int{1, 2, 3, 7, 65, 201} {
					for _, pad := range []int{0, 3} {
						name := fmt.Sprintf("b%d/hd%d/n%d/pad%d", bits, hd, n, pad)
						rb := hd*bits/8 + pad
						codes, vals := codeRowsCase(uint64(7*bits+hd+n+pad), bits, hd, n, rb)
						r := newRand(uint64(n + hd))
						p := make([]float32, n)
						params := make([]uint16, 2*n)
						for j := range p {
							p[j] = float32(r.Float64())
							params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
							params[2*j+1] = halfBits(F16, float32(r.Float64()*float64(int(1)<<bits)))
						}
						acc := randSlice(r, hd)
						base := append([]float32(nil), acc...)
						tmp := make([]float32, hd)
						CodeAccumF16(acc, p, params, codes, bits, rb, n, tmp)
						for c := 0; c < hd; c++ {
							ref, mag, _ := accumRef(float64(base[c]), p, params, vals, c, n+1)
							bound := float64(n+4)*0x1p-24*mag + 0x1p-23*math.Abs(ref)
							if d := math.Abs(float64(acc[c]) - ref); !(d <= bound) {
								t.Fatalf("%s: acc[%d] = %g, float64 %g (|err| %g > %g)", name, c, acc[c], ref, d, bound)
							}
						}
					}
				}
			}
		})
	}
}

// TestCodeAccumF16x4 checks CodeAccumF16x4 (Go and AVX-512 paths) the way
// TestCodeAccumF16 checks CodeAccumF16: four query rows with their own
// weights (a padded ldp) onto non-zero acc rows, against the float64 sum
// with TestCodeAccumF16's bound, over odd row counts and padded strides
// and head dims of one to three 64-channel chunks (40: the Go loop).
func TestCodeAccumF16x4(t *testing.T) {
	defer func(v bool) { hasAVX512 = v }(hasAVX512)
	have := hasAVX512
	for _, path := range []string{"go", "avx512"} {
		if path == "avx512" && !have {
			t.Log("no AVX-512 in this build or CPU; only the Go path ran")
			continue
		}
		hasAVX512 = path == "avx512"
		t.Run(path, func(t *testing.T) {
			for _, sh := range [][2]int{{2, 64}, {2, 128}, {2, 192}, {4, 64}, {4, 128}, {4, 40}, {8, 64}, {8, 192}} {
				bits, hd := sh[0], sh[1]
				for _, n := range []int{1, 2, 3, 7, 65, 201} {
					for _, pad := range []int{0, 3} {
						name := fmt.Sprintf("b%d/hd%d/n%d/pad%d", bits, hd, n, pad)
						rb := hd*bits/8 + pad
						codes, vals := codeRowsCase(uint64(11*bits+hd+n+pad), bits, hd, n, rb)
						r := newRand(uint64(3*n + hd))
						ldp := n + 2
						p := make([]float32, 4*ldp)
						for i := range p {
							p[i] = float32(r.Float64()) * float32(1+i/ldp) // rows of different sizes
						}
						params := make([]uint16, 2*n)
						for j := 0; j < n; j++ {
							params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
							params[2*j+1] = halfBits(F16, float32(r.Float64()*float64(int(1)<<bits)))
						}
						acc := randSlice(r, 4*hd)
						base := append([]float32(nil), acc...)
						tmp := make([]float32, 4*hd)
						CodeAccumF16x4(acc, p, ldp, params, codes, bits, rb, n, tmp)
						for q := 0; q < 4; q++ {
							for c := 0; c < hd; c++ {
								ref, mag, _ := accumRef(float64(base[q*hd+c]), p[q*ldp:q*ldp+n], params, vals, c, n+1)
								bound := float64(n+4)*0x1p-24*mag + 0x1p-23*math.Abs(ref)
								if d := math.Abs(float64(acc[q*hd+c]) - ref); !(d <= bound) {
									t.Fatalf("%s: row %d acc[%d] = %g, float64 %g (|err| %g > %g)", name, q, c, acc[q*hd+c], ref, d, bound)
								}
							}
						}
					}
				}
			}
		})
	}
}

// TestCodeAccumQ8 checks CodeAccumQ8 (Go, AVX2 and VNNI/VBMI paths) against the
// float64 sum Σ_j p_j·s_j·(code_jc − z_j) onto a non-zero acc, over odd
// row counts (1, 15, 16, 17, 65, 201: whole and partial blocks of 16)
// and padded strides (pad 3: the Go path), with weights of mixed signs
// and sizes. Bound: the weight rounding of codesvq8.go, Σ_B (δ_B/2)·
// Σ_{j∈B} |code_jc − z_j| with δ_B = max_{j∈B}|p_j s_j|/127, plus
// TestCodeAccumF16's float32 bound doubled; the test also checks the
// rounding term is not vacuous (the worst channel uses > 1% of it).
func TestCodeAccumQ8(t *testing.T) {
	defer func(v, a bool) { hasVBMI, hasQ8AVX2 = v, a }(hasVBMI, hasQ8AVX2)
	vbmi, avx2 := hasVBMI, hasQ8AVX2
	for _, path := range []string{"go", "avx2", "vbmi"} {
		if path == "vbmi" && !vbmi || path == "avx2" && !avx2 {
			t.Logf("no %s kernel in this build or CPU; that path did not run", path)
			continue
		}
		hasVBMI, hasQ8AVX2 = path == "vbmi", path == "avx2"
		t.Run(path, func(t *testing.T) {
			for _, sh := range [][2]int{{2, 64}, {2, 128}, {4, 64}, {8, 64}} {
				bits, hd := sh[0], sh[1]
				for _, n := range []int{1, 15, 16, 17, 65, 201} {
					for _, pad := range []int{0, 3} {
						name := fmt.Sprintf("b%d/hd%d/n%d/pad%d", bits, hd, n, pad)
						rb := hd*bits/8 + pad
						codes, vals := codeRowsCase(uint64(13*bits+hd+n+pad), bits, hd, n, rb)
						r := newRand(uint64(5*n + hd + pad))
						p := make([]float32, n)
						params := make([]uint16, 2*n)
						for j := range p {
							p[j] = float32(r.Float64() * math.Exp(-8*r.Float64())) // softmax-like spread
							if j%7 == 3 {
								p[j] = -p[j]
							}
							params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
							params[2*j+1] = halfBits(F16, float32(r.Float64()*float64(int(1)<<bits)))
						}
						acc := randSlice(r, hd)
						base := append([]float32(nil), acc...)
						tmp := make([]float32, hd)
						CodeAccumQ8(acc, p, params, codes, bits, rb, n, tmp)
						worst := 0.0
						for c := 0; c < hd; c++ {
							ref, mag, rnd := accumRef(float64(base[c]), p, params, vals, c, 16)
							fp := 2*(float64(n+4)*0x1p-24*mag) + 0x1p-23*math.Abs(ref)
							d := math.Abs(float64(acc[c]) - ref)
							if !(d <= rnd+fp) {
								t.Fatalf("%s: acc[%d] = %g, float64 %g (|err| %g > %g + %g)", name, c, acc[c], ref, d, rnd, fp)
							}
							if rnd > 0 {
								worst = math.Max(worst, (d-fp)/rnd)
							}
						}
						if n >= 65 && worst < 0.01 {
							t.Errorf("%s: worst error %.2g of the rounding bound: vacuous", name, worst)
						}
					}
				}
			}
		})
	}
}

// BenchmarkCodeAccum compares the value kernels on 2,048 rows of 2-bit
// codes (head_dim 64 and 128, one query row): CodeAccumF16 (float32
// weights) and CodeAccumQ8 (int8-rounded weights). Reports ns per row.
func BenchmarkCodeAccum(b *testing.B) {
	for _, hd := range []int{64, 128} {
		const n = 2048
		rb := hd / 4
		codes, _ := codeRowsCase(1, 2, hd, n, rb)
		r := newRand(2)
		p := make([]float32, n)
		params := make([]uint16, 2*n)
		for j := range p {
			p[j] = float32(r.Float64())
			params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
			params[2*j+1] = halfBits(F16, float32(r.Float64()*4))
		}
		acc, tmp := make([]float32, hd), make([]float32, hd)
		for _, k := range []struct {
			name string
			f    func(acc, p []float32, params []uint16, codes []byte, bits, rb, n int, tmp []float32)
		}{{"f16", CodeAccumF16}, {"q8", CodeAccumQ8}} {
			b.Run(fmt.Sprintf("hd%d/%s", hd, k.name), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					k.f(acc, p, params, codes, 2, rb, n, tmp)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/row")
			})
		}
	}
}
