package kernels

import (
	"fmt"
	"math"
	"testing"
	"unsafe"
)

// TestCodeDotsQ8AVX2Exact checks the integer part of the AVX2 code
// kernels exactly: with scale 1, Σq̃ 0 and every row's scale 1 and zero
// 0, each score is float32(t_j) of the row's int32 product t_j (|t_j| <
// 2²⁴ here, so exact), which must equal q8RowDot's sum for every row,
// head_dim and stride, for the float32-parameter (CodeDotsQ8), the fp16
// (CodeDotsQ8F16) and the four-query (CodeDotsQ8F16x4) kernels. Codes
// and query include the extremes (every code at 2^bits − 1 against
// ±127: 8-bit pairs would saturate VPMADDUBSW without the nibble split).
// It also checks the full epilogue: with random scales and zeros, the
// AVX2 scores have the bits of the VNNI ones where the CPU has both.
func TestCodeDotsQ8AVX2Exact(t *testing.T) {
	if !hasQ8AVX2 {
		t.Skip("no AVX2, FMA and F16C in this build or CPU")
	}
	defer func(v, a bool) { hasVNNI512, hasQ8AVX2 = v, a }(hasVNNI512, hasQ8AVX2)
	vnni := hasVNNI512
	hasVNNI512 = false
	r := newRand(11)
	shapes := append(append([][2]int{}, q8Shapes...), q8BreakShapes...)
	for _, sh := range shapes {
		bits, hd := sh[0], sh[1]
		R := hd * bits / 8
		for _, n := range []int{4, 7, 13, 65} {
			for _, pad := range []int{0, 5} {
				for _, extreme := range []bool{false, true} {
					name := fmt.Sprintf("b%d/hd%d/n%d/pad%d/extreme%v", bits, hd, n, pad, extreme)
					rb := R + pad
					codes := make([]byte, n*rb)
					for i := range codes {
						codes[i] = byte(r.IntN(256))
						if extreme {
							codes[i] = 255
						}
					}
					qs := make([]float32, 4*hd)
					for i := range qs {
						qs[i] = float32(r.NormFloat64())
						if extreme {
							qs[i] = float32(1 - 2*(i/7%2)) // ±1: every q8 ±127
						}
					}
					qb, qb4, coef := make([]byte, CodeQ8Len(hd)), make([]byte, 4*CodeQ8Len(hd)), make([]float32, 8)
					CodeQ8Query(qb, qs[:hd], bits)
					CodeQ8Query4(qb4, qs, bits, coef)
					sz := make([]float32, 2*n)
					params := make([]uint16, 2*n)
					for j := 0; j < n; j++ {
						sz[2*j] = 1
						params[2*j] = halfBits(F16, 1)
					}
					out, outF := make([]float32, n), make([]float32, n)
					CodeDotsQ8(out, qb, 1, 0, codes, bits, rb, n, sz)
					CodeDotsQ8F16(outF, qb, 1, 0, codes, bits, rb, n, params)
					one := []float32{1, 0, 1, 0, 1, 0, 1, 0}
					out4 := make([]float32, 4*n)
					CodeDotsQ8F16x4(out4, n, qb4, one, codes, bits, rb, n, params)
					for j := 0; j < n; j++ {
						want := float32(q8RowDot(codes[j*rb:], qb, 1, 0, bits))
						if out[j] != want || outF[j] != want {
							t.Fatalf("%s: row %d: CodeDotsQ8 %g, CodeDotsQ8F16 %g, want t = %g", name, j, out[j], outF[j], want)
						}
						for q := 0; q < 4; q++ {
							if w := float32(q8RowDot(codes[j*rb:], qb4, 4, q, bits)); out4[q*n+j] != w {
								t.Fatalf("%s: query %d row %d: CodeDotsQ8F16x4 %g, want t = %g", name, q, j, out4[q*n+j], w)
							}
						}
					}
					if !vnni {
						continue
					}
					scale, sum := CodeQ8Query(qb, qs[:hd], bits)
					for j := 0; j < n; j++ {
						params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
						params[2*j+1] = halfBits(F16, float32(r.Float64()*float64(int(1)<<bits)))
					}
					CodeDotsQ8F16(outF, qb, scale, sum, codes, bits, rb, n, params)
					CodeDotsQ8F16x4(out4, n, qb4, coef, codes, bits, rb, n, params)
					hasVNNI512 = true
					vn, vn4 := make([]float32, n), make([]float32, 4*n)
					CodeDotsQ8F16(vn, qb, scale, sum, codes, bits, rb, n, params)
					CodeDotsQ8F16x4(vn4, n, qb4, coef, codes, bits, rb, n, params)
					hasVNNI512 = false
					for j := 0; j < 4*(n/4); j++ {
						if math.Float32bits(outF[j]) != math.Float32bits(vn[j]) {
							t.Fatalf("%s: row %d: AVX2 %g, VNNI %g", name, j, outF[j], vn[j])
						}
						for q := 0; q < 4; q++ {
							if math.Float32bits(out4[q*n+j]) != math.Float32bits(vn4[q*n+j]) {
								t.Fatalf("%s: x4 query %d row %d: AVX2 %g, VNNI %g", name, q, j, out4[q*n+j], vn4[q*n+j])
							}
						}
					}
				}
			}
		}
	}
	if !vnni {
		t.Log("no AVX-512 VNNI on this CPU: the AVX2 epilogue was not compared with the VNNI kernels' bits")
	}
}

// TestCodeAccumQ8AVX2Exact checks the integer part of the AVX2 value
// kernel exactly: with every row's scale 1, integer zeros in [0, 4) and
// integer weights in [−127, 127] with a ±127 in every block of 16 rows,
// each block's δ is 1 and its w̃ the weights themselves, so every float32
// sum is of integers below 2²⁴ and the output must equal the exact
// Σ_j p_j·(code_jc − z_j) for head_dim 64 and 128 and row counts with
// and without a partial last block. It also checks the const tables'
// offsets that the assembly reads.
func TestCodeAccumQ8AVX2Exact(t *testing.T) {
	if got := [4]uintptr{unsafe.Offsetof(q8Consts.ones16), unsafe.Offsetof(q8Consts.sixteens), unsafe.Offsetof(q8vConsts.split), unsafe.Offsetof(q8vConsts.pairs)}; got != [4]uintptr{224, 256, 400, 432} {
		t.Fatalf("const table offsets %v, the assembly reads 224, 256, 400, 432", got)
	}
	if !hasQ8AVX2 {
		t.Skip("no AVX2, FMA and F16C in this build or CPU")
	}
	defer func(v, a bool) { hasVBMI, hasQ8AVX2 = v, a }(hasVBMI, hasQ8AVX2)
	hasVBMI = false
	r := newRand(12)
	for _, hd := range []int{64, 128} {
		for _, n := range []int{16, 48, 64, 100, 1024} {
			for _, extreme := range []bool{false, true} {
				rb := hd / 4
				codes := make([]byte, n*rb)
				p := make([]float32, n)
				params := make([]uint16, 2*n)
				for j := 0; j < n; j++ {
					p[j] = float32(r.IntN(255) - 127)
					if j%16 == 5 {
						p[j] = float32(127 * (1 - 2*(j/16%2)))
					}
					z := r.IntN(4)
					if extreme {
						p[j] = float32(127 * (1 - 2*(j%2))) // largest products of both signs
						z = 0
					}
					params[2*j], params[2*j+1] = halfBits(F16, 1), halfBits(F16, float32(z))
				}
				for i := range codes {
					codes[i] = byte(r.IntN(256))
					if extreme {
						codes[i] = 0xff
					}
				}
				acc, tmp := make([]float32, hd), make([]float32, hd)
				CodeAccumQ8(acc, p, params, codes, 2, rb, n, tmp)
				for c := 0; c < hd; c++ {
					var want int64
					for j := 0; j < n; j++ {
						code := int64(codes[j*rb+c/4] >> (2 * (c % 4)) & 3)
						want += int64(p[j]) * (code - int64(F16.Widen(params[2*j+1])))
					}
					if acc[c] != float32(want) {
						t.Fatalf("hd %d, n %d, extreme %v: acc[%d] = %g, want %d", hd, n, extreme, c, acc[c], want)
					}
				}
			}
		}
	}
}
