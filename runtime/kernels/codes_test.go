package kernels

import (
	"fmt"
	"math"
	goruntime "runtime"
	"testing"
)

// codeRowsCase returns n random rows of hd codes of bits bits at stride
// rb (rb > hd·bits/8: padding bytes 0xff, which the kernels must not
// read as codes), and the codes as integers [n, hd].
func codeRowsCase(seed uint64, bits, hd, n, rb int) ([]byte, [][]int) {
	r := newRand(seed)
	signed := bits == CodeS8
	if signed {
		bits = 8
	}
	codes := make([]byte, n*rb)
	for i := range codes {
		codes[i] = 0xff
	}
	vals := make([][]int, n)
	for j := range vals {
		vals[j] = make([]int, hd)
		row := codes[j*rb : j*rb+hd*bits/8]
		clear(row)
		for c := range vals[j] {
			v := r.IntN(1 << bits)
			vals[j][c] = v
			if signed {
				vals[j][c] = int(int8(byte(v)))
			}
			p := c * bits
			row[p>>3] |= byte(v << (p & 7))
		}
	}
	return codes, vals
}

// codeShapes are the (bits, hd) of the code kernel tests: multiples of
// 32 (assembly where the CPU has it) and head dims that are not (8, 12,
// 6, 40, 100: the Go loop).
var codeShapes = [][2]int{
	{2, 32}, {2, 64}, {2, 96}, {2, 128}, {2, 8}, {2, 12}, {2, 40},
	{4, 32}, {4, 64}, {4, 128}, {4, 6}, {4, 100},
	{8, 32}, {8, 64}, {8, 160}, {8, 7}, {8, 40},
	{CodeS8, 32}, {CodeS8, 64}, {CodeS8, 7}, {CodeS8, 40},
}

// TestCodeDots checks CodeDots against the float64 dot products over odd
// row counts (1, 7, 33, 65) and strides with padding. Bound: a float32
// sum of hd products of exact operands (codes are small integers, q is
// float32) in any order, each product rounded at most once:
// |err| ≤ (hd+1)·2⁻²⁴·Σ_c |q_c·code_c| (Higham's γ_{hd+1}, to first order).
func TestCodeDots(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		for _, sh := range codeShapes {
			bits, hd := sh[0], sh[1]
			for _, n := range []int{1, 7, 33, 65} {
				for _, pad := range []int{0, 3} {
					rb := codeRowBytes(hd, bits) + pad
					codes, vals := codeRowsCase(uint64(bits*1000+hd+n), bits, hd, n, rb)
					q := randSlice(newRand(uint64(hd*n+pad)), hd)
					out := make([]float32, n+1)
					out[n] = 42
					CodeDots(out, q, codes[:len(codes)-pad], bits, rb, n)
					if out[n] != 42 {
						t.Fatalf("bits %d hd %d n %d: wrote past n", bits, hd, n)
					}
					for j := 0; j < n; j++ {
						var ref, abs float64
						for c, v := range vals[j] {
							ref += float64(q[c]) * float64(v)
							abs += math.Abs(float64(q[c]) * float64(v))
						}
						if bound := float64(hd+1) * 0x1p-24 * abs; !(math.Abs(float64(out[j])-ref) <= bound) {
							t.Fatalf("bits %d hd %d n %d rb %d: row %d: %g, want %g (bound %.3g)", bits, hd, n, rb, j, out[j], ref, bound)
						}
					}
				}
			}
		}
	})
}

// TestCodeAxpy checks CodeAxpy against float64 over the same shapes,
// onto a non-zero accumulator. Bound: acc_c plus n exact-operand products
// summed in float32: |err| ≤ (n+2)·2⁻²⁴·(|acc_c| + Σ_j |w_j·code_jc|).
func TestCodeAxpy(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		for _, sh := range codeShapes {
			bits, hd := sh[0], sh[1]
			for _, n := range []int{1, 7, 33, 65} {
				for _, pad := range []int{0, 3} {
					rb := codeRowBytes(hd, bits) + pad
					codes, vals := codeRowsCase(uint64(bits*1000+hd+n), bits, hd, n, rb)
					w := randSlice(newRand(uint64(hd*n+pad)), n)
					acc := randSlice(newRand(uint64(hd+n+7)), hd+1)
					base := append([]float32(nil), acc...)
					CodeAxpy(acc[:hd], w, codes[:len(codes)-pad], bits, rb, n)
					if acc[hd] != base[hd] {
						t.Fatalf("bits %d hd %d n %d: wrote past hd", bits, hd, n)
					}
					for c := 0; c < hd; c++ {
						ref, abs := float64(base[c]), math.Abs(float64(base[c]))
						for j := 0; j < n; j++ {
							ref += float64(w[j]) * float64(vals[j][c])
							abs += math.Abs(float64(w[j]) * float64(vals[j][c]))
						}
						if bound := float64(n+2) * 0x1p-24 * abs; !(math.Abs(float64(acc[c])-ref) <= bound) {
							t.Fatalf("bits %d hd %d n %d rb %d: column %d: %g, want %g (bound %.3g)", bits, hd, n, rb, c, acc[c], ref, bound)
						}
					}
				}
			}
		}
	})
}

// TestCodeKernelsPanic checks the programmer-error panics.
func TestCodeKernelsPanic(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"bits 3", func() { CodeDots(make([]float32, 1), make([]float32, 8), make([]byte, 3), 3, 3, 1) }},
		{"split byte", func() { CodeDots(make([]float32, 1), make([]float32, 6), make([]byte, 2), 2, 2, 1) }},
		{"short codes", func() { CodeAxpy(make([]float32, 32), make([]float32, 2), make([]byte, 9), 2, 8, 2) }},
		{"short stride", func() { CodeAxpy(make([]float32, 32), make([]float32, 1), make([]byte, 16), 4, 8, 1) }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", c.name)
				}
			}()
			c.f()
		}()
	}
}

// benchRows runs f b.N times on its goroutine's thread and reports rows/s
// (n rows per call) by the wall clock and CPU ns/row by the thread's CPU
// time (on a loaded machine the wall clock counts others' time).
func benchRows(b *testing.B, n int, f func()) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	b.ResetTimer()
	c0 := threadCPUSeconds()
	for i := 0; i < b.N; i++ {
		f()
	}
	cpu := threadCPUSeconds() - c0
	b.ReportMetric(float64(b.N)*float64(n)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(cpu*1e9/(float64(b.N)*float64(n)), "cpu-ns/row")
}

// BenchmarkCodeDots and BenchmarkCodeAxpy measure the kernels on 64 rows
// of head_dim 64 (a decode block of one KV head), go and asm paths; the
// float path they replace (expand the codes by table, then the float32
// product) is kvcache's BenchmarkCodeKernels.
func BenchmarkCodeDots(b *testing.B) {
	for _, bits := range []int{2, 4, 8, CodeS8} {
		b.Run(fmt.Sprintf("bits=%d", bits), func(b *testing.B) {
			const hd, n = 64, 64
			rb := codeRowBytes(hd, bits)
			codes, _ := codeRowsCase(1, bits, hd, n, rb)
			q, out := randSlice(newRand(2), hd), make([]float32, n)
			benchRows(b, n, func() { CodeDots(out, q, codes, bits, rb, n) })
		})
	}
}

func BenchmarkCodeAxpy(b *testing.B) {
	for _, bits := range []int{2, 4, 8, CodeS8} {
		b.Run(fmt.Sprintf("bits=%d", bits), func(b *testing.B) {
			const hd, n = 64, 64
			rb := codeRowBytes(hd, bits)
			codes, _ := codeRowsCase(1, bits, hd, n, rb)
			w, acc := randSlice(newRand(2), n), make([]float32, hd)
			benchRows(b, n, func() { CodeAxpy(acc, w, codes, bits, rb, n) })
		})
	}
}

// codeRowBytes is the bytes of hd codes of bits (CodeS8: 8).
func codeRowBytes(hd, bits int) int {
	if bits == CodeS8 {
		bits = 8
	}
	return hd * bits / 8
}
