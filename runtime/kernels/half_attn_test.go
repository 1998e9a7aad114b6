package kernels

import (
	"fmt"
	"math"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// halfAttnShapes are HalfScores/HalfAccum's test shapes: nq 1 (MHA
// decode), 4, 7 and 8 (GQA groups: the four-row kernels and odd
// remainders); n rows around the 4-row unroll and the 64-row pass;
// head_dim 8 (one step), 12 (not a multiple of 8: the portable path), 24,
// 40 (below 64: HalfAccum's 8-column loop only), 64, 72 (64 + an
// 8-column tail) and 128.
var (
	halfAttnNQ = []int{1, 4, 7, 8}
	halfAttnN  = []int{1, 3, 4, 5, 7, 63, 64, 65, 130}
	halfAttnHD = []int{8, 12, 24, 40, 64, 72, 128}
)

// randHalfRows returns n binary16 rows of hd values N(0,1)-ish (row
// stride ld, padding rows with NaN bits that must not be read) in a slice
// ending at a guard page, and their exact float64 values ([n, hd]).
func randHalfRows(t *testing.T, seed uint64, n, hd, ld int) ([]uint16, []float64) {
	r := newRand(seed)
	k := guardedU16(t, (n-1)*ld+hd)
	for i := range k {
		k[i] = 0x7e00 // NaN: a kernel that reads padding poisons its output
	}
	ref := make([]float64, n*hd)
	for j := 0; j < n; j++ {
		for d := 0; d < hd; d++ {
			h := safetensors.F16FromFloat32(float32(3 * (2*r.Float64() - 1)))
			k[j*ld+d] = h
			ref[j*hd+d] = float64(safetensors.F16ToFloat32(h))
		}
	}
	return k, ref
}

func TestHalfScores(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		for _, nq := range halfAttnNQ {
			for _, n := range halfAttnN {
				for _, hd := range halfAttnHD {
					name := fmt.Sprintf("nq%d_n%d_hd%d", nq, n, hd)
					ldq, ldk, lds := hd+3, hd+5, n+2
					q := randSlice(newRand(uint64(7*nq+n)), (nq-1)*ldq+hd)
					k, kr := randHalfRows(t, uint64(n*hd), n, hd, ldk)
					s := make([]float32, nq*lds)
					fill(s, sentinel)
					HalfScores(nq, n, hd, q, ldq, k, ldk, s, lds)
					ref, mag := make([]float64, nq*n), make([]float64, nq*n)
					for i := 0; i < nq; i++ {
						for j := 0; j < n; j++ {
							var a, m float64
							for d := 0; d < hd; d++ {
								v := float64(q[i*ldq+d]) * kr[j*hd+d]
								a, m = a+v, m+math.Abs(v)
							}
							ref[i*n+j], mag[i*n+j] = a, m
						}
					}
					checkMatResult(t, name, nq, n, s, lds, ref, mag)
				}
			}
		}
	})
}

func TestHalfAccum(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		for _, nq := range halfAttnNQ {
			for _, n := range halfAttnN {
				for _, hd := range halfAttnHD {
					name := fmt.Sprintf("nq%d_n%d_hd%d", nq, n, hd)
					ldp, ldv, ldo := n+3, hd+5, hd+2
					rp := newRand(uint64(11*nq + n))
					p := make([]float32, (nq-1)*ldp+n)
					for i := range p {
						p[i] = float32(rp.Float64()) // softmax weights are ≥ 0
					}
					v, vr := randHalfRows(t, uint64(n*hd+1), n, hd, ldv)
					out := make([]float32, nq*ldo)
					fill(out, sentinel)
					ref, mag := make([]float64, nq*hd), make([]float64, nq*hd)
					for i := 0; i < nq; i++ {
						for d := 0; d < hd; d++ {
							o := float32(2*rp.Float64() - 1)
							out[i*ldo+d] = o
							a, m := float64(o), math.Abs(float64(o))
							for j := 0; j < n; j++ {
								x := float64(p[i*ldp+j]) * vr[j*hd+d]
								a, m = a+x, m+math.Abs(x)
							}
							ref[i*hd+d], mag[i*hd+d] = a, m
						}
					}
					HalfAccum(nq, n, hd, p, ldp, v, ldv, out, ldo)
					checkMatResult(t, name, nq, hd, out, ldo, ref, mag)
				}
			}
		}
	})
}

func TestHalfAttnShapes(t *testing.T) {
	q, s := make([]float32, 16), make([]float32, 4)
	k := make([]uint16, 16)
	mustPanic(t, "negative", func() { HalfScores(-1, 1, 8, q, 8, k, 8, s, 1) })
	mustPanic(t, "len(k)", func() { HalfScores(1, 3, 8, q, 8, k, 8, s, 3) })
	mustPanic(t, "ldk", func() { HalfScores(1, 1, 8, q, 8, k, 4, s, 1) })
	mustPanic(t, "len(out)", func() { HalfAccum(1, 2, 8, s, 2, k, 8, s, 8) })
	// hd 0: scores are zero; accumulation adds nothing.
	s[0] = 5
	HalfScores(1, 1, 0, nil, 0, nil, 0, s, 1)
	if s[0] != 0 {
		t.Fatalf("HalfScores with hd 0 left %v, want 0", s[0])
	}
}

// BenchmarkHalfAttn times one kv head's fp16 scores and accumulation over
// n rows of head_dim 64 (a long context's window or an fp16 cache),
// reporting the binary16 bytes read per second (K and V once each).
func BenchmarkHalfAttn(b *testing.B) {
	for _, nq := range []int{1, 4} {
		for _, n := range []int{320, 8192} {
			b.Run(fmt.Sprintf("nq%d_n%d", nq, n), func(b *testing.B) {
				const hd = 64
				r := newRand(3)
				q, p := randSlice(r, nq*hd), randSlice(r, nq*n)
				k, v := make([]uint16, n*hd), make([]uint16, n*hd)
				for i := range k {
					k[i], v[i] = safetensors.F16FromFloat32(float32(r.NormFloat64())), safetensors.F16FromFloat32(float32(r.NormFloat64()))
				}
				s, out := make([]float32, nq*n), make([]float32, nq*hd)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					HalfScores(nq, n, hd, q, hd, k, hd, s, n)
					HalfAccum(nq, n, hd, p, n, v, hd, out, hd)
				}
				b.ReportMetric(float64(4*n*hd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
			// The path before HalfScores/HalfAccum: widen 64 rows into an
			// L1 block, then the float32 GEMMs.
			b.Run(fmt.Sprintf("widen/nq%d_n%d", nq, n), func(b *testing.B) {
				const hd = 64
				r := newRand(3)
				q, p := randSlice(r, nq*hd), randSlice(r, nq*n)
				k, v := make([]uint16, n*hd), make([]uint16, n*hd)
				for i := range k {
					k[i], v[i] = safetensors.F16FromFloat32(float32(r.NormFloat64())), safetensors.F16FromFloat32(float32(r.NormFloat64()))
				}
				s, out, tmp, blk := make([]float32, nq*n), make([]float32, nq*hd), make([]float32, nq*hd), make([]float32, 64*hd)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					for a := 0; a < n; a += 64 {
						e := min(n, a+64)
						WidenHalf(F16, blk, k[a*hd:e*hd])
						MatMulNT(nq, e-a, hd, q, hd, blk, hd, s[a:], n)
					}
					for a := 0; a < n; a += 64 {
						e := min(n, a+64)
						WidenHalf(F16, blk, v[a*hd:e*hd])
						MatMulNN(nq, hd, e-a, p[a:], n, blk, hd, tmp, hd)
						Axpy(1, tmp, out)
					}
				}
				b.ReportMetric(float64(4*n*hd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}

// TestHalfAttnRowsAlone checks that a query row's HalfScores and
// HalfAccum outputs have the same bits whether it runs in a group of 8 or
// alone (the four-row kernels sum as the one-row ones do), on both paths.
func TestHalfAttnRowsAlone(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		for _, hd := range []int{24, 64, 72} {
			for _, n := range []int{5, 64, 131} {
				const nq = 8
				r := newRand(uint64(n + hd))
				q, p := randSlice(r, nq*hd), randSlice(r, nq*n)
				k, _ := randHalfRows(t, 1, n, hd, hd)
				v, _ := randHalfRows(t, 2, n, hd, hd)
				s, out := make([]float32, nq*n), randSlice(r, nq*hd)
				s1, out1 := make([]float32, n), make([]float32, hd)
				base := append([]float32(nil), out...)
				HalfScores(nq, n, hd, q, hd, k, hd, s, n)
				HalfAccum(nq, n, hd, p, n, v, hd, out, hd)
				for i := 0; i < nq; i++ {
					HalfScores(1, n, hd, q[i*hd:], hd, k, hd, s1, n)
					copy(out1, base[i*hd:(i+1)*hd])
					HalfAccum(1, n, hd, p[i*n:], n, v, hd, out1, hd)
					for j := range s1 {
						if math.Float32bits(s1[j]) != math.Float32bits(s[i*n+j]) {
							t.Fatalf("hd %d n %d: score[%d][%d] %v in the group, %v alone", hd, n, i, j, s[i*n+j], s1[j])
						}
					}
					for d := range out1 {
						if math.Float32bits(out1[d]) != math.Float32bits(out[i*hd+d]) {
							t.Fatalf("hd %d n %d: out[%d][%d] %v in the group, %v alone", hd, n, i, d, out[i*hd+d], out1[d])
						}
					}
				}
			}
		}
	})
}
