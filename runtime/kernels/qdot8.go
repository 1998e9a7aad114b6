package kernels

import (
	"math"
	"unsafe"
)

// Integer GEMV over packed low-bit weights (docs/QUANT.md "Runtime"): the
// activation rows are quantised once per token to int8 per block of 32,
// as llama.cpp's q8_0 (docs/METHODS.md §3: blocks of 32, one scale each),
// and each
// packed weight row is dotted with them in integer arithmetic, one int32
// sum per block, scaled once per block and group in float32.

// Q8Act holds m activation rows x [m, k] quantised to int8 per block of
// Block consecutive columns (QuantizeActQ8):
//
//	x[i, j] ≈ S[i, b] · Q[i, j],   b = j / Block,
//
// with S[i, b] = max_{j in b} |x[i, j]| / 127 (0 for an all-zero block)
// and Q[i, j] = round(x[i, j] / S[i, b]) in [−127, 127], so that
// |x[i, j] − S[i, b]·Q[i, j]| ≤ S[i, b]/2. Sum[i, b] = S[i, b]·Σ_{j in b}
// Q[i, j] (float32) is the block's term of the zero-point fold. The
// assembly kernels for 4, 2 and 1 bits take Q with every block of 32
// reordered the way they split the block's bytes into codes (Prepare). A
// Q8Act is reusable scratch: QuantizeActQ8 grows its slices only when
// they are short, so a decode loop allocates once.
type Q8Act struct {
	M, K, Block int
	Q           []int8    // [M, K]
	S           []float32 // [M, K/Block] block scales
	Sum         []float32 // [M, K/Block] S·ΣQ per block

	perm  [5][]int8 // [bits]: Q in the bits-bit kernels' order (Prepare)
	ready [5]bool
}

// Prepare readies a for DotQ8Rows and DotQ8Matrix on bits-bit codes:
// for 4-, 2- and 1-bit codes and a.Block = 32 (the assembly's case) it writes
// Q reordered within each block of 32 into the order of the codes the
// kernel extracts from a block's bytes with one shift per lane (4 bits:
// the 16 even columns, then the 16 odd ones; 2 bits: columns 4i+t at
// 8t+i; 1 bit: columns 8i+t at 4t+i); for 3 bits the 2-bit order (the
// low plane of DotQ8MatrixU3's blocks); otherwise it does nothing. Call it
// once after QuantizeActQ8 and before the dot products, which may then
// run on several goroutines; they panic (a programmer error) on a Q8Act
// not prepared for their width.
func (a *Q8Act) Prepare(bits int) {
	if bits == 3 { // DotQ8MatrixU3: the 2-bit plane's order
		a.Prepare(2)
		a.ready[3] = a.ready[2]
		return
	}
	if bits < 1 || bits > 4 || a.ready[bits] || a.Block != 32 {
		return
	}
	n := len(a.Q)
	if cap(a.perm[bits]) < n {
		a.perm[bits] = make([]int8, n)
	}
	d := a.perm[bits][:n]
	a.perm[bits] = d
	for o := 0; o < n; o += 32 {
		q, p := a.Q[o:o+32:o+32], d[o:o+32:o+32]
		switch bits {
		case 4:
			for t := 0; t < 16; t++ {
				p[t], p[16+t] = q[2*t], q[2*t+1]
			}
		case 2:
			for t := 0; t < 4; t++ {
				for i := 0; i < 8; i++ {
					p[8*t+i] = q[4*i+t]
				}
			}
		case 1:
			for t := 0; t < 8; t++ {
				for i := 0; i < 4; i++ {
					p[4*t+i] = q[8*i+t]
				}
			}
		}
	}
	a.ready[bits] = true
}

// ActBlock returns the activation block QuantizeActQ8 should use for a
// weight quantised in groups of group columns: 32 (llama.cpp's Q8_0
// block, and the block the assembly kernels take) when it divides group,
// else group itself, so that a block never straddles two groups.
func ActBlock(group int) int {
	if group%32 == 0 {
		return 32
	}
	return group
}

// QuantizeActQ8 quantises the m rows x[i·ldx : i·ldx+k] (i < m) into a
// per block of block columns (the formula at Q8Act), block dividing k. The
// scale is computed in float32 from the block's max|x|; each value is
// rounded to the nearest integer (halves to even). Blocks of 32 run in
// AVX2 assembly where the CPU has it, with the same bits as the Go loop
// (a row with a block the assembly leaves, max|x| not finite or tiny, is
// redone in Go). It panics (a
// programmer error) when block does not divide k or x is short.
func QuantizeActQ8(a *Q8Act, x []float32, ldx, m, k, block int) {
	if block <= 0 || k%block != 0 || m < 0 || (m > 0 && len(x) < (m-1)*ldx+k) {
		panicf("QuantizeActQ8: block %d for %d columns, %d rows of stride %d in %d values", block, k, m, ldx, len(x))
	}
	nb := k / block
	a.M, a.K, a.Block = m, k, block
	if cap(a.Q) < m*k {
		a.Q = make([]int8, m*k)
	}
	if cap(a.S) < m*nb {
		a.S, a.Sum = make([]float32, m*nb), make([]float32, m*nb)
	}
	a.Q, a.S, a.Sum = a.Q[:m*k], a.S[:m*nb], a.Sum[:m*nb]
	a.ready = [5]bool{}
	for i := 0; i < m; i++ {
		xr := x[i*ldx : i*ldx+k]
		if block == 32 && useAsm && nb > 0 && quantActQ8x32(&xr[0], &a.Q[i*k], &a.S[i*nb], &a.Sum[i*nb], nb) == 0 {
			continue
		}
		for b := 0; b < nb; b++ {
			xs := xr[b*block : (b+1)*block]
			q := a.Q[i*k+b*block : i*k+(b+1)*block]
			var mx float32
			for _, v := range xs {
				mx = max(mx, abs32(v))
			}
			if !(mx > 0) {
				clear(q)
				a.S[i*nb+b], a.Sum[i*nb+b] = 0, 0
				continue
			}
			d := mx / 127
			inv := 127 / mx
			var sum int32
			for j, v := range xs {
				c := int32(math.RoundToEven(float64(v * inv)))
				c = min(max(c, -127), 127)
				q[j] = int8(c)
				sum += c
			}
			a.S[i*nb+b], a.Sum[i*nb+b] = d, d*float32(sum)
		}
	}
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// DotQ8Rows computes, for every row i < a.M of the quantised activations,
//
//	y[i·ldy] = Σ_g s_g · Σ_{b in g} (S[i,b]·Σ_{j in b} c_j·Q[i,j] − z_g·Sum[i,b])
//	         = Σ_j s_g·(c_j − z_g)·S[i,b]·Q[i,j],
//
// the dot product of the dequantised packed row with the dequantised
// activation row, where c_j is code j of the LSB-first bit stream src
// (docs/QUANT.md; at least ceil(a.K·bits/8) bytes), bits 1, 2, 3, 4 or 8,
// g = j/group, s_g the float16 scales[g] and z_g the float16 zeros[g] or
// zsym when zeros is nil. group must be a multiple of a.Block and divide
// a.K. The weight row is read from memory once for all a.M rows (it stays
// in L1 between them). Each block's Σ c·Q is exact in int32; the rest is
// float32, so against the float64 value of the sum above the result is
// off by at most about (a.K/a.Block + 8)·2^−23 of Σ_j |s_g|·(c_j+|z_g|)·
// S·|Q| (tests: qdot8_test.go). Against the float64 dot product with
// the unquantised x the activation rounding adds at most
// Σ_j |s_g·(c_j − z_g)|·S[i,b]/2. With AVX2 (and AVX-512 VNNI where the
// CPU has it) 8-, 4-, 2- and 1-bit rows with a.Block = 32 run in
// assembly: vpmaddubsw/vpmaddwd (or vpdpbusd) on the codes and Q; a must
// then be prepared for the width (Q8Act.Prepare). It panics (a
// programmer error) on a bad width, inconsistent lengths or activations
// not prepared.
func DotQ8Rows(y []float32, ldy int, a *Q8Act, src []byte, bits int, scales, zeros []uint16, group int, zsym float32) {
	k, m, blk := a.K, a.M, a.Block
	if bits != 8 && (bits < 1 || bits > 4) {
		panicf("DotQ8Rows: bits %d, want 1, 2, 3, 4 or 8", bits)
	}
	if group <= 0 || k%group != 0 || group%blk != 0 {
		panicf("DotQ8Rows: group %d for %d columns and activation block %d, want a divisor of the columns and a multiple of the block", group, k, blk)
	}
	ng := k / group
	if len(scales) < ng || (zeros != nil && len(zeros) < ng) || len(src) < (k*bits+7)/8 || (m > 0 && len(y) < (m-1)*ldy+1) {
		panicf("DotQ8Rows: %d scales, %d zeros, %d bytes, %d outputs for %d rows of %d groups of %d codes of %d bits", len(scales), len(zeros), len(src), len(y), m, ng, group, bits)
	}
	if m == 0 || ng == 0 {
		return
	}
	if Q8Asm(bits, blk) {
		var zp *uint16
		if zeros != nil {
			zp = &zeros[0]
		}
		a.checkPrepared(bits)
		for i := 0; i < m; i++ {
			dotQ8Asm(a, i, &src[0], bits, &scales[0], zp, ng, group/32, zsym, &y[i*ldy], 1)
		}
		return
	}
	dotQ8RowsGo(y, ldy, a, src, bits, scales, zeros, group, zsym)
}

// Q8Asm reports whether DotQ8Rows and DotQ8Matrix run in assembly for
// bits-bit codes and activation block blk in this build on this CPU
// (AVX2, F16C; 8, 4, 2 or 1 bits; blk = 32), rather than in portable Go.
func Q8Asm(bits, blk int) bool {
	return useAsm && hasF16C && blk == 32 && (bits == 8 || bits == 4 || bits == 2 || bits == 1)
}

// usePairs selects the two-row VNNI kernels (dotQ8Pairs) for runs of two
// or more packed rows of groups of at least pairsMinBPG blocks in dotQ8Asm
// where the CPU has them (variables for the tests, which compare them with
// the one-row kernels bit for bit). With several blocks a group the
// one-row kernel waits on one FMA chain a block, and two rows at once read
// 4-bit per-channel weights from DRAM 24% faster (BenchmarkGEMVDRAM's
// model layers, 1 thread, EPYC Zen 4: 10.6 → 13.1 GB/s, medians of 30
// passes alternated in one process); with one block a group (its two
// chains) they were no faster (8, 4, 2, 3 bits within ±6%), so those stay
// on the one-row kernel.
//
// Without VNNI the AVX2 kernels have a two-row form for groups of
// several blocks (dotQ8x4p2AVX2 and the other widths but 3 bits): 4-bit
// per-channel rows of the big
// bandwidth model's shapes ran 2.1× slower than group 32 on the one-row
// kernel (BenchmarkQ8GEMVPerChannel, [5632, 2048], AMD EPYC without
// AVX-512, 2026-12-04: 925 against 444 µs), one FMA chain a block; the
// two-row kernels also ran faster at group 128 for 8 bits (626–697 vs
// 765–786 µs, a loaded run), 2 bits (379–399 vs 455) and 1 bit (374–376
// vs 453).
var (
	usePairs    = true
	pairsMinBPG = 2
)

// pairsAVX2 reports whether the AVX2 two-row kernels take bits-bit codes
// in groups of bpg blocks: the one-row kernels' group path (bpg ≥ 2) of
// every width but 3 bits.
func pairsAVX2(bits, bpg int) bool { return bits != 3 && bpg >= 2 }

// dotQ8Asm is the assembly dispatch of DotQ8Rows and DotQ8Matrix, its
// arguments checked by the caller: rows consecutive packed rows from src
// (with their scales and zeros) against activation row i, into y[r].
func dotQ8Asm(a *Q8Act, i int, src *byte, bits int, scales, zeros *uint16, ng, bpg int, zsym float32, y *float32, rows int) {
	k, nb := a.K, a.K/32
	s, sm := &a.S[i*nb], &a.Sum[i*nb]
	if usePairs && rows >= 2 && bpg >= pairsMinBPG && (hasVNNI || pairsAVX2(bits, bpg)) {
		// Rows r and r+p (p = rows/2) on the two-row kernels (the
		// one-row kernel's bits, two rows' FMA chains at once; two
		// sequential streams of rows), the last odd row on the one-row
		// kernel.
		p := rows / 2
		dotQ8Pairs(a, i, src, bits, scales, zeros, ng, bpg, zsym, y, p)
		if rows%2 == 0 {
			return
		}
		r := 2 * p
		src = (*byte)(unsafe.Add(unsafe.Pointer(src), r*ng*bpg*bits*4))
		scales = (*uint16)(unsafe.Add(unsafe.Pointer(scales), 2*r*ng))
		if zeros != nil {
			zeros = (*uint16)(unsafe.Add(unsafe.Pointer(zeros), 2*r*ng))
		}
		y = (*float32)(unsafe.Add(unsafe.Pointer(y), 4*r))
		rows = 1
	}
	if bits == 8 {
		if hasVNNI {
			dotQ8x8VNNI(&a.Q[i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
			return
		}
		// The AVX2 kernel takes the codes as c − 128 (signed): the
		// zero-point is shifted to match.
		dotQ8x8AVX2(&a.Q[i*k], s, sm, src, scales, zeros, ng, bpg, zsym-128, 128, y, rows)
		return
	}
	q := &a.perm[permOf(bits)][i*k]
	switch {
	case bits == 3 && hasVNNI:
		dotQ8x3VNNI(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
	case bits == 3:
		dotQ8x3AVX2(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
	case bits == 4 && hasVNNI:
		dotQ8x4VNNI(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
	case bits == 4:
		dotQ8x4AVX2(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
	case bits == 2 && hasVNNI:
		dotQ8x2VNNI(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
	case bits == 2:
		dotQ8x2AVX2(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
	case hasVNNI:
		dotQ8x1VNNI(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
	default:
		dotQ8x1AVX2(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows)
	}
}

// checkPrepared panics unless a is ready for the assembly on bits-bit
// codes (Prepare).
func (a *Q8Act) checkPrepared(bits int) {
	if bits != 8 && !a.ready[bits] {
		panicf("DotQ8Rows: activations not prepared for %d-bit codes (call Q8Act.Prepare)", bits)
	}
}

// DotQ8Matrix is DotQ8Rows for the rows consecutive packed rows of a
// weight: row r's codes are codes[r·rowBytes:], its scales
// scales[r·ng : (r+1)·ng] and zeros (nil when symmetric) likewise, ng =
// a.K/group, and its outputs go to y[i·ldy + r] for activation row i <
// a.M. The same sum and bounds as DotQ8Rows, with the argument checks
// done once for the whole matrix. In assembly, several activation rows
// run four at a time on the four-row kernels (each block of codes
// unpacked once for the four, weight rows in tiles of q8TileBytes), the
// last 1-3 on the one-row kernel; each output is bit for bit what the
// one-row kernel gives it alone (the same int32 block sums and float32
// operations in the same order), so a row's result does not depend on
// the rows batched with it. It panics (a programmer error) on a bad
// width or inconsistent lengths.
func DotQ8Matrix(y []float32, ldy int, a *Q8Act, codes []byte, rowBytes, rows int, bits int, scales, zeros []uint16, group int, zsym float32) {
	k := a.K
	if rows <= 0 {
		return
	}
	if group <= 0 || k%group != 0 || group%a.Block != 0 || (bits != 8 && (bits < 1 || bits > 4)) || rowBytes < (k*bits+7)/8 {
		panicf("DotQ8Matrix: %d-bit rows of %d bytes, group %d, %d columns, activation block %d", bits, rowBytes, group, k, a.Block)
	}
	ng := k / group
	if len(codes) < (rows-1)*rowBytes+(k*bits+7)/8 || len(scales) < rows*ng || (zeros != nil && len(zeros) < rows*ng) || (a.M > 0 && len(y) < (a.M-1)*ldy+rows) {
		panicf("DotQ8Matrix: %d code bytes, %d scales, %d zeros, %d outputs for %d rows of %d groups", len(codes), len(scales), len(zeros), len(y), rows, ng)
	}
	if a.M == 0 || ng == 0 {
		return
	}
	if !Q8Asm(bits, a.Block) {
		for r := 0; r < rows; r++ {
			var zs []uint16
			if zeros != nil {
				zs = zeros[r*ng : (r+1)*ng]
			}
			dotQ8RowsGo(y[r:], ldy, a, codes[r*rowBytes:], bits, scales[r*ng:(r+1)*ng], zs, group, zsym)
		}
		return
	}
	a.checkPrepared(bits)
	dotQ8MatrixAsm(y, ldy, a, codes, rowBytes, rows, bits, scales, zeros, ng, group, zsym)
}

// permOf is the width whose activation order (Q8Act.Prepare) the
// assembly kernels of bits-bit codes take: 3-bit blocks begin with a
// 2-bit plane.
func permOf(bits int) int {
	if bits == 3 {
		return 2
	}
	return bits
}

// dotQ8MatrixAsm is DotQ8Matrix's assembly path (and DotQ8MatrixU3's,
// bits 3), its arguments checked and a prepared.
func dotQ8MatrixAsm(y []float32, ldy int, a *Q8Act, codes []byte, rowBytes, rows, bits int, scales, zeros []uint16, ng, group int, zsym float32) {
	k := a.K
	var zp *uint16
	if zeros != nil {
		zp = &zeros[0]
	}
	bpg := group / 32
	if a.M == 1 && rowBytes == k*bits/8 {
		// One activation row and contiguous packed rows: one kernel
		// call streams the whole matrix.
		dotQ8Asm(a, 0, &codes[0], bits, &scales[0], zp, ng, bpg, zsym, &y[0], rows)
		return
	}
	// Several activation rows: tiles of packed rows small enough to stay
	// in cache, each tile streamed against four activation rows at a
	// time (the four-row kernel unpacks every block of codes once for
	// them, and their Q stays in L1), the last 1-3 rows by the one-row
	// kernel. Both give every output bit for bit the value it gets alone.
	contiguous := rowBytes == k*bits/8
	tile := max(1, q8TileBytes/rowBytes)
	for r0 := 0; r0 < rows; r0 += tile {
		n := min(tile, rows-r0)
		step := n // packed rows per kernel call
		if !contiguous {
			step = 1
		}
		for r := r0; r < r0+n; r += step {
			if zeros != nil {
				zp = &zeros[r*ng]
			}
			i := 0
			for ; i+4 <= a.M; i += 4 {
				dotQ8Asm4(a, i, &codes[r*rowBytes], bits, &scales[r*ng], zp, ng, bpg, zsym, &y[i*ldy+r], step, ldy)
			}
			for ; i < a.M; i++ {
				dotQ8Asm(a, i, &codes[r*rowBytes], bits, &scales[r*ng], zp, ng, bpg, zsym, &y[i*ldy+r], step)
			}
		}
	}
}

// q8TileBytes is the packed bytes of the weight tile DotQ8Matrix streams
// against every four activation rows in turn: small enough for L2 (a
// variable for the tests).
var q8TileBytes = 64 << 10

// dotQ8Asm4 is dotQ8Asm for the four activation rows i..i+3 at once (the
// four-row kernels): rows consecutive packed rows, results of activation
// row i+t at y[t·ldy + r].
func dotQ8Asm4(a *Q8Act, i int, src *byte, bits int, scales, zeros *uint16, ng, bpg int, zsym float32, y *float32, rows, ldy int) {
	k, nb := a.K, a.K/32
	s, sm := &a.S[i*nb], &a.Sum[i*nb]
	ss, ys := nb*4, ldy*4
	if bits == 8 {
		if hasVNNI {
			dotQ8x8m4VNNI(&a.Q[i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
			return
		}
		dotQ8x8m4AVX2(&a.Q[i*k], s, sm, src, scales, zeros, ng, bpg, zsym-128, 128, y, rows, k, ss, ys)
		return
	}
	q := &a.perm[permOf(bits)][i*k]
	switch {
	case bits == 3 && hasVNNI:
		dotQ8x3m4VNNI(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
	case bits == 3:
		dotQ8x3m4AVX2(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
	case bits == 4 && hasVNNI:
		dotQ8x4m4VNNI(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
	case bits == 4:
		dotQ8x4m4AVX2(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
	case bits == 2 && hasVNNI:
		dotQ8x2m4VNNI(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
	case bits == 2:
		dotQ8x2m4AVX2(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
	case hasVNNI:
		dotQ8x1m4VNNI(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
	default:
		dotQ8x1m4AVX2(q, s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, rows, k, ss, ys)
	}
}

// dotQ8RowsGo is DotQ8Rows' portable loop: per block an int32 Σ c·Q, per
// group the float32 scaling.
func dotQ8RowsGo(y []float32, ldy int, a *Q8Act, src []byte, bits int, scales, zeros []uint16, group int, zsym float32) {
	k, blk := a.K, a.Block
	nb, ng, bpg := k/blk, k/group, group/blk
	mask := uint16(1)<<uint(bits) - 1
	for i := 0; i < a.M; i++ {
		q := a.Q[i*k : (i+1)*k]
		s, sm := a.S[i*nb:(i+1)*nb], a.Sum[i*nb:(i+1)*nb]
		var total float32
		for g := 0; g < ng; g++ {
			z := zsym
			if zeros != nil {
				z = f16ToF32(zeros[g])
			}
			var acc, zacc float32
			for b := g * bpg; b < (g+1)*bpg; b++ {
				var dot int32
				j0 := b * blk
				switch bits {
				case 8:
					for j, c := range src[j0 : j0+blk] {
						dot += int32(c) * int32(q[j0+j])
					}
				case 4:
					for j := j0; j < j0+blk; j++ {
						dot += int32(src[j>>1]>>(4*uint(j&1))&15) * int32(q[j])
					}
				default:
					for j := j0; j < j0+blk; j++ {
						p := j * bits
						bi, off := p>>3, uint(p&7)
						v := uint16(src[bi])
						if off+uint(bits) > 8 {
							v |= uint16(src[bi+1]) << 8
						}
						dot += int32(v>>off&mask) * int32(q[j])
					}
				}
				acc += s[b] * float32(dot)
				zacc += sm[b]
			}
			total += f16ToF32(scales[g]) * (acc - z*zacc)
		}
		y[i*ldy] = total
	}
}
