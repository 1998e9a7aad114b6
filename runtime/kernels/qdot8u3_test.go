package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// SplitU3 puts code c of the 3-bit stream at c & 3 in the 2-bit plane of
// its block (the 2-bit layout) and c >> 2 at u3HiBit's byte and bit, for
// padded source rows; every bit of the output is one code's, so a block
// of codes 0 gives 12 zero bytes and a block of codes 7 gives 12 bytes
// 0xff.
func TestSplitU3(t *testing.T) {
	rng := rand.New(rand.NewPCG(91, 92))
	const rows, k, rb = 5, 160, 3*160/8 + 3
	src := make([]byte, rows*rb)
	for i := range src {
		src[i] = byte(rng.IntN(256))
	}
	const ob = 3 * k / 8
	dst := make([]byte, rows*ob)
	SplitU3(dst, src, rb, rows, k)
	for r := 0; r < rows; r++ {
		for j := 0; j < k; j++ {
			c := int(codeAt(src[r*rb:], 3, j))
			blk := dst[r*ob+j/32*U3BlockBytes:]
			lo := int(codeAt(blk, 2, j%32))
			hb, bit := u3HiBit(j % 32)
			hi := int(blk[8+hb] >> uint(bit) & 1)
			if lo != c&3 || hi != c>>2 || int(u3BlockCode(blk, j%32)) != c {
				t.Fatalf("row %d code %d = %d: low plane %d, high bit %d, block code %d", r, j, c, lo, hi, u3BlockCode(blk, j%32))
			}
		}
	}
	// joinU3 is SplitU3's inverse (the source rows' padding aside).
	back := make([]byte, ob)
	for r := 0; r < rows; r++ {
		joinU3(back, dst[r*ob:(r+1)*ob], k)
		for i := 0; i < ob; i++ {
			if back[i] != src[r*rb+i] {
				t.Fatalf("row %d byte %d: joinU3 gives %#x, the stream has %#x", r, i, back[i], src[r*rb+i])
			}
		}
	}
	// u3HiBit is a bijection of the 32 codes onto the 32 high bits.
	seen := map[[2]int]bool{}
	for j := 0; j < 32; j++ {
		hb, bit := u3HiBit(j)
		if hb < 0 || hb > 3 || bit < 0 || bit > 7 || seen[[2]int{hb, bit}] {
			t.Fatalf("u3HiBit(%d) = %d, %d: outside the 4 bytes or taken twice", j, hb, bit)
		}
		seen[[2]int{hb, bit}] = true
	}
	for _, c := range []byte{0, 7} {
		s := make([]byte, 12)
		for j := 0; j < 32; j++ {
			for b := 0; b < 3; b++ {
				s[(3*j+b)/8] |= (c >> uint(b) & 1) << uint((3*j+b)%8)
			}
		}
		d := make([]byte, 12)
		SplitU3(d, s, 12, 1, 32)
		for i, v := range d {
			if want := byte(0xff * (c / 7)); v != want {
				t.Fatalf("codes %d: block byte %d = %#x, want %#x", c, i, v, want)
			}
		}
	}
}

// DotQ8MatrixU3 (the 3-bit AVX2 and VNNI kernels, one-row, two-row pairs
// and four activation rows at a time, or the Go loop) agrees for every
// activation row of 1-, 3-, 4- and 7-row batches and each of 7 weight
// rows:
//   - with the float64 sum Σ_j s_g·(c_j − z_g)·S_b·Q_j on the quantised
//     activations to (k/block + 16)·2^−23 of Σ_j |s_g|·(c_j + |z_g|)·S_b·|Q_j|
//     (DotQ8Rows' bound: float32 scaling and accumulation only);
//   - with the float64 dot product of the dequantised row with x itself to
//     that plus the activation rounding bound Σ_j |s_g·(c_j − z_g)|·S_b/2;
//   - bit for bit with itself on each activation row alone (m = 1) and on
//     a single weight row, so that a row's result does not depend on the
//     rows batched with it; and, in assembly, bit for bit across the
//     kernels (pairs on and off, weight tiles of one row and of the
//     default size);
//
// for groups 32, 64, 128 and per channel, group 8 and 16 (activation
// block = group: the Go loop), symmetric and asymmetric grids.
func TestDotQ8MatrixU3(t *testing.T) {
	rng := rand.New(rand.NewPCG(93, 94))
	type path struct {
		name        string
		asm, vnni   bool
		pairs, tile bool // usePairs; a one-row q8TileBytes
	}
	paths := []path{{name: "go"}}
	if hasAsm && hasF16C {
		paths = append(paths, path{"avx2", true, false, false, false}, path{"avx2-tile1", true, false, false, true})
		if hasVNNI {
			paths = append(paths, path{"vnni", true, true, false, false}, path{"vnni-pairs", true, true, true, false}, path{"vnni-pairs-tile1", true, true, true, true})
		}
	}
	t.Logf("paths: %v", paths)
	defer func(a, v, p bool, tb int) { useAsm, hasVNNI, usePairs, q8TileBytes = a, v, p, tb }(useAsm, hasVNNI, usePairs, q8TileBytes)
	const bits, rows = 3, 7
	for _, c := range []struct{ k, group int }{{32, 32}, {288, 32}, {1024, 64}, {384, 128}, {640, 640}, {1408, 1408}, {96, 8}, {64, 16}} {
		rb := c.k * bits / 8
		ng := c.k / c.group
		codes := make([]byte, rows*rb)
		for i := range codes {
			codes[i] = byte(rng.IntN(256))
		}
		split := make([]byte, rows*rb)
		SplitU3(split, codes, rb, rows, c.k)
		scales, zeros := make([]uint16, rows*ng), make([]uint16, rows*ng)
		for g := range scales {
			scales[g] = safetensors.F16FromFloat32(float32(rng.NormFloat64() * 0.05))
			zeros[g] = safetensors.F16FromFloat32(float32(rng.IntN(8)))
		}
		block := ActBlock(c.group)
		for _, m := range []int{1, 3, 4, 7} {
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
				var asmRef []float32
				for _, p := range paths {
					useAsm, hasVNNI, usePairs = p.asm, p.vnni, p.pairs
					q8TileBytes = 64 << 10
					if p.tile {
						q8TileBytes = 1
					}
					label := fmt.Sprintf("%s k %d group %d m %d sym %v", p.name, c.k, c.group, m, sym)
					y := make([]float32, m*rows)
					DotQ8MatrixU3(y, rows, &a, split, rows, scales, zm, c.group, zsym)
					if p.asm && block == 32 {
						if asmRef == nil {
							asmRef = y
						}
						for i := range y {
							if y[i] != asmRef[i] {
								t.Errorf("%s output %d: %g, %s gave %g", label, i, y[i], paths[1].name, asmRef[i])
								break
							}
						}
					}
					// Each activation row alone, each weight row alone.
					for i := 0; i < m; i++ {
						var a1 Q8Act
						QuantizeActQ8(&a1, x[i*c.k:], c.k, 1, c.k, block)
						a1.Prepare(bits)
						y1 := make([]float32, rows)
						DotQ8MatrixU3(y1, rows, &a1, split, rows, scales, zm, c.group, zsym)
						for r := 0; r < rows; r++ {
							var zr []uint16
							if !sym {
								zr = zeros[r*ng : (r+1)*ng]
							}
							var yr [1]float32
							DotQ8MatrixU3(yr[:], 1, &a1, split[r*rb:(r+1)*rb], 1, scales[r*ng:(r+1)*ng], zr, c.group, zsym)
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
