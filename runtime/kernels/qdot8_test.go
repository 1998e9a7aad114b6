package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// QuantizeActQ8 keeps every value within half a block scale, uses the
// full int8 range [−127, 127] in every non-zero block, and stores
// Sum = S·ΣQ; an all-zero block gets S = 0 and Q = 0.
func TestQuantizeActQ8(t *testing.T) {
	rng := rand.New(rand.NewPCG(81, 82))
	for _, c := range []struct{ m, k, block, ldx int }{{1, 32, 32, 32}, {7, 96, 32, 100}, {3, 30, 10, 30}, {2, 640, 640, 641}} {
		x := make([]float32, (c.m-1)*c.ldx+c.k)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 3)
		}
		clear(x[:c.block]) // one all-zero block
		var a Q8Act
		QuantizeActQ8(&a, x, c.ldx, c.m, c.k, c.block)
		nb := c.k / c.block
		for i := 0; i < c.m; i++ {
			for b := 0; b < nb; b++ {
				s := float64(a.S[i*nb+b])
				var sum, mq int
				for j := b * c.block; j < (b+1)*c.block; j++ {
					q := int(a.Q[i*c.k+j])
					xv := float64(x[i*c.ldx+j])
					if q < -127 || q > 127 || math.Abs(xv-s*float64(q)) > s/2*(1+1e-6) {
						t.Fatalf("%+v row %d col %d: x %g, S %g, Q %d: |x − S·Q| > S/2", c, i, j, xv, s, q)
					}
					sum += q
					mq = max(mq, q, -q)
				}
				if i == 0 && b == 0 {
					if s != 0 || mq != 0 {
						t.Errorf("%+v: all-zero block has S %g, max|Q| %d", c, s, mq)
					}
					continue
				}
				if mq != 127 {
					t.Errorf("%+v row %d block %d: max|Q| %d, want 127", c, i, b, mq)
				}
				if got, want := a.Sum[i*nb+b], float32(s)*float32(sum); got != want {
					t.Errorf("%+v row %d block %d: Sum %g, want %g", c, i, b, got, want)
				}
			}
		}
	}
}

// codeAt decodes code j of an LSB-first bit stream bit by bit.
func codeAt(src []byte, bits, j int) float64 {
	var v int
	for i := 0; i < bits; i++ {
		p := j*bits + i
		v |= int(src[p>>3]>>uint(p&7)&1) << uint(i)
	}
	return float64(v)
}

// DotQ8Rows and DotQ8Matrix (the AVX2 and VNNI kernels for 8-, 4-, 2- and
// 1-bit blocks of 32, and
// the Go loop for every width and block) agrees, for every activation row
// of 1-, 3- and 7-row batches and each of 7 weight rows:
//   - with the float64 sum Σ_j s_g·(c_j − z_g)·S_b·Q_j on the quantised
//     activations to (k/block + 16)·2^−23 of Σ_j |s_g|·(c_j + |z_g|)·S_b·|Q_j|
//     (float32 scaling and accumulation only: the block sums are exact);
//   - with the float64 dot product of the dequantised row with x itself to
//     that plus the activation rounding bound Σ_j |s_g·(c_j − z_g)|·S_b/2;
//
// for 1, 2, 3, 4 and 8 bits, groups 32, 64, 128 and per channel, groups
// of 8, 10 and 16 (activation block = group, so k is not a multiple of
// 32 and the Go loop runs), symmetric and asymmetric grids (1 bit:
// fractional zero-points).
func TestDotQ8Rows(t *testing.T) {
	rng := rand.New(rand.NewPCG(83, 84))
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
	for _, bits := range []int{1, 2, 3, 4, 8} {
		for _, c := range []struct{ k, group int }{{32, 32}, {256, 32}, {1024, 64}, {384, 128}, {640, 640}, {1408, 1408}, {96, 8}, {30, 10}, {48, 16}} {
			const rows = 7
			rb := (c.k*bits + 7) / 8
			ng := c.k / c.group
			codes := make([]byte, rows*rb)
			for i := range codes {
				codes[i] = byte(rng.IntN(256))
			}
			if pad := c.k * bits % 8; pad != 0 { // unused high bits are zero
				for r := 0; r < rows; r++ {
					codes[(r+1)*rb-1] &= byte(1)<<uint(pad) - 1
				}
			}
			scales, zeros := make([]uint16, rows*ng), make([]uint16, rows*ng)
			for g := range scales {
				scales[g] = safetensors.F16FromFloat32(float32(rng.NormFloat64() * 0.05))
				z := float32(rng.IntN(1 << uint(bits)))
				if bits == 1 {
					z = float32(rng.NormFloat64())
				}
				zeros[g] = safetensors.F16FromFloat32(z)
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
				zsym := float32(int(1) << uint(bits-1))
				for _, sym := range []bool{false, true} {
					for _, p := range paths {
						useAsm, hasVNNI = p.asm, p.vnni
						label := fmt.Sprintf("%s bits %d k %d group %d m %d sym %v", p.name, bits, c.k, c.group, m, sym)
						y := make([]float32, m*rows)
						for r := 0; r < rows; r++ {
							var zs []uint16
							if !sym {
								zs = zeros[r*ng : (r+1)*ng]
							}
							DotQ8Rows(y[r:], rows, &a, codes[r*rb:(r+1)*rb:(r+1)*rb], bits, scales[r*ng:(r+1)*ng], zs, c.group, zsym)
						}
						// The whole matrix at once: the same kernels, so
						// the same values bit for bit.
						ym := make([]float32, m*rows)
						var zm []uint16
						if !sym {
							zm = zeros
						}
						DotQ8Matrix(ym, rows, &a, codes, rb, rows, bits, scales, zm, c.group, zsym)
						for i := range ym {
							if ym[i] != y[i] {
								t.Errorf("%s: DotQ8Matrix y[%d] = %g, DotQ8Rows %g", label, i, ym[i], y[i])
								break
							}
						}
						checkQ8Bound(t, label, y, x, &a, codes, rb, bits, scales, zeros, zsym, sym, c.k, c.group, block, m, rows)
					}
				}
			}
		}
	}
}

// DotQ8Matrix on several activation rows (the four-row kernels for each
// four rows, the one-row kernel for the last 1-3, over tiles of packed
// rows) gives every output bit for bit what DotQ8Rows (the one-row kernel
// for that activation row alone) gives it, so that a row's result does
// not depend on the rows batched with it: 1-, 2-, 4- and 8-bit codes,
// groups 32, 64, 128 and per channel with 1-17 blocks (full and partial
// runs of eight groups), symmetric and asymmetric, 13 packed rows,
// contiguous or padded, one tile or tiles of 3 rows, 1-11 activation
// rows (one of them all zero), on the AVX2 and the VNNI kernels.
func TestDotQ8MatrixRowsBitwise(t *testing.T) {
	if !Q8Asm(4, 32) {
		t.Skip("no assembly kernels in this build or on this CPU")
	}
	rng := rand.New(rand.NewPCG(85, 86))
	vnnis := []bool{false}
	if hasVNNI {
		vnnis = append(vnnis, true)
	}
	defer func(v bool, tb int) { hasVNNI, q8TileBytes = v, tb }(hasVNNI, q8TileBytes)
	for _, bits := range []int{1, 2, 4, 8} {
		for _, c := range []struct{ k, group int }{{32, 32}, {224, 32}, {288, 32}, {544, 32}, {192, 64}, {448, 64}, {384, 128}, {640, 128}, {224, 224}, {544, 544}} {
			const rows = 13
			ng := c.k / c.group
			for _, pad := range []int{0, 5} {
				rb := c.k*bits/8 + pad
				codes := make([]byte, rows*rb)
				for i := range codes {
					codes[i] = byte(rng.IntN(256))
				}
				scales, zeros := make([]uint16, rows*ng), make([]uint16, rows*ng)
				for g := range scales {
					scales[g] = safetensors.F16FromFloat32(float32(rng.NormFloat64() * 0.05))
					z := float32(rng.IntN(1 << uint(bits)))
					if bits == 1 {
						z = float32(rng.NormFloat64())
					}
					zeros[g] = safetensors.F16FromFloat32(z)
				}
				zsym := float32(int(1) << uint(bits-1))
				for _, m := range []int{2, 4, 5, 7, 8, 11} {
					x := make([]float32, m*c.k)
					for i := range x {
						x[i] = float32(rng.NormFloat64())
					}
					clear(x[c.k : 2*c.k]) // activation row 1 all zero
					var a Q8Act
					QuantizeActQ8(&a, x, c.k, m, c.k, 32)
					a.Prepare(bits)
					for _, sym := range []bool{false, true} {
						for _, vnni := range vnnis {
							for _, tile := range []int{1 << 20, 3 * rb} {
								hasVNNI, q8TileBytes = vnni, tile
								label := fmt.Sprintf("bits %d k %d group %d pad %d m %d sym %v vnni %v tile %d", bits, c.k, c.group, pad, m, sym, vnni, tile)
								want := make([]float32, m*rows)
								for r := 0; r < rows; r++ {
									var zs []uint16
									if !sym {
										zs = zeros[r*ng : (r+1)*ng]
									}
									DotQ8Rows(want[r:], rows, &a, codes[r*rb:(r+1)*rb], bits, scales[r*ng:(r+1)*ng], zs, c.group, zsym)
								}
								var zm []uint16
								if !sym {
									zm = zeros
								}
								got := make([]float32, m*rows)
								DotQ8Matrix(got, rows, &a, codes, rb, rows, bits, scales, zm, c.group, zsym)
								for i := range got {
									if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
										t.Errorf("%s: activation row %d packed row %d: %g (%#08x), one-row kernel %g (%#08x)", label, i/rows, i%rows, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
										break
									}
								}
								if want[rows+rows/2] != 0 || got[rows+rows/2] != 0 {
									t.Errorf("%s: all-zero activation row gives %g, %g", label, got[rows+rows/2], want[rows+rows/2])
								}
								if a, b := math.Float32bits(got[0]), math.Float32bits(got[rows-1]); a == b {
									t.Errorf("%s: packed rows 0 and %d give the same %g", label, rows-1, got[0])
								}
							}
						}
					}
				}
			}
		}
	}
}

// QuantizeActQ8 with the AVX2 blocks of 32 gives Q, S and Sum bit for bit
// those of the Go loop: normal values at several scales, exact halves
// (max 127: x·inv = x, rounded to even), ±max, all-zero and −0 blocks,
// subnormal and tiny blocks, and blocks with ±Inf or NaN (rows the
// assembly leaves to the Go loop); the assembly itself runs on the
// finite rows (quantActQ8x32 reports no block left over).
func TestQuantizeActQ8AsmBitwise(t *testing.T) {
	if !hasAsm {
		t.Skip("no AVX2 assembly in this build or on this CPU")
	}
	rng := rand.New(rand.NewPCG(87, 88))
	const k, ldx = 32 * 11, 32*11 + 3
	var rows [][]float32
	for _, sc := range []float64{3, 1e-3, 1e30, 1e-30, 1e-37, 1e-42} {
		r := make([]float32, k)
		for j := range r {
			r[j] = float32(rng.NormFloat64() * sc)
		}
		rows = append(rows, r)
	}
	halves := make([]float32, k)
	for j := range halves {
		halves[j] = float32(rng.IntN(255)-127) + 0.5
		if j%32 == 0 {
			halves[j] = 127
		}
		if j%32 == 1 {
			halves[j] = -127
		}
	}
	rows = append(rows, halves)
	special := make([]float32, k)
	for j := range special {
		special[j] = float32(rng.NormFloat64())
	}
	clear(special[0:32])
	for j := 32; j < 64; j++ {
		special[j] = float32(math.Copysign(0, -1))
	}
	special[64+5] = float32(math.Inf(1))
	special[96+7] = float32(math.Inf(-1))
	special[128+9] = float32(math.NaN())
	special[160+3] = math.Float32frombits(1) // smallest subnormal, block otherwise tiny
	for j := 160; j < 192; j++ {
		if j != 163 {
			special[j] = 0
		}
	}
	rows = append(rows, special)
	x := make([]float32, len(rows)*ldx)
	for i, r := range rows {
		copy(x[i*ldx:], r)
	}
	m := len(rows)
	for i := 0; i < 7; i++ { // the finite, not tiny rows run in assembly
		var a Q8Act
		QuantizeActQ8(&a, x, ldx, m, k, 32)
		if i == 4 || i == 5 {
			continue
		}
		if bad := quantActQ8x32(&x[i*ldx], &a.Q[i*k], &a.S[i*k/32], &a.Sum[i*k/32], k/32); bad != 0 {
			t.Errorf("row %d: assembly left %d blocks to the Go loop", i, bad)
		}
	}
	defer func(v bool) { useAsm = v }(useAsm)
	var got, want Q8Act
	useAsm = true
	QuantizeActQ8(&got, x, ldx, m, k, 32)
	useAsm = false
	QuantizeActQ8(&want, x, ldx, m, k, 32)
	for j := range want.Q {
		if got.Q[j] != want.Q[j] {
			t.Fatalf("row %d col %d: Q %d, Go loop %d (x %g)", j/k, j%k, got.Q[j], want.Q[j], x[j/k*ldx+j%k])
		}
	}
	for b := range want.S {
		if math.Float32bits(got.S[b]) != math.Float32bits(want.S[b]) || math.Float32bits(got.Sum[b]) != math.Float32bits(want.Sum[b]) {
			t.Fatalf("row %d block %d: S %g Sum %g, Go loop %g %g", b/(k/32), b%(k/32), got.S[b], got.Sum[b], want.S[b], want.Sum[b])
		}
	}
}

// The activation-rounding bound of DotQ8Rows and DotQ8Matrix,
// |ŷ − y| ≤ Σ_b (S_b/2)·Σ_{j in b} |ŵ_j| (ŵ_j = s_g·(c_j − z_g) the
// dequantised weight, y = Σ_j ŵ_j·x_j in float64), is attained, so the
// check in TestDotQ8Rows is not loose: activation row i is built against
// weight row i so that every value but each block's largest sits 0.49
// of a step from its rounding, on the side that adds up (x_j = S_b·(n_j +
// 0.49·sign ŵ_j), |n_j| ≤ 120, one value ±127·S_b per block, S_b a power
// of two so that x/S_b is exact in float32). The error of output (i, i)
// is then by construction 0.49·Σ_b S_b·Σ_{j in b, j ≠ top_b} |ŵ_j| (about
// 0.95 of the bound): it must be at least that (less 1e-5 of it for
// 0.49's float32 rounding, and the float32 scaling term of TestDotQ8Rows)
// and, like every other output, at most the bound plus the scaling term:
// 1, 2, 4 and 8 bits, groups 32
// and 128, asymmetric, 5 activation rows (the four-row kernel and the
// one-row kernel), every kernel path of this CPU.
func TestDotQ8ActBoundTight(t *testing.T) {
	rng := rand.New(rand.NewPCG(89, 90))
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
	defer func(a, v bool) { useAsm, hasVNNI = a, v }(useAsm, hasVNNI)
	const k, m = 256, 5
	for _, bits := range []int{1, 2, 4, 8} {
		for _, group := range []int{32, 128} {
			rb, ng := k*bits/8, k/group
			codes := make([]byte, m*rb)
			for i := range codes {
				codes[i] = byte(rng.IntN(256))
			}
			scales, zeros := make([]uint16, m*ng), make([]uint16, m*ng)
			for g := range scales {
				scales[g] = safetensors.F16FromFloat32(float32(rng.NormFloat64() * 0.05))
				z := float32(rng.IntN(1 << uint(bits)))
				if bits == 1 {
					z = float32(rng.NormFloat64())
				}
				zeros[g] = safetensors.F16FromFloat32(z)
			}
			what := func(r, j int) float64 { // ŵ of weight row r, column j
				g := j / group
				s := float64(safetensors.F16ToFloat32(scales[r*ng+g]))
				z := float64(safetensors.F16ToFloat32(zeros[r*ng+g]))
				return s * (codeAt(codes[r*rb:], bits, j) - z)
			}
			x := make([]float32, m*k)
			tops := make([]int, m*k/32)
			for i := 0; i < m; i++ {
				for b := 0; b < k/32; b++ {
					S := math.Ldexp(1, rng.IntN(7)-3)
					top := b*32 + rng.IntN(32)
					tops[i*k/32+b] = top
					for j := b * 32; j < (b+1)*32; j++ {
						v := float64(rng.IntN(241) - 120)
						if j == top {
							v = float64(127 * (2*rng.IntN(2) - 1))
						} else if what(i, j) < 0 {
							v -= 0.49
						} else {
							v += 0.49
						}
						x[i*k+j] = float32(S * v)
					}
				}
			}
			var a Q8Act
			QuantizeActQ8(&a, x, k, m, k, 32)
			a.Prepare(bits)
			for _, p := range paths {
				useAsm, hasVNNI = p.asm, p.vnni
				y := make([]float32, m*m)
				DotQ8Matrix(y, m, &a, codes, rb, m, bits, scales, zeros, group, 0)
				for i := 0; i < m; i++ {
					for r := 0; r < m; r++ {
						var refX, absQ, bound, built float64
						for j := 0; j < k; j++ {
							w, S := what(r, j), float64(a.S[i*k/32+j/32])
							z := math.Abs(float64(safetensors.F16ToFloat32(zeros[r*ng+j/group])))
							s := math.Abs(float64(safetensors.F16ToFloat32(scales[r*ng+j/group])))
							refX += w * float64(x[i*k+j])
							absQ += s * (codeAt(codes[r*rb:], bits, j) + z) * S * math.Abs(float64(a.Q[i*k+j]))
							bound += math.Abs(w) * S / 2
							if j != tops[i*k/32+j/32] {
								built += 0.49 * math.Abs(w) * S
							}
						}
						tol := float64(k/32+16) * 0x1p-23 * absQ
						e := math.Abs(float64(y[i*m+r]) - refX)
						label := fmt.Sprintf("%s bits %d group %d activation row %d weight row %d", p.name, bits, group, i, r)
						if !(e <= bound*(1+1e-6)+tol) {
							t.Errorf("%s: error %.4g > bound %.4g + %.3g", label, e, bound, tol)
						}
						if i == r && !(e >= built*(1-1e-5)-tol) {
							t.Errorf("%s: adversarial activations give error %.4g, want %.4g (%.3f of the bound %.4g)", label, e, built, built/bound, bound)
						}
						if i == r && r == 0 && p.name == "go" {
							t.Logf("bits %d group %d: error %.4g = %.4f of the bound (construction %.4f)", bits, group, e, e/bound, built/bound)
						}
					}
				}
			}
		}
	}
}

// checkQ8Bound checks y ([m, rows]: activation row i against packed row r
// at y[i·rows + r]) of a DotQ8 kernel on codes (rows of rb bytes, bits
// wide, k columns, scales and zeros per group, zsym the implicit zero when
// sym) and activations x quantised into a (blocks of block): within the
// float32 scaling bound (k/block + 16)·2⁻²³·Σ|terms| of the
// quantised-activation float64 reference, and within that plus the
// activation rounding bound Σ_j |s_g·(c_j − z_g)|·S_b/2 of the float64
// product with x.
func checkQ8Bound(t *testing.T, label string, y, x []float32, a *Q8Act, codes []byte, rb, bits int, scales, zeros []uint16, zsym float32, sym bool, k, group, block, m, rows int) {
	t.Helper()
	ng := k / group
	for i := 0; i < m; i++ {
		for r := 0; r < rows; r++ {
			var refQ, refX, absQ, actBound float64
			for j := 0; j < k; j++ {
				g, b := j/group, j/block
				s := float64(safetensors.F16ToFloat32(scales[r*ng+g]))
				z := float64(zsym)
				if !sym {
					z = float64(safetensors.F16ToFloat32(zeros[r*ng+g]))
				}
				cj := codeAt(codes[r*rb:], bits, j)
				S, q := float64(a.S[i*(k/block)+b]), float64(a.Q[i*k+j])
				refQ += s * (cj - z) * S * q
				refX += s * (cj - z) * float64(x[i*k+j])
				absQ += math.Abs(s) * (cj + math.Abs(z)) * S * math.Abs(q)
				actBound += math.Abs(s*(cj-z)) * S / 2
			}
			got := float64(y[i*rows+r])
			tol := float64(k/block+16) * 0x1p-23 * absQ
			if e := math.Abs(got - refQ); !(e <= tol) {
				t.Errorf("%s row %d/%d: %g, quantised-activation reference %g: error %.3g > %.3g", label, i, r, got, refQ, e, tol)
			}
			if e := math.Abs(got - refX); !(e <= tol+actBound*(1+1e-6)) {
				t.Errorf("%s row %d/%d: %g, float64 reference %g: error %.3g > bound %.3g", label, i, r, got, refX, e, tol+actBound)
			}
		}
	}
}

// The two-row VNNI kernels (dotQ8Pairs, qdot8p_amd64.s) give every output
// of DotQ8Matrix with one activation row (the decode GEMV: one kernel
// call over the whole matrix) bit for bit what the one-row VNNI kernel
// gives it, for 1, 2, 3, 7, 8 and 13 packed rows (odd counts leave the
// last row to the one-row kernel), groups of one block (the eight-group
// loop and its tail of 1-7 groups) and of several blocks (per channel
// too), with and without zero-points; and every output is within
// checkQ8Bound of the float64 references.
func TestDotQ8PairsBitwise(t *testing.T) {
	if !hasVNNI {
		t.Skip("no AVX-512 VNNI on this CPU or in this build")
	}
	defer func(b int) { pairsMinBPG = b }(pairsMinBPG)
	pairsMinBPG = 1 // the two-row kernels on every group size
	checkPairsBitwise(t, rand.New(rand.NewPCG(91, 92)), []int{1, 2, 4, 8},
		[]struct{ k, group int }{{32, 32}, {224, 32}, {288, 32}, {544, 32}, {2080, 32}, {448, 64}, {640, 128}, {544, 544}, {2048, 2048}})
}

// checkPairsBitwise checks DotQ8Matrix with one activation row against
// itself with usePairs off: every output bit for bit equal and within
// checkQ8Bound of the float64 references, for bits, shapes c (k columns
// in groups of group), 1, 2, 3, 7, 8 and 13 packed rows, with and without
// zero-points.
func checkPairsBitwise(t *testing.T, rng *rand.Rand, widths []int, shapes []struct{ k, group int }) {
	t.Helper()
	defer func(p bool) { usePairs = p }(usePairs)
	for _, bits := range widths {
		for _, c := range shapes {
			ng := c.k / c.group
			rb := c.k * bits / 8
			for _, rows := range []int{1, 2, 3, 7, 8, 13} {
				codes := make([]byte, rows*rb)
				for i := range codes {
					codes[i] = byte(rng.IntN(256))
				}
				scales, zeros := make([]uint16, rows*ng), make([]uint16, rows*ng)
				for g := range scales {
					scales[g] = safetensors.F16FromFloat32(float32(rng.NormFloat64() * 0.05))
					zeros[g] = safetensors.F16FromFloat32(float32(rng.IntN(1 << uint(bits))))
				}
				zsym := float32(int(1) << uint(bits-1))
				x := make([]float32, c.k)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				var a Q8Act
				QuantizeActQ8(&a, x, c.k, 1, c.k, 32)
				a.Prepare(bits)
				for _, sym := range []bool{false, true} {
					zm := zeros
					if sym {
						zm = nil
					}
					label := fmt.Sprintf("bits %d k %d group %d rows %d sym %v", bits, c.k, c.group, rows, sym)
					want, got := make([]float32, rows), make([]float32, rows)
					usePairs = false
					DotQ8Matrix(want, rows, &a, codes, rb, rows, bits, scales, zm, c.group, zsym)
					usePairs = true
					DotQ8Matrix(got, rows, &a, codes, rb, rows, bits, scales, zm, c.group, zsym)
					for r := range got {
						if math.Float32bits(got[r]) != math.Float32bits(want[r]) {
							t.Errorf("%s: packed row %d: pairs %g (%#08x), one-row kernel %g (%#08x)", label, r, got[r], math.Float32bits(got[r]), want[r], math.Float32bits(want[r]))
						}
					}
					checkQ8Bound(t, label, got, x, &a, codes, rb, bits, scales, zeros, zsym, sym, c.k, c.group, 32, 1, rows)
				}
			}
		}
	}
}

// The AVX2 two-row kernels (dotQ8x<bits>p2AVX2 for 1, 2, 4 and 8 bits,
// CPUs without VNNI) give
// every output of DotQ8Matrix with one activation row bit for bit what
// the one-row AVX2 kernels give it, for groups of several blocks (64,
// 128, 544 and per-channel 2048 columns; one-block groups stay on the
// one-row kernel), 1-13 packed rows (odd counts leave the last row to the
// one-row kernel), with and without zero-points; and every output is
// within checkQ8Bound of the float64 references. On a VNNI CPU it runs
// with VNNI switched off.
func TestDotQ8PairsAVX2Bitwise(t *testing.T) {
	if !Q8Asm(4, 32) {
		t.Skip("no AVX2 assembly on this CPU or in this build")
	}
	defer func(v bool) { hasVNNI = v }(hasVNNI)
	hasVNNI = false
	checkPairsBitwise(t, rand.New(rand.NewPCG(93, 94)), []int{1, 2, 4, 8},
		[]struct{ k, group int }{{448, 64}, {640, 128}, {544, 544}, {2048, 2048}, {96, 32}})
}
