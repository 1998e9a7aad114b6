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

// DequantBitsRow is DequantU4Row for codes of bits = 1, 2, 3 or 4 bits:
// code j of the row is bits [j·bits, (j+1)·bits) of the little-endian bit
// stream src (least significant bit first; docs/QUANT.md), so src holds
// at least ceil(len(dst)·bits/8) bytes, and
//
//	dst[j] = (float32(c_j) − z_g) · s_g,  g = j/group,
//
// with s_g, z_g the float16 values scales[g], zeros[g] (zsym when zeros is
// nil). The float32 arithmetic is exact, and equals the float64 formula,
// when the zero-points are integers. With AVX2 and F16C, groups that are
// a multiple of 8 codes run in one assembly loop that extracts eight codes
// per step with variable shifts; it reads up to 3 bytes past the row when
// src's capacity allows, else the last group runs in Go. It panics (a
// programmer error) on a bad width or inconsistent lengths.
func DequantBitsRow(dst []float32, src []byte, bits int, scales, zeros []uint16, group int, zsym float32) {
	n := len(dst)
	if bits < 1 || bits > 4 {
		panicf("DequantBitsRow: bits %d, want 1 to 4", bits)
	}
	if group <= 0 || n%group != 0 {
		panicf("DequantBitsRow: group %d for %d codes, want a divisor", group, n)
	}
	ng := n / group
	need := (n*bits + 7) / 8
	if len(scales) < ng || (zeros != nil && len(zeros) < ng) || len(src) < need {
		panicf("DequantBitsRow: %d scales, %d zeros, %d bytes for %d groups of %d codes of %d bits", len(scales), len(zeros), len(src), ng, group, bits)
	}
	g0 := 0
	if useAsm && hasF16C && group%8 == 0 && ng > 0 {
		asmGroups := ng
		if cap(src) < need+3 {
			asmGroups = ng - 1
		}
		if asmGroups > 0 {
			var zp *uint16
			if zeros != nil {
				zp = &zeros[0]
			}
			dequantBitsRowAVX2(&dst[0], &src[0], &scales[0], zp, asmGroups, group, bits, &shiftTable[bits][0], zsym, uint32(1)<<uint(bits)-1)
		}
		g0 = asmGroups
	}
	mask := uint16(1)<<uint(bits) - 1
	for g := g0; g < ng; g++ {
		s, z := f16ToF32(scales[g]), zsym
		if zeros != nil {
			z = f16ToF32(zeros[g])
		}
		for j := g * group; j < (g+1)*group; j++ {
			p := j * bits
			b, off := p>>3, uint(p&7)
			v := uint16(src[b])
			if off+uint(bits) > 8 {
				v |= uint16(src[b+1]) << 8
			}
			dst[j] = (float32(v>>off&mask) - z) * s
		}
	}
}

// shiftTable[b] holds the shifts 0, b, 2b, …, 7b that bring codes 0..7 of
// a b-bit stream word to bit 0.
var shiftTable = func() (t [5][8]int32) {
	for b := range t {
		for i := range t[b] {
			t[b][i] = int32(i * b)
		}
	}
	return t
}()
