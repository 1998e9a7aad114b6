package kernels

// The int8-activation GEMV for 3-bit codes (docs/QUANT.md "Runtime"). The
// stored 3-bit layout (8 codes in 3 bytes, LSB first) has no assembly of
// its own; a 3-bit code c splits into c = lo + 4·hi with lo = c & 3 (2
// bits) and hi = c >> 2 (1 bit), so a row stored as a 2-bit plane of the
// lo codes and a 1-bit plane of the hi codes (SplitU3, once at load: the
// same 3 bits per weight) runs on the 2-bit and 1-bit kernels of
// DotQ8Matrix:
//
//	Σ_j s_g·(c_j − z_g)·x_j = Σ_j s_g·(lo_j − z_g)·x_j + 4·Σ_j s_g·hi_j·x_j,
//
// the first the 2-bit kernel with the weight's zero-points, the second the
// 1-bit kernel with zero-point 0 and the same scales.

// U3PlaneBytes returns the bytes of one row of k codes in each plane of
// SplitU3: k/4 for the 2-bit plane, k/8 for the 1-bit plane (k a
// multiple of 8).
func U3PlaneBytes(k int) (lo, hi int) { return k / 4, k / 8 }

// SplitU3 splits rows packed rows of k 3-bit codes (the LSB-first bit
// stream of docs/QUANT.md, row r at src[r·rowBytes:], rowBytes ≥
// 3k/8) into lo [rows·k/4], the 2-bit codes c & 3 in the 2-bit layout
// (LSB first, 4 codes a byte), and hi [rows·k/8], the bits c >> 2 in the
// 1-bit layout (8 codes a byte), both rows contiguous. k must be a
// multiple of 8; it panics (a programmer error) otherwise or when a slice
// is short.
func SplitU3(lo, hi, src []byte, rowBytes, rows, k int) {
	lb, hb := U3PlaneBytes(k)
	if k%8 != 0 || rowBytes < 3*k/8 || len(lo) < rows*lb || len(hi) < rows*hb || (rows > 0 && len(src) < (rows-1)*rowBytes+3*k/8) {
		panicf("SplitU3: %d rows of %d codes (%d bytes each) from %d bytes into %d and %d bytes", rows, k, rowBytes, len(src), len(lo), len(hi))
	}
	for r := 0; r < rows; r++ {
		s := src[r*rowBytes : r*rowBytes+3*k/8]
		l, h := lo[r*lb:(r+1)*lb], hi[r*hb:(r+1)*hb]
		for i := 0; i < k/8; i++ {
			v := uint32(s[3*i]) | uint32(s[3*i+1])<<8 | uint32(s[3*i+2])<<16
			var lw uint16
			var hw byte
			for t := 0; t < 8; t++ {
				c := v >> (3 * uint(t)) & 7
				lw |= uint16(c&3) << (2 * uint(t))
				hw |= byte(c>>2) << uint(t)
			}
			l[2*i], l[2*i+1], h[i] = byte(lw), byte(lw>>8), hw
		}
	}
}

// DotQ8MatrixU3 is DotQ8Matrix for rows consecutive rows of 3-bit codes
// split into planes by SplitU3 (lo: rows·k/4 bytes, hi: rows·k/8 bytes,
// k = a.K): y[i·ldy + r] = Σ_j s_g·(c_j − z_g)·S[i,b]·Q[i,j] for
// activation row i < a.M, with c_j = lo_j + 4·hi_j, s_g the float16
// scales[r·ng + g] and z_g zeros[r·ng + g] (zsym when zeros is nil), ng
// = a.K/group, group a multiple of a.Block dividing a.K. It computes the
// 2-bit plane's sum with the weight's zero-points into y and the 1-bit
// plane's with zero-point 0 into tmp [a.M·rows] (scratch), then y += 4·tmp
// (exact scaling by 4); both run on the assembly kernels where Q8Asm(2,
// a.Block) and Q8Asm(1, a.Block), which need a prepared for 3 bits
// (Q8Act.Prepare(3)). Each output is, bit for bit, what it is for any
// other a.M and rows (DotQ8Matrix's property), and it is within
// (a.K/a.Block + 16)·2^−23 of Σ_j |s_g|·(c_j + |z_g|)·S·|Q| of the float64
// sum (qdot8u3_test.go). It panics (a programmer error) on inconsistent
// lengths.
func DotQ8MatrixU3(y []float32, ldy int, a *Q8Act, lo, hi []byte, rows int, scales, zeros []uint16, group int, zsym float32, tmp []float32) {
	if rows <= 0 || a.M == 0 {
		return
	}
	if len(tmp) < a.M*rows || a.K%8 != 0 {
		panicf("DotQ8MatrixU3: %d scratch floats for %d rows of %d outputs, %d columns", len(tmp), a.M, rows, a.K)
	}
	lb, hb := U3PlaneBytes(a.K)
	DotQ8Matrix(y, ldy, a, lo, lb, rows, 2, scales, zeros, group, zsym)
	DotQ8Matrix(tmp, rows, a, hi, hb, rows, 1, scales, nil, group, 0)
	for i := 0; i < a.M; i++ {
		yr, tr := y[i*ldy:i*ldy+rows], tmp[i*rows:(i+1)*rows]
		for r, v := range tr {
			yr[r] += 4 * v
		}
	}
}
