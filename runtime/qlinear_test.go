package runtime

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// randQuantized returns a random packed weight [rows, cols]: random codes,
// scales in [0.01, 0.1], integer zero-points (fractional at 1 bit), and a
// random column permutation when perm.
func randQuantized(rng *rand.Rand, rows, cols, bits, group int, sym, perm bool) *weights.Quantized {
	q := &weights.Quantized{Rows: rows, Cols: cols, Bits: bits, GroupSize: group, Symmetric: sym}
	rb := weights.RowBytes(cols, bits)
	q.Codes = make([]byte, rows*rb)
	codes := make([]uint8, cols)
	for r := 0; r < rows; r++ {
		for j := range codes {
			codes[j] = uint8(rng.IntN(1 << bits))
		}
		weights.PackRow(q.Codes[r*rb:(r+1)*rb], codes, bits)
	}
	ng := cols / group
	q.Scales = make([]uint16, rows*ng)
	for i := range q.Scales {
		q.Scales[i] = safetensors.F16FromFloat32(float32(0.01 + 0.09*rng.Float64()))
	}
	if !sym {
		q.Zeros = make([]uint16, rows*ng)
		for i := range q.Zeros {
			z := float32(rng.IntN(1 << bits))
			if bits == 1 {
				z = float32(rng.Float64())
			}
			q.Zeros[i] = safetensors.F16FromFloat32(z)
		}
	}
	if perm {
		q.Perm = make([]int32, cols)
		for j, p := range rng.Perm(cols) {
			q.Perm[j] = int32(p)
		}
	}
	return q
}

func TestUnpackCodesMatchesUnpackRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, bits := range []int{1, 2, 3, 4, 8} {
		for _, n := range []int{1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 257} {
			src := make([]byte, weights.RowBytes(n, bits))
			codes := make([]uint8, n)
			for j := range codes {
				codes[j] = uint8(rng.IntN(1 << bits))
			}
			weights.PackRow(src, codes, bits)
			want, got := make([]uint8, n), make([]uint8, n)
			weights.UnpackRow(want, src, bits)
			unpackCodes(got, src, bits)
			for j := range want {
				if got[j] != want[j] || want[j] != codes[j] {
					t.Fatalf("bits %d n %d: code %d is %d, UnpackRow %d, packed %d", bits, n, j, got[j], want[j], codes[j])
				}
			}
		}
	}
}

// q8Bound returns the bound on the int8 activation rounding of y[r] =
// x·W[r] (x [k]) when row r of p's W decodes on int8 activations
// (qseg.q8), else 0: Σ_j |ŵ[r, perm(j)]|·S_b/2 over storage columns j,
// S_b = max|x| over activation block b of x in storage order / 127
// (kernels.QuantizeActQ8), ŵ = full [n, k] the dequantized W in original
// column order; widened by 1e-6 relative for the float32 scale.
func q8Bound(p *packedLinear, x, full []float32, r int) float64 {
	k := p.k
	for si := range p.segs {
		s := &p.segs[si]
		if r < s.row0 || r >= s.row0+s.rows || !s.q8() {
			continue
		}
		col := func(j int) int {
			if s.q.Perm != nil {
				return int(s.q.Perm[j])
			}
			return j
		}
		blk := kernels.ActBlock(s.q.GroupSize)
		var bound float64
		for b := 0; b < k; b += blk {
			var mx, w float64
			for j := b; j < b+blk; j++ {
				mx = math.Max(mx, math.Abs(float64(x[col(j)])))
				w += math.Abs(float64(full[r*k+col(j)]))
			}
			bound += w * mx / 127 / 2
		}
		return bound * (1 + 1e-6)
	}
	return 0
}

// A packed matmul (tiles of rows dequantized per thread) equals the float
// GEMM on the matrix weights.Quantized.Dequantize gives, for row counts
// that are not multiples of the tile, every width, permutations, stacked
// segments of mixed widths and float rows, decode and prefill shapes, and
// 1-3 threads, with the fused GEMV for m <= 4 and with tiles only; both
// within 1e-5·max|y|, plus, for rows that the fused GEMV runs on int8
// activations (8 bits, act-order; q8Widths), the activation rounding
// bound q8Bound.
func TestPackedMatMulTiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	type part struct {
		rows, bits, group int
		sym, perm, float  bool
	}
	cases := []struct {
		k     int
		parts []part
	}{
		{64, []part{{1, 4, 32, false, false, false}}},
		{64, []part{{13, 4, 32, false, false, false}}},
		{96, []part{{25, 3, 32, true, false, false}}},
		{100, []part{{131, 2, 100, false, false, false}}},
		{64, []part{{37, 1, 32, false, false, false}}},
		{48, []part{{50, 8, 16, false, false, false}}},
		{128, []part{{29, 4, 32, false, true, false}}},
		{160, []part{{23, 3, 32, false, true, false}}},
		{192, []part{{9, 3, 64, false, false, false}, {11, 4, 32, false, false, false}}},
		{256, []part{{64, 4, 32, false, false, false}, {16, 3, 64, true, false, false}, {16, 2, 256, false, true, false}}},
		{64, []part{{10, 4, 32, false, false, false}, {7, 0, 0, false, false, true}, {19, 1, 64, false, false, false}}},
		{1100, []part{{70, 4, 100, false, true, false}}},
	}
	for ci, c := range cases {
		k := c.k
		p := &packedLinear{k: k}
		var full []float32
		for _, pt := range c.parts {
			s := qseg{row0: p.n, rows: pt.rows}
			f := make([]float32, pt.rows*k)
			if pt.float {
				for i := range f {
					f[i] = float32(rng.NormFloat64())
				}
				s.f = f
			} else {
				q := randQuantized(rng, pt.rows, k, pt.bits, pt.group, pt.sym, pt.perm)
				q.Dequantize(f)
				s.q, s.rb, s.ng, s.zsym = q, weights.RowBytes(k, q.Bits), k/q.GroupSize, float64(int(1)<<uint(q.Bits-1))
			}
			p.segs = append(p.segs, s)
			p.n += pt.rows
			full = append(full, f...)
		}
		p.setFused()
		// 1-4 bits in natural order run fused on the float kernels or
		// int8 activations, 8 bits and act-order where the width runs
		// on int8 activations (q8Widths).
		wantFused := true
		for _, s := range p.segs {
			wantFused = wantFused && (s.q == nil || (s.q.Bits <= 4 && s.q.Perm == nil) || s.q8())
		}
		if p.fused != wantFused {
			t.Errorf("case %d: fused %v, want %v", ci, p.fused, wantFused)
		}
		n := p.n
		for _, m := range []int{1, 2, 4, 7} {
			x := make([]float32, m*k)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			want := make([]float32, m*n)
			kernels.MatMulNT(m, n, k, x, k, full, k, want, n)
			var mx float64
			for _, v := range want {
				mx = math.Max(mx, math.Abs(float64(v)))
			}
			for _, fusedMaxM := range []int{0, 4} {
				for _, th := range []int{1, 2, 3} {
					old := qFusedMaxM
					qFusedMaxM = fusedMaxM
					cm := &cpuModel{pool: kernels.NewPool(th), layers: []cpuLayer{{wqkv: linear{p: p}}}}
					cm.allocPacked()
					got := make([]float32, m*n)
					for i := range got {
						got[i] = float32(math.NaN())
					}
					cm.matMul(m, n, k, x, k, &linear{p: p}, got, n)
					cm.pool.Close()
					qFusedMaxM = old
					for i := range got {
						bound := 1e-5 * mx
						if p.q8 || fusedMaxM > 0 {
							bound += q8Bound(p, x[i/n*k:(i/n+1)*k], full, i%n)
						}
						if d := math.Abs(float64(got[i] - want[i])); !(d <= bound) {
							t.Errorf("case %d (n %d, k %d) m %d threads %d fused m<=%d: y[%d, %d] = %g, want %g: diff %g > bound %g", ci, n, k, m, th, fusedMaxM, i/n, i%n, got[i], want[i], d, bound)
							break
						}
					}
				}
			}
		}
	}
}
