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

// InterleaveU4 writes x [n] (n a multiple of 16) into dst [n] in the order
// of the codes of a 4-bit row split into nibbles: in every block of 16,
// the 8 even-indexed elements, then the 8 odd-indexed ones,
//
//	dst[16b+i] = x[16b+2i],  dst[16b+8+i] = x[16b+2i+1],  i < 8,
//
// the layout DotU4RowIL takes, so that its loop needs no shuffle of the
// decoded codes. It panics (a programmer error) if n is not a multiple of
// 16 or dst is short.
func InterleaveU4(dst, x []float32) {
	n := len(x)
	if n%16 != 0 || len(dst) < n {
		panicf("InterleaveU4: %d elements into %d, want a multiple of 16", n, len(dst))
	}
	for b := 0; b < n; b += 16 {
		xs, d := x[b:b+16:b+16], dst[b:b+16:b+16]
		for i := 0; i < 8; i++ {
			d[i], d[8+i] = xs[2*i], xs[2*i+1]
		}
	}
}

// DotU4RowIL is DotQRow for 4-bit codes and groups that are a multiple of
// 16, with x given interleaved by InterleaveU4 (xi [n]): the same sum,
// Σ_g s_g·Σ_j (c_j − z_g)·x[j], to the same bound. A GEMV interleaves x
// once and calls it for every row of W; with AVX2, FMA and F16C each step
// decodes 16 codes with one zero-extension, a mask and a shift. It panics
// (a programmer error) on inconsistent lengths.
func DotU4RowIL(xi []float32, src []byte, scales, zeros []uint16, group int, zsym float32) float32 {
	n := len(xi)
	if group <= 0 || group%16 != 0 || n%group != 0 {
		panicf("DotU4RowIL: group %d for %d codes, want a multiple of 16 that divides it", group, n)
	}
	ng := n / group
	if len(scales) < ng || (zeros != nil && len(zeros) < ng) || len(src) < n/2 {
		panicf("DotU4RowIL: %d scales, %d zeros, %d bytes for %d groups of %d codes", len(scales), len(zeros), len(src), ng, group)
	}
	if ng == 0 {
		return 0
	}
	if useAsm && hasF16C {
		var zp *uint16
		if zeros != nil {
			zp = &zeros[0]
		}
		return dotU4RowILAVX2(&xi[0], &src[0], &scales[0], zp, ng, group, zsym)
	}
	var sum float32
	for g := 0; g < ng; g++ {
		z := zsym
		if zeros != nil {
			z = f16ToF32(zeros[g])
		}
		var acc float32
		for b := g * group; b < (g+1)*group; b += 16 {
			xs, bs := xi[b:b+16:b+16], src[b/2:b/2+8:b/2+8]
			for i, v := range bs {
				acc += (float32(v&15)-z)*xs[i] + (float32(v>>4)-z)*xs[8+i]
			}
		}
		sum += f16ToF32(scales[g]) * acc
	}
	return sum
}
