package kernels

import (
	"fmt"
	"math"
	"testing"
)

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
							ref, mag := float64(base[c]), 0.0
							for j := 0; j < n; j++ {
								w := float64(p[j]) * float64(F16.Widen(params[2*j]))
								z := float64(F16.Widen(params[2*j+1]))
								ref += w * (float64(vals[j][c]) - z)
								mag += math.Abs(w) * (float64(vals[j][c]) + math.Abs(z))
							}
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
								ref, mag := float64(base[q*hd+c]), 0.0
								for j := 0; j < n; j++ {
									w := float64(p[q*ldp+j]) * float64(F16.Widen(params[2*j]))
									z := float64(F16.Widen(params[2*j+1]))
									ref += w * (float64(vals[j][c]) - z)
									mag += math.Abs(w) * (float64(vals[j][c]) + math.Abs(z))
								}
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
