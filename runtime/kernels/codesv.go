package kernels

// CodeAccumF16 is the value side of attention against rows of packed
// unsigned codes with one fp16 scale and zero per row (runtime/kvcache
// attend_codes.go): for the n rows j of codes (row j at codes[j·rb:],
// hd = len(acc) codes of bits 2, 4 or 8, as CodeDots takes them) and
// params ([n, 2] fp16: scale s_j, zero z_j) it adds
//
//	acc[c] += Σ_j p_j·s_j·(code_jc − z_j)
//
// to acc ([hd] float32), i.e. Σ_j p_j·x̂_j for the dequantised rows x̂_j,
// float32 accumulation: w_j = p_j·s_j is rounded once, Σ_j w_j·code_jc
// and Σ_j w_j·z_j are float32 sums (in assembly in two interleaved
// partial sums per channel), and the zero term is subtracted once per
// channel. With CodeAccumFast(hd, bits) it runs in AVX-512 (codesv_amd64.s;
// tmp, at least hd floats, is its scratch), else in Go (tmp unused). It
// panics (a programmer error) as CodeDots does, or on short p or params.
func CodeAccumF16(acc, p []float32, params []uint16, codes []byte, bits, rb, n int, tmp []float32) {
	hd := len(acc)
	checkCodes("CodeAccumF16", hd, bits, n, rb, len(codes))
	if bits == CodeS8 {
		panicf("CodeAccumF16: signed codes")
	}
	if n <= 0 {
		return
	}
	p, params = p[:n], params[:2*n]
	if CodeAccumFast(hd, bits) {
		tmp = tmp[:hd]
		var cz float32
		switch bits {
		case 2:
			codeAccumF16b2AVX512(&tmp[0], &p[0], &params[0], &codes[0], n, hd/64, rb, &codeVTable2, &cz)
		case 4:
			codeAccumF16b4AVX512(&tmp[0], &p[0], &params[0], &codes[0], n, hd/64, rb, &codeVTable4, &cz)
		default:
			codeAccumF16b8AVX512(&tmp[0], &p[0], &params[0], &codes[0], n, hd/64, rb, &codeVTable4, &cz)
		}
		for c := 0; c < hd; c += 64 {
			addPlanes(acc[c:c+64], tmp[c:c+64], bits, cz)
		}
		return
	}
	var cz float32
	for j, pj := range p {
		w := pj * F16.Widen(params[2*j])
		cz += w * F16.Widen(params[2*j+1])
		row := codes[j*rb:]
		for c := range acc {
			acc[c] += w * rowCode(row, c, bits)
		}
	}
	for c := range acc {
		acc[c] -= cz
	}
}

// addPlanes adds t − cz to acc (64 channels) with t in the kernels'
// plane order for codes of bits: 2-bit plane m holds channels 4k+m, the
// 4-bit planes of each 16-byte half v channels 2(16v+k)+m, 8-bit none.
func addPlanes(acc, t []float32, bits int, cz float32) {
	acc, t = acc[:64], t[:64]
	switch bits {
	case 2:
		for m := 0; m < 4; m++ {
			for k := 0; k < 16; k++ {
				acc[4*k+m] += t[16*m+k] - cz
			}
		}
	case 4:
		for v := 0; v < 2; v++ {
			for m := 0; m < 2; m++ {
				for k := 0; k < 16; k++ {
					acc[2*(16*v+k)+m] += t[16*(2*v+m)+k] - cz
				}
			}
		}
	default:
		for c, x := range t {
			acc[c] += x - cz
		}
	}
}

// CodeAccumF16x4 is CodeAccumF16 for four query rows at once (a GQA
// group sharing a KV head): acc is [4, hd] (row r = acc[r·hd:(r+1)·hd]),
// the weights of query row r are p[r·ldp : r·ldp+n] (ldp ≥ n), params,
// codes, bits, rb and n as CodeAccumF16 takes them, and tmp at least
// 4·hd floats of scratch. With CodeAccumFast(hd, bits) each row's codes
// are turned into floats once for the four query rows (AVX-512); the
// per-channel sums run over the rows in order in one float32 sum, so the
// bits may differ from CodeAccumF16's (two interleaved partial sums)
// within the same bound (TestCodeAccumF16x4). Otherwise it calls
// CodeAccumF16 per row. It panics as CodeAccumF16 does, or on short acc,
// p or tmp.
func CodeAccumF16x4(acc, p []float32, ldp int, params []uint16, codes []byte, bits, rb, n int, tmp []float32) {
	hd := len(acc) / 4
	if len(acc) != 4*hd || ldp < n || len(p) < 3*ldp+n || len(tmp) < 4*hd {
		panicf("CodeAccumF16x4: acc %d (want 4 rows), p %d (ldp %d), tmp %d for %d rows", len(acc), len(p), ldp, len(tmp), n)
	}
	checkCodes("CodeAccumF16x4", hd, bits, n, rb, len(codes))
	if bits == CodeS8 {
		panicf("CodeAccumF16x4: signed codes")
	}
	if n <= 0 {
		return
	}
	if !CodeAccumFast(hd, bits) {
		for r := 0; r < 4; r++ {
			CodeAccumF16(acc[r*hd:(r+1)*hd], p[r*ldp:r*ldp+n], params, codes, bits, rb, n, tmp)
		}
		return
	}
	params = params[:2*n]
	tmp = tmp[:4*hd]
	var cz [4]float32
	switch bits {
	case 2:
		codeAccumF16x4b2AVX512(&tmp[0], &p[0], ldp, &params[0], &codes[0], n, hd/64, rb, &codeVTable2, &cz[0])
	case 4:
		codeAccumF16x4b4AVX512(&tmp[0], &p[0], ldp, &params[0], &codes[0], n, hd/64, rb, &codeVTable4, &cz[0])
	default:
		codeAccumF16x4b8AVX512(&tmp[0], &p[0], ldp, &params[0], &codes[0], n, hd/64, rb, &codeVTable4, &cz[0])
	}
	for c := 0; c < hd; c += 64 {
		for r := 0; r < 4; r++ {
			o := 4*c + 64*r // chunk c/64 holds [4][64]
			addPlanes(acc[r*hd+c:r*hd+c+64], tmp[o:o+64], bits, cz[r])
		}
	}
}

// CodeAccumFast reports whether CodeAccumF16 runs in assembly for rows
// of hd codes of bits: AVX-512 (with F16C) and hd a positive multiple of
// 64.
func CodeAccumFast(hd, bits int) bool {
	return hasAVX512 && (bits == 2 || bits == 4 || bits == 8) && hd > 0 && hd%64 == 0
}

// codeVTable2 and codeVTable4 are VPERMPS tables (index: the low 4 bits)
// of the 2-bit code in bits 0–1 and of the 4-bit code.
var codeVTable2, codeVTable4 = [16]float32{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3},
	[16]float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
