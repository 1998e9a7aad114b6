//go:build !purego

package kernels

import "golang.org/x/sys/cpu"

// hasVNNI reports whether the CPU and OS support the AVX-512 VNNI
// instructions on 256-bit registers (AVX512VNNI with AVX512VL) that the
// one-row VNNI kernels use, and the 512-bit byte instructions (AVX512BW)
// of the four-row ones.
var hasVNNI = cpu.X86.HasAVX512VNNI && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512BW && hasAsm

// Integer dot kernels of DotQ8Rows (qdot8_amd64.s): y[r] = Σ_g s_g·Σ_b
// (xs_b·Σ c·q − (z_g − zoff)·xsum_b) over ng groups of bpg blocks of 32
// codes, for rows consecutive packed rows against one activation row
// (zoff: the 8-bit AVX2 kernel only).

//go:noescape
func dotQ8x8AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

//go:noescape
func dotQ8x8VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

//go:noescape
func dotQ8x4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

//go:noescape
func dotQ8x4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

//go:noescape
func dotQ8x2AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

//go:noescape
func dotQ8x2VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

//go:noescape
func dotQ8x1AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

//go:noescape
func dotQ8x1VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

// 3-bit kernels on SplitU3's blocks of 12 bytes (qdot8u3.go).

//go:noescape
func dotQ8x3AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

//go:noescape
func dotQ8x3VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int)

// Two-row VNNI kernels (qdot8p_amd64.s): the VNNI one-row kernel of the
// same width on the rows pairs of packed rows r and r+dist (r < rows ≤
// dist; results y[r], y[r+dist]), each result bit for bit the one-row
// kernel's, the two rows in the halves of Z registers (AVX-512F with
// VNNI).

//go:noescape
func dotQ8x8p2VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

//go:noescape
func dotQ8x4p2VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

//go:noescape
func dotQ8x2p2VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

//go:noescape
func dotQ8x1p2VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

//go:noescape
func dotQ8x3p2VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

// Four-row kernels of DotQ8Matrix (qdot8m_amd64.s): the one-row kernel
// of the same width for activation rows i < 4 at once, row i's
// activations at xq + i·xstride, xs + i·sstride, xsum + i·sstride
// (bytes), its results at y + i·ystride (bytes) + 4r for packed row r.

//go:noescape
func dotQ8x8m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x8m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x4m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x4m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x2m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x2m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x1m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x1m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x3m4AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

//go:noescape
func dotQ8x3m4VNNI(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows int, xstride, sstride, ystride int)

// quantActQ8x32 is QuantizeActQ8 on nb consecutive blocks of 32 values of
// one row, x [nb·32] into q [nb·32], s and sum [nb] (qdot8act_amd64.s,
// AVX2), bit for bit the Go loop's; it returns the number of blocks it
// left to the Go loop (a max|x| not finite or below 2^−119).
//
//go:noescape
func quantActQ8x32(x *float32, q *int8, s, sum *float32, nb int) (bad int)

// Two-row AVX2 kernels of the one-row kernels' group path (bpg ≥ 2) for
// CPUs without VNNI (qdot8_amd64.s, internal/asmgen pairAVX2Kernel):
// rows and dist as the VNNI two-row kernels', every result the one-row
// AVX2 kernel's bits (8 bits: codes taken as c − 128, zsym and zoff as
// dotQ8Asm passes them to dotQ8x8AVX2).

//go:noescape
func dotQ8x8p2AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

//go:noescape
func dotQ8x4p2AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

//go:noescape
func dotQ8x2p2AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

//go:noescape
func dotQ8x1p2AVX2(xq *int8, xs, xsum *float32, src *byte, scales, zeros *uint16, ng, bpg int, zsym, zoff float32, y *float32, rows, dist int)

// dotQ8Pairs runs the two-row kernel of the width on the packed rows r
// and r+pairs for r < pairs (dotQ8Asm's arguments): the VNNI kernels
// where the CPU has them, otherwise the AVX2 ones (not 3 bits, bpg ≥ 2
// only: pairsAVX2).
func dotQ8Pairs(a *Q8Act, i int, src *byte, bits int, scales, zeros *uint16, ng, bpg int, zsym float32, y *float32, pairs int) {
	k, nb := a.K, a.K/32
	s, sm := &a.S[i*nb], &a.Sum[i*nb]
	if !hasVNNI {
		switch bits {
		case 8:
			dotQ8x8p2AVX2(&a.Q[i*k], s, sm, src, scales, zeros, ng, bpg, zsym-128, 128, y, pairs, pairs)
		case 4:
			dotQ8x4p2AVX2(&a.perm[4][i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, pairs, pairs)
		case 2:
			dotQ8x2p2AVX2(&a.perm[2][i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, pairs, pairs)
		default:
			dotQ8x1p2AVX2(&a.perm[1][i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, pairs, pairs)
		}
		return
	}
	switch bits {
	case 8:
		dotQ8x8p2VNNI(&a.Q[i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, pairs, pairs)
	case 4:
		dotQ8x4p2VNNI(&a.perm[4][i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, pairs, pairs)
	case 2:
		dotQ8x2p2VNNI(&a.perm[2][i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, pairs, pairs)
	case 3:
		dotQ8x3p2VNNI(&a.perm[2][i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, pairs, pairs)
	default:
		dotQ8x1p2VNNI(&a.perm[1][i*k], s, sm, src, scales, zeros, ng, bpg, zsym, 0, y, pairs, pairs)
	}
}
