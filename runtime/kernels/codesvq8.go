package kernels

import "math"

// CodeAccumQ8 is CodeAccumF16 with the row weights w_j = p_j·s_j rounded
// to int8, so that the products with the codes are exact integer dot
// products over four rows at a time (AVX-512 VNNI VPDPBUSD, the rows'
// code bytes transposed by VBMI VPERMB): for each block of 16 rows B,
// δ_B = max_{j∈B} |w_j| / 127 and w̃_j = δ_B·round(w_j/δ_B) (nearest
// even), and
//
//	acc[c] += Σ_j w̃_j·(code_jc − z_j)
//
// the value side of attention with each weight moved by at most δ_B/2:
// |Σ_j (w̃_j − w_j)(code_jc − z_j)| ≤ Σ_B (δ_B/2)·Σ_{j∈B} |code_jc − z_j|,
// plus float32 rounding of the block sums (TestCodeAccumQ8), for blocks
// whose largest |w_j| is at least 1e-30 (below it the scale is taken as
// 1e-30/127). A NaN or infinite weight makes every output NaN, as the
// float kernels' sums do. As
// llama.cpp rounds the query for quantised keys, this rounds the softmax
// weights for quantised values; the error is of the order of 1/254 of
// each block's largest weight, far below the 2-bit codes' own.
//
// acc ([hd] float32), p ([n]), params ([n, 2] fp16 scale, zero), codes
// (row j at codes[j·rb:]), bits, rb and n are as CodeAccumF16 takes
// them; tmp is at least hd floats of scratch. With CodeAccumQ8Fast(hd,
// bits, rb) whole blocks of 16 rows run in assembly and the n%16 rows
// left by CodeAccumF16 (AVX-512) or CodeAxpy (AVX2), unrounded;
// otherwise every block runs in Go with the same rounding. It panics as
// CodeAccumF16 does.
func CodeAccumQ8(acc, p []float32, params []uint16, codes []byte, bits, rb, n int, tmp []float32) {
	hd := len(acc)
	checkCodes("CodeAccumQ8", hd, bits, n, rb, len(codes))
	if bits == CodeS8 {
		panicf("CodeAccumQ8: signed codes")
	}
	if n <= 0 {
		return
	}
	p, params = p[:n], params[:2*n]
	n16 := n / 16
	if CodeAccumQ8Fast(hd, bits, rb) && n16 > 0 {
		tmp = tmp[:hd]
		var cz float32
		if !hasVBMI {
			codeAccumQ8b2AVX2(&tmp[0], &p[0], &params[0], &codes[0], n16, hd/64, rb, &q8vConsts, &cz)
		} else if hd == 64 {
			codeAccumQ8b2C1(&tmp[0], &p[0], &params[0], &codes[0], n16, &q8vConsts, &cz)
		} else {
			codeAccumQ8b2C2(&tmp[0], &p[0], &params[0], &codes[0], n16, &q8vConsts, &cz)
		}
		for c := 0; c < hd; c += 64 {
			addPlanes(acc[c:c+64], tmp[c:c+64], 2, cz)
		}
		j := 16 * n16
		if hasVBMI {
			CodeAccumF16(acc, p[j:], params[2*j:], codes[j*rb:], bits, rb, n-j, tmp)
		} else {
			codeAccumAxpy(acc, p[j:], params[2*j:], codes[j*rb:], bits, rb, tmp)
		}
		return
	}
	codeAccumQ8Go(acc, p, params, codes, bits, rb)
}

// codeAccumAxpy is CodeAccumF16 for the len(p) < 16 rows CodeAccumQ8's
// AVX2 path leaves (CodeAccumF16 is portable Go without AVX-512): w_j =
// p_j·s_j into tmp, acc += Σ_j w_j·code_j by CodeAxpy (AVX2), then
// acc −= Σ_j w_j·z_j. Unrounded weights, as CodeAccumF16's; the float32
// sums run in another order than the AVX-512 tail's.
func codeAccumAxpy(acc, p []float32, params []uint16, codes []byte, bits, rb int, tmp []float32) {
	if len(p) == 0 {
		return
	}
	w := tmp[:len(p)]
	var cz float32
	for j, pj := range p {
		w[j] = pj * F16.Widen(params[2*j])
		cz += w[j] * F16.Widen(params[2*j+1])
	}
	CodeAxpy(acc, w, codes, bits, rb, len(p))
	for c := range acc {
		acc[c] -= cz
	}
}

// CodeAccumQ8Fast reports whether CodeAccumQ8 runs in assembly for rows
// of hd codes of bits rb bytes apart: 2-bit codes, head_dim 64 or 128,
// rows stored contiguously (rb = hd/4), and AVX-512 VNNI and VBMI, or
// AVX2 with FMA and F16C (codesvq8avx2_amd64.s: the same int32 sums and
// float32 operations, so the same bits).
func CodeAccumQ8Fast(hd, bits, rb int) bool {
	return (hasVBMI || useAsm && hasQ8AVX2) && bits == 2 && (hd == 64 || hd == 128) && rb == hd/4
}

// codeAccumQ8Go is CodeAccumQ8 in Go: blocks of 16 rows (the last one
// shorter) with the rounding of the assembly; float32 sums per block.
func codeAccumQ8Go(acc, p []float32, params []uint16, codes []byte, bits, rb int) {
	n := len(p)
	hd := len(acc)
	var isum [512]int32
	is := isum[:]
	if hd > len(is) {
		is = make([]int32, hd)
	}
	is = is[:hd]
	var cz float32
	for b0 := 0; b0 < n; b0 += 16 {
		b1 := min(n, b0+16)
		var w [16]float32
		var m float32
		for j := b0; j < b1; j++ {
			w[j-b0] = p[j] * F16.Widen(params[2*j])
			m = max(m, abs32(w[j-b0]))
		}
		m = max(m, q8vTiny)
		inv, d := 127/m, m/127
		clear(is)
		for j := b0; j < b1; j++ {
			w8 := int32(max(-128, min(127, math.RoundToEven(float64(w[j-b0]*inv)))))
			cz += (d * float32(w8)) * F16.Widen(params[2*j+1])
			row := codes[j*rb:]
			for c := range is {
				is[c] += w8 * int32(rowCode(row, c, bits))
			}
		}
		for c := range acc {
			acc[c] += d * float32(is[c])
		}
	}
	for c := range acc {
		acc[c] -= cz
	}
}

// q8vTiny is the least block maximum CodeAccumQ8 divides by (an all-zero
// block gets weights 0).
const q8vTiny = 1e-30

// q8vConstTab is the layout of q8vConsts (byte offsets 0, 64, 128, 192,
// 256, 260, 264, 268, 272, 336, 400, 432: codesvq8_amd64.s and
// codesvq8avx2_amd64.s read them so).
type q8vConstTab struct {
	perm       [64]byte  // VPERMB: byte 4k+r ← byte 16r+k (four rows of 16 bytes)
	sIdx, zIdx [16]int32 // VPERMT2PS: scales (even), zeros (odd) of 16 rows
	mask2      [64]byte
	c127, tiny float32
	abs        uint32
	zero       float32
	perm2      [2][64]byte // VPERMT2B, rows of 32 bytes: chunk c byte 4k+r ← byte 32r+16c+k
	split      [8]int32    // AVX2 VPERMPS: [s0 z0 s1 z1 …] to scales then zeros
	pairs      [4][32]byte // AVX2 VPSHUFB: group g's weights, lane 0 (w8[4g], w8[4g+2]), lane 1 (w8[4g+1], w8[4g+3])
}

var q8vConsts = func() (t q8vConstTab) {
	for b := 0; b < 64; b++ {
		t.perm[b] = byte(16*(b%4) + b/4)
		t.mask2[b] = 3
	}
	for i := 0; i < 16; i++ {
		t.sIdx[i], t.zIdx[i] = int32(2*i), int32(2*i+1)
	}
	for c := 0; c < 2; c++ {
		for b := 0; b < 64; b++ {
			t.perm2[c][b] = byte(32*(b%4) + 16*c + b/4)
		}
	}
	t.c127, t.tiny, t.abs = 127, q8vTiny, 0x7fffffff
	t.split = [8]int32{0, 2, 4, 6, 1, 3, 5, 7}
	for g := 0; g < 4; g++ {
		for b := 0; b < 16; b += 2 {
			t.pairs[g][b], t.pairs[g][b+1] = byte(4*g), byte(4*g+2)
			t.pairs[g][16+b], t.pairs[g][17+b] = byte(4*g+1), byte(4*g+3)
		}
	}
	return
}()
