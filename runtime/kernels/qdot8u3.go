package kernels

// The int8-activation GEMV for 3-bit codes (docs/QUANT.md "Runtime"). The
// stored 3-bit layout (8 codes in 3 bytes, LSB first) lets codes straddle
// bytes, so at load each row is rearranged once (SplitU3, the same 3 bits
// per weight) into blocks of 32 codes of 12 bytes: the 8 bytes of the
// 2-bit plane lo_j = c_j & 3 (the 2-bit layout, LSB first), then the 4
// bytes of the high bits hi_j = c_j >> 2 in the order the kernels test
// them. The assembly unpacks a block as the 2-bit kernels do and adds 4 to
// every code whose high bit is set, so each block's Σ c_j·Q_j is one
// exact int32 sum and is scaled once, as for every other width:
//
//	Σ_j s_g·(c_j − z_g)·S_b·Q_j,   c_j = lo_j + 4·hi_j.
//
// An earlier version ran the 2-bit and the 1-bit kernels on two planes and
// added 4 times the second, reading the activations twice and scaling
// every block twice: BenchmarkGEMVDRAM's 3bit-g32 (one thread, AVX-512
// VNNI) went from 6.8–8.0 to 11.1–11.6 weight GB/s with the fused kernel,
// alternating the two builds (docs/QUANT.md has the runtime's figures).

// U3BlockBytes is the bytes of one block of 32 codes in SplitU3's layout:
// 8 of the 2-bit plane, 4 of the high bits.
const U3BlockBytes = 12

// u3HiBit returns where SplitU3 puts the high bit of code j (0 ≤ j < 32)
// of a block: byte (of the block's 4 high bytes) and bit. The 2-bit
// unpacking leaves code 4i+t at byte p = 8t+i of the register; the
// kernels test byte p of the broadcast high dword, that is high byte p%4,
// against the bit 1 << (p/4) (the asm generator's hbit table).
func u3HiBit(j int) (byteIdx, bit int) {
	p := 8*(j%4) + j/4
	return p % 4, p / 4
}

// SplitU3 rearranges rows packed rows of k 3-bit codes (the LSB-first bit
// stream of docs/QUANT.md, row r at src[r·rowBytes:], rowBytes ≥ 3k/8)
// into dst [rows·3k/8], rows contiguous, each row k/32 blocks of
// U3BlockBytes: the codes c & 3 in the 2-bit layout (LSB first, 4 codes
// a byte), then the bits c >> 2 at the bytes and bits u3HiBit gives. k
// must be a multiple of 32; it panics (a programmer error) otherwise or
// when a slice is short.
func SplitU3(dst, src []byte, rowBytes, rows, k int) {
	rb := 3 * k / 8
	if k%32 != 0 || rowBytes < rb || len(dst) < rows*rb || (rows > 0 && len(src) < (rows-1)*rowBytes+rb) {
		panicf("SplitU3: %d rows of %d codes (%d bytes each) from %d bytes into %d bytes", rows, k, rowBytes, len(src), len(dst))
	}
	for r := 0; r < rows; r++ {
		s := src[r*rowBytes : r*rowBytes+rb]
		d := dst[r*rb : (r+1)*rb]
		clear(d)
		for j := 0; j < k; j++ {
			c := u3Code(s, j)
			b := d[j/32*U3BlockBytes:]
			jb := j % 32
			b[jb/4] |= (c & 3) << (2 * uint(jb%4))
			hb, bit := u3HiBit(jb)
			b[8+hb] |= (c >> 2) << uint(bit)
		}
	}
}

// u3Code returns code j of the LSB-first 3-bit stream s.
func u3Code(s []byte, j int) byte {
	p := 3 * j
	v := uint16(s[p>>3])
	if p&7 > 5 {
		v |= uint16(s[p>>3+1]) << 8
	}
	return byte(v >> uint(p&7) & 7)
}

// u3BlockCode returns code j (0 ≤ j < 32) of a block of SplitU3's layout.
func u3BlockCode(b []byte, j int) int32 {
	hb, bit := u3HiBit(j)
	return int32(b[j/4]>>(2*uint(j%4))&3) | int32(b[8+hb]>>uint(bit)&1)<<2
}

// joinU3 writes one row of k codes from SplitU3's layout (src [3k/8])
// back into the stored LSB-first 3-bit stream (dst [3k/8]), SplitU3's
// inverse.
func joinU3(dst, src []byte, k int) {
	clear(dst[:3*k/8])
	for j := 0; j < k; j++ {
		c := u3BlockCode(src[j/32*U3BlockBytes:], j%32)
		p := 3 * j
		dst[p>>3] |= byte(c << uint(p&7))
		if p&7 > 5 {
			dst[p>>3+1] |= byte(c >> uint(8-p&7))
		}
	}
}

// Q8AsmU3 reports whether DotQ8MatrixU3 runs in assembly for activation
// block blk in this build on this CPU (AVX2 and F16C, blk = 32; AVX-512
// VNNI with BW where the CPU has it), rather than in portable Go.
func Q8AsmU3(blk int) bool { return useAsm && hasF16C && blk == 32 }

// DotQ8MatrixU3 is DotQ8Matrix for rows consecutive rows of 3-bit codes
// in SplitU3's layout (codes [rows·3k/8], k = a.K a multiple of 32):
// y[i·ldy + r] = Σ_j s_g·(c_j − z_g)·S[i,b]·Q[i,j] for activation row
// i < a.M, s_g the float16 scales[r·ng + g] and z_g zeros[r·ng + g]
// (zsym when zeros is nil), ng = a.K/group, group a multiple of a.Block
// dividing a.K. With the assembly (Q8AsmU3) a must be prepared for 3
// bits (Q8Act.Prepare(3)). Each output is, bit for bit, what it is for
// any other a.M and rows (DotQ8Matrix's property), and it is within
// (a.K/a.Block + 16)·2^−23 of Σ_j |s_g|·(c_j + |z_g|)·S·|Q| of the
// float64 sum (qdot8u3_test.go). It panics (a programmer error) on
// inconsistent lengths.
func DotQ8MatrixU3(y []float32, ldy int, a *Q8Act, codes []byte, rows int, scales, zeros []uint16, group int, zsym float32) {
	k := a.K
	if rows <= 0 || a.M == 0 {
		return
	}
	rb := 3 * k / 8
	if k%32 != 0 || group <= 0 || k%group != 0 || group%a.Block != 0 {
		panicf("DotQ8MatrixU3: group %d for %d columns and activation block %d, want columns a multiple of 32 and a group dividing them and a multiple of the block", group, k, a.Block)
	}
	ng := k / group
	if len(codes) < rows*rb || len(scales) < rows*ng || (zeros != nil && len(zeros) < rows*ng) || len(y) < (a.M-1)*ldy+rows {
		panicf("DotQ8MatrixU3: %d code bytes, %d scales, %d zeros, %d outputs for %d rows of %d groups", len(codes), len(scales), len(zeros), len(y), rows, ng)
	}
	if Q8AsmU3(a.Block) {
		a.checkPrepared(3)
		dotQ8MatrixAsm(y, ldy, a, codes, rb, rows, 3, scales, zeros, ng, group, zsym)
		return
	}
	// The portable loop (tests, and CPUs without the assembly, where the
	// runtime keeps 3-bit weights on its tiles): each row back in the
	// stored stream (joinU3) through DotQ8Rows' Go loop.
	stream := make([]byte, rb)
	for r := 0; r < rows; r++ {
		joinU3(stream, codes[r*rb:(r+1)*rb], k)
		var zr []uint16
		if zeros != nil {
			zr = zeros[r*ng : (r+1)*ng]
		}
		dotQ8RowsGo(y[r:], ldy, a, stream, 3, scales[r*ng:(r+1)*ng], zr, group, zsym)
	}
}
