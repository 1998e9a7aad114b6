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
