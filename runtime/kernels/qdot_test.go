package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// qdotRef returns the float64 value of DotQRow's sum and Σ|terms| (the
// scale of its rounding error).
func qdotRef(x []float32, src []byte, bits int, scales, zeros []uint16, group int, zsym float32) (sum, abs float64) {
	for j, xv := range x {
		g := j / group
		z := float64(zsym)
		if zeros != nil {
			z = float64(safetensors.F16ToFloat32(zeros[g]))
		}
		p := j * bits
		v := uint16(src[p>>3])
		if p&7+bits > 8 {
			v |= uint16(src[p>>3+1]) << 8
		}
		c := float64(v >> uint(p&7) & (1<<uint(bits) - 1))
		term := float64(safetensors.F16ToFloat32(scales[g])) * (c - z) * float64(xv)
		sum += term
		abs += math.Abs(term)
	}
	return sum, abs
}

// DotQRow (AVX2 row loops, with and without room to read past the row,
// and Go), and DotU4RowIL on InterleaveU4's x for 4-bit groups of 16s,
// agree with the float64 dot product of x with the dequantized
// row to (n/8 + n/group + 8)·2^−23 of Σ|terms|, for 1-4 bits, groups of
// 8, 32, 64, 128 and per-channel (group = n), odd row counts (rows are
// independent calls; each row of a 7-row matrix is checked), symmetric
// and asymmetric grids.
func TestDotQRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	for _, bits := range []int{1, 2, 3, 4} {
		for _, c := range []struct{ n, group int }{{32, 32}, {256, 32}, {1024, 64}, {384, 128}, {640, 640}, {96, 8}, {30, 10}, {48, 16}} {
			const rows = 7
			rb := (c.n*bits + 7) / 8
			ng := c.n / c.group
			codes := make([]byte, rows*rb)
			for i := range codes {
				codes[i] = byte(rng.IntN(256))
			}
			scales, zeros := make([]uint16, rows*ng), make([]uint16, rows*ng)
			for g := range scales {
				scales[g] = safetensors.F16FromFloat32(float32(rng.NormFloat64() * 0.05))
				zeros[g] = safetensors.F16FromFloat32(float32(rng.IntN(1 << uint(bits))))
			}
			x := make([]float32, c.n)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			zsym := float32(int(1) << uint(bits-1))
			for _, sym := range []bool{false, true} {
				for _, asm := range []bool{false, true} {
					if asm && !hasAsm {
						continue
					}
					for r := 0; r < rows; r++ {
						var zs []uint16
						if !sym {
							zs = zeros[r*ng : (r+1)*ng]
						}
						sc := scales[r*ng : (r+1)*ng]
						// The last row has no bytes past it: the bit
						// loop must not read beyond them.
						src := codes[r*rb : (r+1)*rb : (r+1)*rb]
						if r < rows-1 {
							src = codes[r*rb : (r+1)*rb]
						}
						useAsm = asm
						got := DotQRow(x, src, bits, sc, zs, c.group, zsym)
						useAsm = hasAsm
						want, abs := qdotRef(x, src, bits, sc, zs, c.group, zsym)
						bound := float64(c.n/8+ng+8) * 0x1p-23 * abs
						if d := math.Abs(float64(got) - want); !(d <= bound) {
							t.Fatalf("bits %d n %d group %d sym %v asm %v row %d: got %v, want %v (diff %g, bound %g)", bits, c.n, c.group, sym, asm, r, got, want, d, bound)
						}
						if bits != 4 || c.group%16 != 0 {
							continue
						}
						xi := make([]float32, c.n)
						InterleaveU4(xi, x)
						useAsm = asm
						got = DotU4RowIL(xi, src, sc, zs, c.group, zsym)
						useAsm = hasAsm
						if d := math.Abs(float64(got) - want); !(d <= bound) {
							t.Fatalf("DotU4RowIL n %d group %d sym %v asm %v row %d: got %v, want %v (diff %g, bound %g)", c.n, c.group, sym, asm, r, got, want, d, bound)
						}
					}
				}
			}
		}
	}
}

// DotQRow panics on a bad width or group.
func TestDotQRowPanics(t *testing.T) {
	for _, c := range []struct {
		bits, group int
	}{{0, 8}, {5, 8}, {4, 3}, {4, 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("bits %d group %d: no panic", c.bits, c.group)
				}
			}()
			DotQRow(make([]float32, 16), make([]byte, 16), c.bits, make([]uint16, 4), nil, c.group, 0)
		}()
	}
}

// BenchmarkDotQRow reports the packed bytes (codes, scales, zero-points)
// read per second by DotQRow (and for 4 bits DotU4RowIL after
// InterleaveU4) over a [1024, 1024] matrix, against Dot over
// the float32 matrix (4 bytes per element), one thread.
func BenchmarkDotQRow(b *testing.B) {
	const n, k = 1024, 1024
	rng := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, k)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := make([]float32, n)
	for _, bits := range []int{4, 3, 2} {
		for _, group := range []int{32, 128} {
			rb, ng := (k*bits+7)/8, k/group
			codes := make([]byte, n*rb)
			for i := range codes {
				codes[i] = byte(rng.IntN(256))
			}
			scales, zeros := make([]uint16, n*ng), make([]uint16, n*ng)
			for i := range scales {
				scales[i] = safetensors.F16FromFloat32(0.01)
				zeros[i] = safetensors.F16FromFloat32(float32(rng.IntN(1 << uint(bits))))
			}
			if bits == 4 {
				b.Run(fmt.Sprintf("bits4-il/g%d", group), func(b *testing.B) {
					xi := make([]float32, k)
					for b.Loop() {
						InterleaveU4(xi, x)
						for r := 0; r < n; r++ {
							y[r] = DotU4RowIL(xi, codes[r*rb:], scales[r*ng:(r+1)*ng], zeros[r*ng:(r+1)*ng], group, 0)
						}
					}
					bytes := float64(len(codes) + 2*len(scales) + 2*len(zeros))
					b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
			b.Run(fmt.Sprintf("bits%d/g%d", bits, group), func(b *testing.B) {
				for b.Loop() {
					for r := 0; r < n; r++ {
						y[r] = DotQRow(x, codes[r*rb:], bits, scales[r*ng:(r+1)*ng], zeros[r*ng:(r+1)*ng], group, 0)
					}
				}
				bytes := float64(len(codes) + 2*len(scales) + 2*len(zeros))
				b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
	w := make([]float32, n*k)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	b.Run("float32", func(b *testing.B) {
		for b.Loop() {
			for r := 0; r < n; r++ {
				y[r] = Dot(x, w[r*k:(r+1)*k])
			}
		}
		b.ReportMetric(4*float64(n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	})
}
