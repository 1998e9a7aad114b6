package kernels

// Integer scoring of a query against rows of packed unsigned codes
// (attention against a quantized KV cache, runtime/kvcache
// attend_codes.go). The query q ([hd] float32) is rounded once to int8
// with one absmax scale δ = max_c |q_c| / 127 (q̃_c = δ·round(q_c/δ)), and
// each row's products Σ_c q8_c·code_c are exact int32 sums (AVX-512 VNNI
// vpdpbusd: unsigned code bytes × signed query bytes). The rounding
// moves a score of a row x̂_j = s_j·(c_j − z_j) by
//
//	|q̃·x̂_j − q·x̂_j| ≤ (δ/2)·‖x̂_j‖₁ = (max|q| / 254)·‖x̂_j‖₁
//
// (each |q̃_c − q_c| ≤ δ/2), plus float32 rounding of the final scale and
// zero terms; CodeDotsQ8 uses Σ q̃ for the zero term, so the bound is the
// one of an exact dot product with q̃ (TestCodeDotsQ8Bound).
//
// The rounded query is stored pre-permuted ("planes"): a row of R =
// hd·bits/8 bytes holds P = 8/bits codes per byte, code P·k+m in bits
// [m·bits, (m+1)·bits) of byte k; plane m of the row is the R bytes
// (byte_k >> m·bits) & mask, and the query's plane m the R int8 values
// q8[P·k+m]. The planes are cut into u = R/16 units of 16 bytes, each
// stored four times (64 bytes, one per zmm lane: the kernel scores four
// rows at once, one per 128-bit lane), unit-major within a plane:
// qb[((m·u + k)·64 + l·16 + b] = q8[P·(16k+b)+m] for l < 4.

// CodeQ8Len is the length in bytes of the rounded query of CodeQ8Query
// for hd codes: 4·hd.
func CodeQ8Len(hd int) int { return 4 * hd }

// CodeQ8Fast reports whether CodeDotsQ8 runs in assembly for rows of hd
// codes of bits (2, 4 or 8, unsigned): AVX-512 VNNI, or AVX2 with FMA
// and F16C (the same int32 sums and float32 epilogue, so the same bits),
// and a row of a positive multiple of 16 bytes. Callers without it keep
// the float kernels (CodeDots); CodeDotsQ8 itself runs anywhere
// (portable Go).
func CodeQ8Fast(hd, bits int) bool {
	return (hasVNNI512 || useAsm && hasQ8AVX2) && (bits == 2 || bits == 4 || bits == 8) && hd > 0 && hd*bits%128 == 0
}

// CodeQ8Query rounds q ([hd] float32, hd·bits a multiple of 128) to int8
// into qb ([CodeQ8Len(hd)] bytes, the plane layout above) for codes of
// bits, and returns the scale δ (float32; 0 for a zero query) and
// Σ_c q̃_c = δ·Σ_c q8_c. It panics (a programmer error) on another
// width, a row that is not whole 16-byte units, or a short qb.
func CodeQ8Query(qb []byte, q []float32, bits int) (scale, sum float32) {
	checkQ8Query("CodeQ8Query", len(q), bits)
	if len(qb) < CodeQ8Len(len(q)) {
		panicf("CodeQ8Query: %d bytes, want %d", len(qb), CodeQ8Len(len(q)))
	}
	return codeQ8Round(qb, q, bits, 1, 0)
}

// CodeQ8Query4 is CodeQ8Query for four query rows q ([4, hd] row-major
// float32) at once, for CodeDotsQ8F16x4: each row is rounded with its
// own absmax scale (the same int8 values as CodeQ8Query gives it) into
// qb ([4·CodeQ8Len(hd)] bytes), the four rows' copies of a 16-byte unit
// 64 bytes apart: qb[(((m·u + k)·4 + r)·64 + l·16 + b] = q8_r[P·(16k+b)+m].
// coef ([8] float32) receives each row's scale and Σ q̃: coef[2r],
// coef[2r+1]. It panics as CodeQ8Query does, or on a q that is not four
// rows or a short coef.
func CodeQ8Query4(qb []byte, q []float32, bits int, coef []float32) {
	hd := len(q) / 4
	if len(q) != 4*hd {
		panicf("CodeQ8Query4: %d query values are not four rows", len(q))
	}
	checkQ8Query("CodeQ8Query4", hd, bits)
	if len(qb) < 4*CodeQ8Len(hd) || len(coef) < 8 {
		panicf("CodeQ8Query4: %d bytes and %d coefficients, want %d and 8", len(qb), len(coef), 4*CodeQ8Len(hd))
	}
	for r := 0; r < 4; r++ {
		coef[2*r], coef[2*r+1] = codeQ8Round(qb, q[r*hd:(r+1)*hd], bits, 4, r)
	}
}

// checkQ8Codes is checkCodes for the integer kernels, which also need
// unsigned codes in whole 16-byte units per row.
func checkQ8Codes(fn string, hd, bits, n, rb, ncodes int) {
	checkCodes(fn, hd, bits, n, rb, ncodes)
	if bits == CodeS8 || hd*bits%128 != 0 {
		panicf("%s: %d codes of %d bits are not whole 16-byte units", fn, hd, bits)
	}
}

// checkQ8Query panics unless hd codes of bits are whole 16-byte units.
func checkQ8Query(fn string, hd, bits int) {
	if bits != 2 && bits != 4 && bits != 8 {
		panicf("%s: bits %d, want 2, 4 or 8", fn, bits)
	}
	if hd*bits%128 != 0 || hd == 0 {
		panicf("%s: %d codes of %d bits are not whole 16-byte units", fn, hd, bits)
	}
}

// codeQ8Round rounds q to int8 into row r of the nq-row plane layout
// (nq 1: CodeQ8Query's; 4: CodeQ8Query4's) and returns δ and Σ q̃. The
// values are rounded first (v8, by a division and the float64
// magic-constant rounding: no math.RoundToEven call per value), then each 16-byte unit is gathered
// once and copied to the other three lanes. It runs once per head and
// decode step, which at short contexts costs as much as the scoring
// (BenchmarkCodeQ8Query).
func codeQ8Round(qb []byte, q []float32, bits, nq, r int) (scale, sum float32) {
	hd := len(q)
	P, u := 8/bits, hd*bits/128
	var amax float32
	for _, x := range q {
		if a := abs32(x); a > amax || a != a {
			amax = a // a NaN stays (a > NaN is false): NaN scale, NaN scores
		}
	}
	var buf [512]int8
	v8 := buf[:]
	if hd > len(buf) {
		v8 = make([]int8, hd)
	}
	v8 = v8[:hd]
	var d float64
	var s int64
	if amax > 0 || amax != amax {
		d = float64(amax) / 127
		for c, x := range q {
			// x/δ (correctly rounded, |x/δ| ≤ 127) rounded half to even
			// by the magic constant 1.5·2⁵²; clamped to ±127. (A
			// multiplication by 1/δ would move exact ties.)
			t := float64(x)/d + 0x1.8p52
			v := int8(max(-127, min(127, int64(t-0x1.8p52))))
			v8[c] = v
			s += int64(v)
		}
	} else {
		clear(v8)
	}
	for m := 0; m < P; m++ {
		for k := 0; k < u; k++ {
			o := ((m*u+k)*nq + r) * 64
			unit := qb[o : o+64]
			for b := 0; b < 16; b++ {
				unit[b] = byte(v8[P*(16*k+b)+m])
			}
			copy(unit[16:32], unit[:16])
			copy(unit[32:64], unit[:32])
		}
	}
	return float32(d), float32(d * float64(s))
}

// q8At returns q8[c] from the plane layout (P codes per byte, u units).
func q8At(qb []byte, c, P, u int) int32 { return q8AtN(qb, c, P, u, 1, 0) }

// q8AtN returns q8_r[c] from the nq-row plane layout.
func q8AtN(qb []byte, c, P, u, nq, r int) int32 {
	k, m := c/P, c%P
	return int32(int8(qb[((m*u+k/16)*nq+r)*64+k%16]))
}

// CodeDotsQ8 sets out[j] = sz[2j]·(scale·t_j − sz[2j+1]·sum) for the n
// rows j of codes (row j at codes[j·rb:], hd unsigned codes of bits, as
// CodeDots takes them), where t_j = Σ_c q8_c·code_jc is the exact int32
// product with the query qb rounded by CodeQ8Query (scale, sum its
// results), and sz holds each row's float32 scale and zero ([n, 2]). hd
// is len(qb)/4. With CodeQ8Fast(hd, bits) four rows at a time run in
// assembly, the rest in Go; the float32 arithmetic on t_j differs in
// rounding only (the assembly fuses scale·t − z·sum). It panics as
// CodeDots does, or on a short sz or out.
func CodeDotsQ8(out []float32, qb []byte, scale, sum float32, codes []byte, bits, rb, n int, sz []float32) {
	hd := len(qb) / 4
	checkQ8Codes("CodeDotsQ8", hd, bits, n, rb, len(codes))
	if n <= 0 {
		return
	}
	out, sz = out[:n], sz[:2*n]
	j := 0
	if CodeQ8Fast(hd, bits) && n >= 4 {
		n4 := n / 4
		coef := [2]float32{scale, sum}
		u := hd * bits / 128
		switch {
		case !hasVNNI512 && bits == 2:
			codeDotsQ8b2AVX2(&out[0], &qb[0], &codes[0], n4, u, rb, 64, &sz[0], &coef[0], &q8Consts)
		case !hasVNNI512 && bits == 4:
			codeDotsQ8b4AVX2(&out[0], &qb[0], &codes[0], n4, u, rb, 64, &sz[0], &coef[0], &q8Consts)
		case !hasVNNI512 && u <= q8WideUnits:
			codeDotsQ8b8WAVX2(&out[0], &qb[0], &codes[0], n4, u, rb, 64, &sz[0], &coef[0], &q8Consts)
		case !hasVNNI512:
			codeDotsQ8b8AVX2(&out[0], &qb[0], &codes[0], n4, u, rb, 64, &sz[0], &coef[0], &q8Consts)
		case bits == 2:
			codeDotsQ8b2VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &sz[0], &coef[0], &q8Consts)
		case bits == 4:
			codeDotsQ8b4VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &sz[0], &coef[0], &q8Consts)
		default:
			codeDotsQ8b8VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &sz[0], &coef[0], &q8Consts)
		}
		j = 4 * n4
	}
	if j < n { // codes may end at the last row's codes, before its padding
		codeDotsQ8Go(out[j:], qb, scale, sum, codes[j*rb:], bits, rb, sz[2*j:])
	}
}

// codeDotsQ8Go is CodeDotsQ8 in Go for len(out) rows.
func codeDotsQ8Go(out []float32, qb []byte, scale, sum float32, codes []byte, bits, rb int, sz []float32) {
	for j := range out {
		t := q8RowDot(codes[j*rb:], qb, 1, 0, bits)
		out[j] = sz[2*j] * (scale*float32(t) - sz[2*j+1]*sum)
	}
}

// q8RowDot is Σ_c q8_c·code_c (exact int32) of one row of hd codes of
// bits at row and query row r of the nq-row plane layout at qb.
func q8RowDot(row, qb []byte, nq, r, bits int) int32 {
	hd := len(qb) / (4 * nq)
	P, u := 8/bits, hd*bits/128
	mask := byte(1<<uint(bits) - 1)
	var t int32
	for k, b := range row[:hd*bits/8] {
		for m := 0; m < P; m++ {
			t += int32(b>>uint(m*bits)&mask) * q8AtN(qb, P*k+m, P, u, nq, r)
		}
	}
	return t
}

// CodeDotsQ8F16 is CodeDotsQ8 with each row's scale and zero as fp16
// params ([n, 2] uint16: scale, zero), widened exactly inside the
// kernel instead of by the caller: for the same values it gives the
// bits CodeDotsQ8 gives with sz the widened params (TestCodeDotsQ8F16).
// It panics as CodeDotsQ8 does, or on short params.
func CodeDotsQ8F16(out []float32, qb []byte, scale, sum float32, codes []byte, bits, rb, n int, params []uint16) {
	hd := len(qb) / 4
	checkQ8Codes("CodeDotsQ8F16", hd, bits, n, rb, len(codes))
	if n <= 0 {
		return
	}
	out, params = out[:n], params[:2*n]
	j := 0
	if CodeQ8Fast(hd, bits) && n >= 4 {
		n4 := n / 4
		coef := [2]float32{scale, sum}
		u := hd * bits / 128
		switch c := contig(bits, u, rb); {
		case !hasVNNI512:
			codeDotsQ8F16AVX2(bits, &out[0], &qb[0], &codes[0], n4, u, rb, 64, &params[0], &coef[0])
		case c == 21:
			codeDotsQ8F16b2C1VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		case c == 22:
			codeDotsQ8F16b2C2VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		case c == 42:
			codeDotsQ8F16b4C2VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		case bits == 2:
			codeDotsQ8F16b2VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		case bits == 4:
			codeDotsQ8F16b4VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		default:
			codeDotsQ8F16b8VNNI(&out[0], &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		}
		j = 4 * n4
	}
	if j < n {
		codeDotsQ8F16Go(out[j:], qb, 1, 0, scale, sum, codes[j*rb:], bits, rb, params[2*j:])
	}
}

// CodeDotsQ8F16x4 is CodeDotsQ8F16 for four query rows at once, rounded
// by CodeQ8Query4 into qb (coef its scales and sums): the scores of query
// row r go to out[r·ldo + j], j < n (out at least 3·ldo + n floats, ldo ≥
// n). With VNNI each unit of codes is loaded and split into planes once
// for the four rows (a GQA group sharing a KV head); the AVX2 kernels
// make one pass per row. Every score has the bits CodeDotsQ8F16 gives
// for that row alone (TestCodeDotsQ8F16, TestCodeDotsQ8AVX2Exact).
// It panics as CodeDotsQ8F16 does, or on short out, qb or coef.
func CodeDotsQ8F16x4(out []float32, ldo int, qb []byte, coef []float32, codes []byte, bits, rb, n int, params []uint16) {
	hd := len(qb) / 16
	checkQ8Codes("CodeDotsQ8F16x4", hd, bits, n, rb, len(codes))
	if n <= 0 {
		return
	}
	if ldo < n || len(out) < 3*ldo+n || len(coef) < 8 || len(params) < 2*n {
		panicf("CodeDotsQ8F16x4: out %d (ldo %d), coef %d, params %d for %d rows", len(out), ldo, len(coef), len(params), n)
	}
	j := 0
	if CodeQ8Fast(hd, bits) && n >= 4 {
		n4 := n / 4
		u := hd * bits / 128
		switch c := contig(bits, u, rb); {
		case !hasVNNI512:
			// AVX2: one pass over the rows per query row (the later
			// passes read them from cache: a 8,192-row run of 2-bit
			// head_dim-64 codes is 128 KiB).
			for r := 0; r < 4; r++ {
				codeDotsQ8F16AVX2(bits, &out[r*ldo], &qb[64*r], &codes[0], n4, u, rb, 256, &params[0], &coef[2*r])
			}
		case c == 21:
			codeDotsQ8F16x4b2C1VNNI(&out[0], ldo, &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		case c == 22:
			codeDotsQ8F16x4b2C2VNNI(&out[0], ldo, &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		case c == 42:
			codeDotsQ8F16x4b4C2VNNI(&out[0], ldo, &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		case bits == 2:
			codeDotsQ8F16x4b2VNNI(&out[0], ldo, &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		case bits == 4:
			codeDotsQ8F16x4b4VNNI(&out[0], ldo, &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		default:
			codeDotsQ8F16x4b8VNNI(&out[0], ldo, &qb[0], &codes[0], n4, u, rb, &params[0], &coef[0], &q8Consts)
		}
		j = 4 * n4
	}
	for r := 0; r < 4 && j < n; r++ {
		codeDotsQ8F16Go(out[r*ldo+j:r*ldo+n], qb, 4, r, coef[2*r], coef[2*r+1], codes[j*rb:], bits, rb, params[2*j:])
	}
}

// q8WideUnits is the most 16-byte units of 8-bit codes per row (head_dim
// 256) the VPMADDWD kernels take (their frame holds the query widened to
// int16); longer rows take the nibble-split kernels.
const q8WideUnits = 16

// codeDotsQ8F16AVX2 calls the AVX2 kernel of CodeDotsQ8F16 for bits (the
// contiguous one for 2-bit rows of one unit, rb 16; for 8 bits the
// VPMADDWD one up to q8WideUnits units).
func codeDotsQ8F16AVX2(bits int, out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32) {
	switch {
	case bits == 2 && contig(bits, u, rb) == 21:
		codeDotsQ8F16b2C1AVX2(out, qb, codes, n4, u, rb, qs, params, coef, &q8Consts)
	case bits == 2:
		codeDotsQ8F16b2AVX2(out, qb, codes, n4, u, rb, qs, params, coef, &q8Consts)
	case bits == 4:
		codeDotsQ8F16b4AVX2(out, qb, codes, n4, u, rb, qs, params, coef, &q8Consts)
	case u <= q8WideUnits:
		codeDotsQ8F16b8WAVX2(out, qb, codes, n4, u, rb, qs, params, coef, &q8Consts)
	default:
		codeDotsQ8F16b8AVX2(out, qb, codes, n4, u, rb, qs, params, coef, &q8Consts)
	}
}

// contig returns 10·bits + u for rows of u units stored contiguously (rb
// = 16·u) that a contiguous kernel takes (2-bit u 1 or 2, 4-bit u 2:
// head_dim 64 and 128 at 2 bits, 64 at 4), else 0.
func contig(bits, u, rb int) int {
	if rb != 16*u || !(bits == 2 && (u == 1 || u == 2) || bits == 4 && u == 2) {
		return 0
	}
	return 10*bits + u
}

// codeDotsQ8F16Go is CodeDotsQ8F16 in Go for len(out) rows and query row
// r of the nq-row layout at qb.
func codeDotsQ8F16Go(out []float32, qb []byte, nq, r int, scale, sum float32, codes []byte, bits, rb int, params []uint16) {
	for j := range out {
		t := q8RowDot(codes[j*rb:], qb, nq, r, bits)
		s, z := f16ToF32(params[2*j]), f16ToF32(params[2*j+1])
		out[j] = s * (scale*float32(t) - z*sum)
	}
}

// q8ConstTab is the layout of q8Consts (byte offsets 0, 64, 96, 160,
// 224, 256: codesq8_amd64.s and codesq8avx2_amd64.s read them so).
type q8ConstTab struct {
	lanes    [16]int32
	split    [8]int32
	mask2    [64]byte
	mask4    [64]byte
	ones16   [16]int16 // VPMADDWD: int16 pairs to int32
	sixteens [16]int16 // the same for the high nibbles of 8-bit codes
}

// q8Consts are the VNNI and AVX2 kernels' constants: the dword
// permutation taking lane sums (dword 0 of each 128-bit lane) to dwords
// 0–3, the float permutation splitting [s0 z0 s1 z1 …] into scales then
// zeros, the 2- and 4-bit byte masks, and the int16 ones and sixteens.
var q8Consts = q8ConstTab{
	lanes:    [16]int32{0, 4, 8, 12},
	split:    [8]int32{0, 2, 4, 6, 1, 3, 5, 7},
	mask2:    [64]byte{3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
	mask4:    [64]byte{15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15},
	ones16:   [16]int16{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
	sixteens: [16]int16{16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16},
}
