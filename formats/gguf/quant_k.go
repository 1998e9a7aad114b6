package gguf

import (
	"math"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// The k-quants Q4_K and Q6_K: 256-element super-blocks (ggml-common.h
// block_q4_K, block_q6_K) and llama.cpp's reference quantizers
// (ggml-quants.c quantize_row_q4_K_ref with make_qkx2_quants,
// quantize_row_q6_K_ref with make_qx_quants), which choose each sub-block's
// scale (and min) by a small weighted least-squares search. The code
// follows those functions step by step in float32, in ggml's order of
// operations: the search statistics are float32 sums here, against the
// house rule of float64 accumulation, because the reference quantizer's
// output is what llama-quantize writes, and matching it makes our Q4_K and
// Q6_K blocks byte-identical to llama.cpp's (TestAgainstGGML checks this
// against node-llama-cpp's libggml-base.so). Products are converted to
// float32 explicitly so that no compiler fuses them into FMAs (ggml's
// build does not either).

// nearestInt rounds to the nearest integer, ties to even: ggml-quants.c
// nearest_int (which adds 1.5·2^23 in float32).
func nearestInt(v float32) int { return int(math.RoundToEven(float64(v))) }

// makeQKX2 is ggml-quants.c make_qkx2_quants with use_mad = false: codes
// L[i] ∈ [0, nmax] and (scale, min) with x ≈ scale·L − min, minimising the
// weighted squared error over nstep+1 trial grids iscale =
// (nmax + rmin + rdelta·is)/(max − mn), codes round(iscale·(x − mn)), each
// refined by the weighted least-squares fit of scale and offset (offset
// clamped to ≤ 0); mn starts at min(min x, 0) and follows the best fit. It
// returns scale ≥ 0 and the_min = −offset ≥ 0. laux is scratch of len(x).
func makeQKX2(nmax int, x, w []float32, L, laux []uint8, rmin, rdelta float32, nstep int) (scale, theMin float32) {
	lo, hi := x[0], x[0]
	var sumW, sumX float32
	for i, v := range x {
		lo, hi = min(lo, v), max(hi, v)
		sumW += w[i]
		sumX += float32(w[i] * v)
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		clear(L[:len(x)])
		return 0, -lo
	}
	fmax := float32(nmax)
	iscale := fmax / (hi - lo)
	scale = 1 / iscale
	var bestErr float32
	for i, v := range x {
		l := min(nmax, max(0, nearestInt(iscale*(v-lo))))
		L[i] = uint8(l)
		diff := float32(scale*float32(l)) + lo - v
		bestErr += float32(w[i] * diff * diff)
	}
	// As in ggml, each trial grid starts from the current best offset mn
	// (which an accepted fit moves), not from the block minimum.
	mn := lo
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + fmax) / (hi - mn)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := min(nmax, max(0, nearestInt(iscale*(v-mn))))
			laux[i] = uint8(l)
			fl := float32(l)
			sumL += float32(w[i] * fl)
			sumL2 += float32(w[i] * fl * fl)
			sumXL += float32(w[i] * fl * v)
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D <= 0 {
			continue
		}
		thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
		thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
		if thisMin > 0 {
			thisMin = 0
			thisScale = sumXL / sumL2
		}
		var cur float32
		for i, v := range x {
			diff := float32(thisScale*float32(laux[i])) + thisMin - v
			cur += float32(w[i] * diff * diff)
		}
		if cur < bestErr {
			copy(L[:len(x)], laux[:len(x)])
			bestErr, scale, mn = cur, thisScale, thisMin
		}
	}
	return scale, -mn
}

// scaleMinK4 is ggml-quants.c get_scale_min_k4: the 6-bit scale and min of
// sub-block j (0..7) from the 12 packed bytes q. Sub-blocks 0–3 keep their
// scale in the low 6 bits of q[j] and their min in the low 6 bits of
// q[j+4]; sub-blocks 4–7 keep the low 4 bits of scale and min in the low
// and high nibble of q[j+4] and the top 2 bits in the top 2 bits of q[j−4]
// (scale) and q[j] (min).
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// putScaleMinK4 is the inverse of scaleMinK4 for all eight sub-blocks
// (sc, m ≤ 63), as quantize_row_q4_K_ref packs them.
func putScaleMinK4(q []byte, sc, m *[8]uint8) {
	clear(q[:12])
	for j := 0; j < 8; j++ {
		if j < 4 {
			q[j] = sc[j]
			q[j+4] = m[j]
		} else {
			q[j+4] = sc[j]&0xf | (m[j]&0xf)<<4
			q[j-4] |= (sc[j] >> 4) << 6
			q[j] |= (m[j] >> 4) << 6
		}
	}
}

// quantizeQ4K is quantize_row_q4_K_ref for one super-block of 256: each
// sub-block of 32 gets (scale, min) from makeQKX2 (nmax 15, weights
// rms(sub-block) + |x|, rmin −1, rdelta 0.1, 20 steps); the eight scales
// and mins are quantized to 6 bits against d = max scale/63 and dmin = max
// min/63, and the codes are recomputed with those quantized values.
// Layout: d [0:2], dmin [2:4], scales [4:16], qs [16:144].
func quantizeQ4K(dst []byte, x []float32) error {
	var L [QK_K]uint8
	var laux [32]uint8
	var w [32]float32
	var scales, mins [8]float32
	var maxScale, maxMin float32
	for j := 0; j < 8; j++ {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		av := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			w[l] = av + float32(math.Abs(float64(v)))
		}
		scales[j], mins[j] = makeQKX2(15, xs, w[:], L[32*j:], laux[:], -1, 0.1, 20)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	var ls, lm [8]uint8
	for j := 0; j < 8; j++ {
		ls[j] = uint8(min(63, max(0, nearestInt(invScale*scales[j]))))
		lm[j] = uint8(min(63, max(0, nearestInt(invMin*mins[j]))))
	}
	putScaleMinK4(dst[4:16], &ls, &lm)
	hd, err := scaleHalf("super-block scale d", maxScale/63)
	if err != nil {
		return err
	}
	hm, err := scaleHalf("super-block min scale dmin", maxMin/63)
	if err != nil {
		return err
	}
	putHalf(dst, hd)
	putHalf(dst[2:], hm)
	d0, m0 := safetensors.F16ToFloat32(hd), safetensors.F16ToFloat32(hm)
	for j := 0; j < 8; j++ {
		sc, m := scaleMinK4(j, dst[4:16])
		d := d0 * float32(sc)
		if d == 0 {
			continue // ggml keeps make_qkx2_quants's codes; they decode to −dm either way
		}
		dm := m0 * float32(m)
		for i := 32 * j; i < 32*j+32; i++ {
			L[i] = uint8(min(15, max(0, nearestInt((x[i]+dm)/d))))
		}
	}
	qs := dst[16:144]
	for c := 0; c < 4; c++ {
		for l := 0; l < 32; l++ {
			qs[32*c+l] = L[64*c+l] | L[64*c+l+32]<<4
		}
	}
	return nil
}

// dequantizeQ4K is dequantize_row_q4_K for one super-block.
func dequantizeQ4K(dst []float32, b []byte) {
	d, dmin := half(b), half(b[2:])
	sc := b[4:16]
	qs := b[16:144]
	for c := 0; c < 4; c++ {
		s1, m1 := scaleMinK4(2*c, sc)
		s2, m2 := scaleMinK4(2*c+1, sc)
		d1, dm1 := d*float32(s1), dmin*float32(m1)
		d2, dm2 := d*float32(s2), dmin*float32(m2)
		q := qs[32*c : 32*c+32]
		y := dst[64*c : 64*c+64]
		for l := 0; l < 32; l++ {
			y[l] = d1*float32(q[l]&0xf) - dm1
			y[l+32] = d2*float32(q[l]>>4) - dm2
		}
	}
}

// groupMaxEps is ggml-quants.c GROUP_MAX_EPS: sub-blocks with max|x| below
// it are all-zero.
const groupMaxEps = 1e-15

// makeQX is ggml-quants.c make_qx_quants with rmse_type 1 and no
// importance weights: signed codes l ∈ [−nmax, nmax−1] stored as
// L[i] = l + nmax, and the scale minimising Σ x²·(x − scale·l)² over the
// grids iscale = −(nmax + 0.1·is)/m, is = −9..9, m the element of largest
// magnitude. The returned scale is negative when m > 0 (ggml's sign
// convention).
func makeQX(nmax int, x []float32, L []uint8) float32 {
	var mx, amax float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); a > amax {
			amax, mx = a, v
		}
	}
	if amax < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	fmax := float32(nmax)
	sums := func(iscale float32, store bool) (sumLX, sumL2 float32) {
		for i, v := range x {
			l := min(nmax-1, max(-nmax, nearestInt(iscale*v)))
			if store {
				L[i] = uint8(l + nmax)
			}
			w := v * v
			fl := float32(l)
			sumLX += float32(w * v * fl)
			sumL2 += float32(w * fl * fl)
		}
		return
	}
	sumLX, sumL2 := sums(-fmax/mx, true)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale := -(fmax + float32(0.1*float32(is))) / mx
		lx, l2 := sums(iscale, false)
		if l2 > 0 && float32(lx*lx) > float32(best*l2) {
			sums(iscale, true)
			scale = lx / l2
			best = scale * lx
		}
	}
	return scale
}

// quantizeQ6K is quantize_row_q6_K_ref for one super-block of 256: each
// sub-block of 16 gets a scale from makeQX (nmax 32); the 16 scales are
// quantized to int8 against d = −s/128, s the scale of largest magnitude,
// and the 6-bit codes recomputed with the quantized scales.
// Layout: ql [0:128], qh [128:192], scales [192:208], d [208:210]; see
// q6KIndex.
func quantizeQ6K(dst []byte, x []float32) error {
	var L [QK_K]uint8
	var scales [16]float32
	var maxScale, maxAbs float32
	for ib := 0; ib < 16; ib++ {
		s := makeQX(32, x[16*ib:16*ib+16], L[16*ib:])
		scales[ib] = s
		if a := float32(math.Abs(float64(s))); a > maxAbs {
			maxAbs, maxScale = a, s
		}
	}
	clear(dst[:210])
	if maxAbs < groupMaxEps {
		return nil // all-zero block, d = 0
	}
	iscale := -128 / maxScale
	hd, err := scaleHalf("super-block scale d", 1/iscale)
	if err != nil {
		return err
	}
	putHalf(dst[208:], hd)
	sc := dst[192:208]
	for ib := 0; ib < 16; ib++ {
		sc[ib] = byte(int8(min(127, max(-128, nearestInt(iscale*scales[ib])))))
	}
	d0 := safetensors.F16ToFloat32(hd)
	for j := 0; j < 16; j++ {
		d := d0 * float32(int8(sc[j]))
		if d == 0 {
			continue // ggml keeps make_qx_quants's codes; they decode to 0 either way
		}
		for i := 16 * j; i < 16*j+16; i++ {
			L[i] = uint8(min(31, max(-32, nearestInt(x[i]/d))) + 32)
		}
	}
	ql, qh := dst[0:128], dst[128:192]
	for h := 0; h < 2; h++ {
		Lh := L[128*h:]
		qlh, qhh := ql[64*h:], qh[32*h:]
		for l := 0; l < 32; l++ {
			qlh[l] = Lh[l]&0xf | (Lh[l+64]&0xf)<<4
			qlh[l+32] = Lh[l+32]&0xf | (Lh[l+96]&0xf)<<4
			qhh[l] = Lh[l]>>4 | (Lh[l+32]>>4)<<2 | (Lh[l+64]>>4)<<4 | (Lh[l+96]>>4)<<6
		}
	}
	return nil
}

// q6KIndex gives where element i (0..255) of a Q6_K super-block keeps its
// bits, as dequantize_row_q6_K reads them: with h = i/128, r = i%128,
// l = r%32 and quarter k = r/32, the low 4 bits are in ql[64h + l + 32·(k&1)]
// (low nibble for k < 2, high nibble for k ≥ 2), the high 2 bits are bits
// 2k, 2k+1 of qh[32h + l], and its scale is scales[i/16].
func q6KIndex(i int) (qlByte int, qlHigh bool, qhByte int, qhShift uint) {
	h, r := i/128, i%128
	l, k := r%32, r/32
	return 64*h + l + 32*(k&1), k >= 2, 32*h + l, uint(2 * k)
}

// dequantizeQ6K is dequantize_row_q6_K for one super-block.
func dequantizeQ6K(dst []float32, b []byte) {
	ql, qh, sc := b[0:128], b[128:192], b[192:208]
	d := half(b[208:])
	for h := 0; h < 2; h++ {
		qlh, qhh, sch := ql[64*h:], qh[32*h:], sc[8*h:]
		y := dst[128*h:]
		for l := 0; l < 32; l++ {
			is := l / 16
			q1 := int(qlh[l]&0xf|(qhh[l]&3)<<4) - 32
			q2 := int(qlh[l+32]&0xf|(qhh[l]>>2&3)<<4) - 32
			q3 := int(qlh[l]>>4|(qhh[l]>>4&3)<<4) - 32
			q4 := int(qlh[l+32]>>4|(qhh[l]>>6&3)<<4) - 32
			y[l] = d * float32(int8(sch[is])) * float32(q1)
			y[l+32] = d * float32(int8(sch[is+2])) * float32(q2)
			y[l+64] = d * float32(int8(sch[is+4])) * float32(q3)
			y[l+96] = d * float32(int8(sch[is+6])) * float32(q4)
		}
	}
}
