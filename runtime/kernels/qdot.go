package kernels

// DotQRow returns the dot product of x [n] with one packed row of n
// quantized codes, dequantized on the fly and never written out:
//
//	Σ_g s_g · Σ_{j in group g} (float32(c_j) − z_g) · x[j]
//
// where code j is bits [j·bits, (j+1)·bits) of the LSB-first bit stream src
// (docs/QUANT.md; src holds at least ceil(n·bits/8) bytes), g = j/group,
// s_g is the float16 value scales[g] and z_g the float16 value zeros[g], or
// zsym for every group when zeros is nil (a symmetric grid). bits is 1 to
// 4, group divides n; scales (and zeros) hold n/group entries. Each
// group's inner sum is accumulated in float32 and scaled once by s_g into
// a float32 total, so the result is not bit-identical to dequantizing the
// row (DequantBitsRow) and calling Dot; it agrees with the float64 value
// to about (n/8 + n/group)·2^−24 of Σ|s_g·(c_j − z_g)·x[j]| (tests:
// qdot_test.go). With AVX2, FMA and F16C, 4-bit groups that are a
// multiple of 16 codes, and 1-3-bit groups that are a multiple of 8,
// run in one assembly loop over the row; the bit-stream loop reads up to 3
// bytes past the row when src's capacity allows, else its last group runs
// in Go. It reads each packed byte once: n·bits/8 bytes instead of the
// 4·n of a float32 row. It panics (a programmer error) on a bad width or
// inconsistent lengths.
func DotQRow(x []float32, src []byte, bits int, scales, zeros []uint16, group int, zsym float32) float32 {
	n := len(x)
	if bits < 1 || bits > 4 {
		panicf("DotQRow: bits %d, want 1 to 4", bits)
	}
	if group <= 0 || n%group != 0 {
		panicf("DotQRow: group %d for %d codes, want a divisor", group, n)
	}
	ng := n / group
	need := (n*bits + 7) / 8
	if len(scales) < ng || (zeros != nil && len(zeros) < ng) || len(src) < need {
		panicf("DotQRow: %d scales, %d zeros, %d bytes for %d groups of %d codes of %d bits", len(scales), len(zeros), len(src), ng, group, bits)
	}
	if ng == 0 {
		return 0
	}
	var zp *uint16
	if zeros != nil {
		zp = &zeros[0]
	}
	if useAsm && hasF16C && bits == 4 && group%16 == 0 {
		return dotU4RowAVX2(&x[0], &src[0], &scales[0], zp, ng, group, zsym)
	}
	var sum float32
	g0 := 0
	if useAsm && hasF16C && group%8 == 0 {
		asmGroups := ng
		if cap(src) < need+3 {
			asmGroups = ng - 1
		}
		if asmGroups > 0 {
			sum = dotBitsRowAVX2(&x[0], &src[0], &scales[0], zp, asmGroups, group, bits, &shiftTable[bits][0], zsym, uint32(1)<<uint(bits)-1)
		}
		g0 = asmGroups
	}
	return sum + dotQRowGo(x, src, bits, scales, zeros, group, zsym, g0, ng)
}

// dotQRowGo is DotQRow's portable loop over groups [g0, g1).
func dotQRowGo(x []float32, src []byte, bits int, scales, zeros []uint16, group int, zsym float32, g0, g1 int) float32 {
	mask := uint16(1)<<uint(bits) - 1
	var sum float32
	for g := g0; g < g1; g++ {
		z := zsym
		if zeros != nil {
			z = f16ToF32(zeros[g])
		}
		xs := x[g*group : (g+1)*group]
		var acc float32
		if bits == 4 && group%2 == 0 {
			b := src[g*group/2 : (g+1)*group/2]
			for i, v := range b {
				acc += (float32(v&15)-z)*xs[2*i] + (float32(v>>4)-z)*xs[2*i+1]
			}
		} else {
			for i, xv := range xs {
				p := (g*group + i) * bits
				bi, off := p>>3, uint(p&7)
				v := uint16(src[bi])
				if off+uint(bits) > 8 {
					v |= uint16(src[bi+1]) << 8
				}
				acc += (float32(v>>off&mask) - z) * xv
			}
		}
		sum += f16ToF32(scales[g]) * acc
	}
	return sum
}
