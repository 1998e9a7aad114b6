package kernels

import "math"

// DequantU4 dequantizes 4-bit codes: for j < len(dst),
//
//	dst[j] = (float32(c_j) − zero) · scale
//
// where c_j is code j of src packed two per byte, low nibble first (the
// LSB-first layout of docs/QUANT.md), so src holds at least len(dst)/2
// bytes and len(dst) is even. The subtraction and the product are float32
// operations, so when zero is an integer and scale a float16 value (as in
// lmpack-wq checkpoints) both are exact and dst[j] equals
// float32(float64(scale)·(float64(c_j) − float64(zero))). The AVX2 path
// converts 16 codes per step. It panics (a programmer error) if len(dst)
// is odd or src is short.
func DequantU4(dst []float32, src []byte, scale, zero float32) {
	n := len(dst)
	if n%2 != 0 {
		panicf("DequantU4: len(dst)=%d is odd", n)
	}
	if len(src) < n/2 {
		panicf("DequantU4: len(src)=%d < %d bytes for %d codes", len(src), n/2, n)
	}
	j := 0
	if useAsm && n >= 16 {
		j = n &^ 15
		dequantU4AVX2(&dst[0], &src[0], j, scale, zero)
	}
	for ; j < n; j += 2 {
		b := src[j/2]
		dst[j] = (float32(b&15) - zero) * scale
		dst[j+1] = (float32(b>>4) - zero) * scale
	}
}

// DequantU4Row dequantizes one packed row of len(dst) 4-bit codes in
// groups of group consecutive codes: for code j in group g = j/group,
//
//	dst[j] = (float32(c_j) − z_g) · s_g
//
// with s_g the float16 value scales[g] and z_g the float16 value zeros[g],
// or zsym for every group when zeros is nil (a symmetric grid). src holds
// the codes as in DequantU4. scales (and zeros) hold len(dst)/group
// entries; group must divide len(dst) and be even. For integer zero-points
// the result equals float32(float64(s_g)·(float64(c_j) − float64(z_g)))
// (see DequantU4). With AVX2 and F16C, groups that are a multiple of 16
// codes run in one assembly loop over the row. It panics (a programmer
// error) on inconsistent lengths.
func DequantU4Row(dst []float32, src []byte, scales, zeros []uint16, group int, zsym float32) {
	n := len(dst)
	if group <= 0 || group%2 != 0 || n%group != 0 {
		panicf("DequantU4Row: group %d for %d codes, want an even divisor", group, n)
	}
	ng := n / group
	if len(scales) < ng || (zeros != nil && len(zeros) < ng) || len(src) < n/2 {
		panicf("DequantU4Row: %d scales, %d zeros, %d bytes for %d groups of %d codes", len(scales), len(zeros), len(src), ng, group)
	}
	if ng == 0 {
		return
	}
	if useAsm && hasF16C && group%16 == 0 {
		var zp *uint16
		if zeros != nil {
			zp = &zeros[0]
		}
		dequantU4RowAVX2(&dst[0], &src[0], &scales[0], zp, ng, group, zsym)
		return
	}
	for g := 0; g < ng; g++ {
		z := zsym
		if zeros != nil {
			z = f16ToF32(zeros[g])
		}
		DequantU4(dst[g*group:(g+1)*group], src[g*group/2:], f16ToF32(scales[g]), z)
	}
}

// f16ToF32 returns the float32 value of the IEEE binary16 bits h (exact).
func f16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // Inf, NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: mant·2^−24, exact in float32.
	v := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		v = -v
	}
	return v
}
