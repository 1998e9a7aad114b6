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
			for c := 0; c < hd; c += 64 {
				t := tmp[c : c+64]
				for m := 0; m < 4; m++ {
					for k := 0; k < 16; k++ {
						acc[c+4*k+m] += t[16*m+k] - cz
					}
				}
			}
		case 4:
			codeAccumF16b4AVX512(&tmp[0], &p[0], &params[0], &codes[0], n, hd/64, rb, &codeVTable4, &cz)
			for c := 0; c < hd; c += 64 {
				t := tmp[c : c+64]
				for v := 0; v < 2; v++ {
					for m := 0; m < 2; m++ {
						for k := 0; k < 16; k++ {
							acc[c+2*(16*v+k)+m] += t[16*(2*v+m)+k] - cz
						}
					}
				}
			}
		default:
			codeAccumF16b8AVX512(&tmp[0], &p[0], &params[0], &codes[0], n, hd/64, rb, &codeVTable4, &cz)
			for c, t := range tmp {
				acc[c] += t - cz
			}
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
