package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// SplitU3 puts code c of the 3-bit stream at c & 3 in the 2-bit plane and
// c >> 2 in the 1-bit plane, for padded source rows.
func TestSplitU3(t *testing.T) {
	rng := rand.New(rand.NewPCG(91, 92))
	const rows, k, rb = 5, 136, 3*136/8 + 3
	src := make([]byte, rows*rb)
	for i := range src {
		src[i] = byte(rng.IntN(256))
	}
	lb, hb := U3PlaneBytes(k)
	lo, hi := make([]byte, rows*lb), make([]byte, rows*hb)
	SplitU3(lo, hi, src, rb, rows, k)
	for r := 0; r < rows; r++ {
		for j := 0; j < k; j++ {
			c := int(codeAt(src[r*rb:], 3, j))
			if l, h := int(codeAt(lo[r*lb:], 2, j)), int(codeAt(hi[r*hb:], 1, j)); l != c&3 || h != c>>2 {
				t.Fatalf("row %d code %d = %d: planes %d, %d", r, j, c, l, h)
			}
		}
	}
}

// DotQ8MatrixU3 (the 2-bit and 1-bit AVX2/VNNI kernels on the planes, or
// the Go loop) agrees for every activation row of 1-, 3- and 7-row
// batches and each of 7 weight rows:
//   - with the float64 sum Σ_j s_g·(c_j − z_g)·S_b·Q_j on the quantised
//     activations to (k/block + 16)·2^−23 of Σ_j |s_g|·(c_j + |z_g|)·S_b·|Q_j|
//     (DotQ8Rows' bound: float32 scaling and accumulation only);
//   - with the float64 dot product of the dequantised row with x itself to
//     that plus the activation rounding bound Σ_j |s_g·(c_j − z_g)|·S_b/2;
//   - bit for bit with itself on each activation row alone (m = 1) and on
//     a single weight row, so that a row's result does not depend on the
//     rows batched with it;
//
// for groups 32, 64, 128 and per channel, groups 8 and 16 (activation
// block = group: the Go loop), symmetric and asymmetric grids.
func TestDotQ8MatrixU3(t *testing.T) {
	rng := rand.New(rand.NewPCG(93, 94))
	type path struct {
		name      string
		asm, vnni bool
	}
	paths := []path{{"go", false, false}}
	if hasAsm && hasF16C {
		paths = append(paths, path{"avx2", true, false})
		if hasVNNI {
			paths = append(paths, path{"vnni", true, true})
		}
	}
	t.Logf("paths: %v", paths)
	defer func(a, v bool) { useAsm, hasVNNI = a, v }(useAsm, hasVNNI)
	const bits, rows = 3, 7
	for _, c := range []struct{ k, group int }{{32, 32}, {256, 32}, {1024, 64}, {384, 128}, {640, 640}, {1408, 1408}, {96, 8}, {48, 16}} {
		rb := c.k * bits / 8
		ng := c.k / c.group
		codes := make([]byte, rows*rb)
		for i := range codes {
			codes[i] = byte(rng.IntN(256))
		}
		lb, hb := U3PlaneBytes(c.k)
		lo, hi := make([]byte, rows*lb), make([]byte, rows*hb)
		SplitU3(lo, hi, codes, rb, rows, c.k)
		scales, zeros := make([]uint16, rows*ng), make([]uint16, rows*ng)
		for g := range scales {
			scales[g] = safetensors.F16FromFloat32(float32(rng.NormFloat64() * 0.05))
			zeros[g] = safetensors.F16FromFloat32(float32(rng.IntN(8)))
		}
		block := ActBlock(c.group)
		for _, m := range []int{1, 3, 7} {
			x := make([]float32, m*c.k)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			var a Q8Act
			QuantizeActQ8(&a, x, c.k, m, c.k, block)
			a.Prepare(bits)
			const zsym = 4
			for _, sym := range []bool{false, true} {
				var zm []uint16
				if !sym {
					zm = zeros
				}
				for _, p := range paths {
					useAsm, hasVNNI = p.asm, p.vnni
					label := fmt.Sprintf("%s k %d group %d m %d sym %v", p.name, c.k, c.group, m, sym)
					y := make([]float32, m*rows)
					DotQ8MatrixU3(y, rows, &a, lo, hi, rows, scales, zm, c.group, zsym, make([]float32, m*rows))
					// Each activation row alone, each weight row alone.
					for i := 0; i < m; i++ {
						var a1 Q8Act
						QuantizeActQ8(&a1, x[i*c.k:], c.k, 1, c.k, block)
						a1.Prepare(bits)
						y1 := make([]float32, rows)
						DotQ8MatrixU3(y1, rows, &a1, lo, hi, rows, scales, zm, c.group, zsym, make([]float32, rows))
						for r := 0; r < rows; r++ {
							var zr []uint16
							if !sym {
								zr = zeros[r*ng : (r+1)*ng]
							}
							var yr [1]float32
							DotQ8MatrixU3(yr[:], 1, &a1, lo[r*lb:(r+1)*lb], hi[r*hb:(r+1)*hb], 1, scales[r*ng:(r+1)*ng], zr, c.group, zsym, make([]float32, 1))
							if y1[r] != y[i*rows+r] || yr[0] != y[i*rows+r] {
								t.Errorf("%s row %d/%d: batch %g, one activation row %g, one weight row %g", label, i, r, y[i*rows+r], y1[r], yr[0])
							}
						}
					}
					checkQ8Bound(t, label, y, x, &a, codes, rb, bits, scales, zeros, zsym, sym, c.k, c.group, block, m, rows)
				}
			}
		}
	}
}
