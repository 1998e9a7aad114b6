package kernels

// Kernels over rows of packed unsigned codes, for attention against a
// quantized KV cache without expanding the history to float32 (runtime/
// kvcache attend_codes.go; docs/METHODS.md §1 for the per-(token, head)
// asymmetric codes they serve). A row holds hd codes of bits = 2, 4 or 8
// bits (unsigned), or of 8 bits signed (bits = CodeS8: int8, llama.cpp's
// q8_0), code c in bits [c·bits, (c+1)·bits) of the row, least significant
// bit first (kvq.EncodeAsym's packing); rows are rb bytes apart. The
// kernels compute on the bare code values (the caller applies the rows'
// scales and zeros): a code is an integer below 256, exact in float32, so
// the only rounding is the float32 accumulation, as in a float32 dot
// product of the same length.
//
// With AVX2 and FMA, head dims that are a multiple of 32 run in assembly
// (codes_amd64.s): 32 codes at a time are extracted into int32 lanes by
// variable shifts (2 and 4 bits) or zero extension (8 bits), converted
// and multiplied with FMA, never written out as floats. Other head dims,
// and builds without the assembly, run the portable Go loops below,
// checked against the same float64 reference (codes_test.go).

// CodeS8 is the bits argument of CodeDots and CodeAxpy for signed 8-bit
// codes (int8 two's complement bytes).
const CodeS8 = -8

// codeShifts holds the variable shifts of the 2-bit (0, 2, …, 30) and
// 4-bit (0, 4, …, 28, twice) extraction.
var codeShifts = [9][16]int32{
	2: {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
	4: {0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28},
}

// CodeRowsFast reports whether CodeDots and CodeAxpy run in assembly for
// rows of hd codes (AVX2+FMA and hd a positive multiple of 32); callers
// with a faster float path for other shapes choose by it.
func CodeRowsFast(hd int) bool { return useAsm && hd > 0 && hd%32 == 0 }

func checkCodes(fn string, hd, bits, n, rb, ncodes int) {
	if bits != 2 && bits != 4 && bits != 8 && bits != CodeS8 {
		panicf("%s: bits %d, want 2, 4, 8 or CodeS8", fn, bits)
	}
	if bits == CodeS8 {
		bits = 8
	}
	if hd*bits%8 != 0 {
		panicf("%s: %d codes of %d bits split a byte", fn, hd, bits)
	}
	if rb < hd*bits/8 {
		panicf("%s: row stride %d bytes, want ≥ %d", fn, rb, hd*bits/8)
	}
	if n > 0 && ncodes < (n-1)*rb+hd*bits/8 {
		panicf("%s: %d code bytes for %d rows of stride %d", fn, ncodes, n, rb)
	}
}

// rowCode returns code c of the row at row (bits 2, 4, 8 or CodeS8).
func rowCode(row []byte, c, bits int) float32 {
	if bits == CodeS8 {
		return float32(int8(row[c]))
	}
	p := c * bits
	return float32(row[p>>3] >> uint(p&7) & byte(1<<uint(bits)-1))
}

// CodeDots sets out[j] = Σ_c q[c]·code_j[c] for the n rows j of codes
// (row j at codes[j·rb:], hd = len(q) codes of bits bits, unsigned),
// float32 accumulation. out has at least n elements. It panics (a
// programmer error) on a width other than 2, 4, 8 or CodeS8, a head dim
// that splits a byte, or too few code bytes.
func CodeDots(out, q []float32, codes []byte, bits, rb, n int) {
	hd := len(q)
	checkCodes("CodeDots", hd, bits, n, rb, len(codes))
	if n <= 0 {
		return
	}
	out = out[:n]
	if CodeRowsFast(hd) {
		sh := &codeShifts[max(bits, 0)][0]
		switch bits {
		case 2:
			codeDots2AVX2(&out[0], &q[0], &codes[0], n, hd, rb, sh)
		case 4:
			codeDots4AVX2(&out[0], &q[0], &codes[0], n, hd, rb, sh)
		case CodeS8:
			codeDotsS8AVX2(&out[0], &q[0], &codes[0], n, hd, rb, sh)
		default:
			codeDots8AVX2(&out[0], &q[0], &codes[0], n, hd, rb, sh)
		}
		return
	}
	for j := range out {
		row := codes[j*rb:]
		var s float32
		for c, qc := range q {
			s += qc * rowCode(row, c, bits)
		}
		out[j] = s
	}
}

// CodeAxpy adds Σ_j w[j]·code_j[c] to acc[c] for c < hd = len(acc), over
// the n rows j of codes (as in CodeDots), float32 accumulation (in
// assembly the sum over j runs in registers and is added to acc once).
// w has at least n elements. It panics as CodeDots does.
func CodeAxpy(acc, w []float32, codes []byte, bits, rb, n int) {
	hd := len(acc)
	checkCodes("CodeAxpy", hd, bits, n, rb, len(codes))
	if n <= 0 {
		return
	}
	w = w[:n]
	if CodeRowsFast(hd) {
		sh := &codeShifts[max(bits, 0)][0]
		switch bits {
		case 2:
			codeAxpy2AVX2(&acc[0], &w[0], &codes[0], n, hd, rb, sh)
		case 4:
			codeAxpy4AVX2(&acc[0], &w[0], &codes[0], n, hd, rb, sh)
		case CodeS8:
			codeAxpyS8AVX2(&acc[0], &w[0], &codes[0], n, hd, rb, sh)
		default:
			codeAxpy8AVX2(&acc[0], &w[0], &codes[0], n, hd, rb, sh)
		}
		return
	}
	for j, wj := range w {
		row := codes[j*rb:]
		for c := range acc {
			acc[c] += wj * rowCode(row, c, bits)
		}
	}
}
