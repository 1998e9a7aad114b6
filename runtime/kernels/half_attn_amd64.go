//go:build !purego

package kernels

// halfScoresAVX2 writes s[j] = Σ_{d<hd} q[d]·k[j·ldk + d] for j < n, k
// binary16 bits (half_attn_amd64.s): four rows of k at a time, each in
// one 8-lane accumulator over the 8-wide d steps in order, then
// ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). n ≥ 1, hd ≥ 8 a multiple of 8;
// needs AVX2, FMA and F16C.
//
//go:noescape
func halfScoresAVX2(q *float32, k *uint16, ldk, n, hd int, s *float32)

// halfAccumAVX2 adds Σ_{j<n} p[j]·v[j·ldv + d] to out[d] for d < hd, v
// binary16 bits (half_attn_amd64.s): 64 columns of out at a time (then 8)
// held in registers over the n rows, one fused multiply-add per row in
// order of j. n ≥ 1, hd ≥ 8 a multiple of 8; needs AVX2, FMA and F16C.
//
//go:noescape
func halfAccumAVX2(p *float32, v *uint16, ldv, n, hd int, out *float32)

// halfScores4AVX2 is halfScoresAVX2 for four query rows q + i·ldq into
// s + i·lds (i < 4), each chunk of k widened once for the four; the same
// bits as four halfScoresAVX2 calls. n ≥ 2 even, hd ≥ 8 a multiple of 8.
//
//go:noescape
func halfScores4AVX2(q *float32, ldq int, k *uint16, ldk, n, hd int, s *float32, lds int)

// halfAccum4AVX2 is halfAccumAVX2 for four rows p + i·ldp into out +
// i·ldo (i < 4), each chunk of v widened once for the four; the same bits
// as four halfAccumAVX2 calls. n ≥ 1, hd ≥ 16 a multiple of 16.
//
//go:noescape
func halfAccum4AVX2(p *float32, ldp int, v *uint16, ldv, n, hd int, out *float32, ldo int)
