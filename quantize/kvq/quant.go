package kvq

import (
	"fmt"
	"math"
)

// MinMax returns the smallest and largest element of x (0, 0 for an empty
// x). NaN elements are skipped.
func MinMax(x []float32) (lo, hi float32) {
	if len(x) == 0 {
		return 0, 0
	}
	lo, hi = float32(math.Inf(1)), float32(math.Inf(-1))
	for _, v := range x {
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	if lo > hi { // all NaN
		return 0, 0
	}
	return lo, hi
}

// AbsMax returns max |x[i]| (0 for an empty x; NaN elements are skipped).
func AbsMax(x []float32) float32 {
	var m float32
	for _, v := range x {
		a := math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) // |v| without a branch
		if a > m {
			m = a
		}
	}
	return m
}

// AsymParams returns the asymmetric min-max parameters for values in
// [lo, hi] at the given width (docs/METHODS.md §1): scale = (hi−lo)/(2^bits−1),
// zero = −lo/scale, so that code = floor(x/scale + zero + 0.5) ∈
// [0, 2^bits−1] and x̂ = (code − zero)·scale. When hi == lo (or the range
// is too small for 1/scale to be finite) the row is constant: scale = |lo|,
// zero = −sign(lo), so code 0 decodes to lo exactly (scale 1, zero 0 for
// lo = 0). bits is 2, 4 or 8; it panics otherwise.
func AsymParams(lo, hi float32, bits int) (scale, zero float32) {
	checkBits("AsymParams", bits)
	qmax := float32(int(1)<<bits - 1)
	scale = (hi - lo) / qmax
	if scale > 0 && !math.IsInf(float64(1/scale), 0) && !math.IsInf(float64(scale), 0) {
		return scale, -lo / scale
	}
	switch {
	case lo > 0:
		return lo, -1
	case lo < 0:
		return -lo, 1
	}
	return 1, 0
}

// f16 limits used by AsymParamsF16.
const (
	f16Max       = 65504
	f16MinNormal = 1.0 / (1 << 14)
	// zeroLimit bounds |zero| so that it and its rounding stay finite in
	// binary16.
	zeroLimit = 32768
)

// AsymParamsF16 is AsymParams for a store that keeps scale and zero as
// binary16 (the KV caches): both returned values are exactly
// representable in binary16 (convert them with F16FromFloat32 without
// loss). The scale is raised to at least 2^-14 (the smallest normal half)
// and to |lo|/32768 so that zero stays finite, and rounded up, so codes
// still cover [lo, hi]; zero is then −lo/scale rounded to binary16. The
// reconstruction error of EncodeAsym/DecodeAsym with these parameters is
// at most scale/2 + |lo|·2^-11 (zero's rounding) plus float32 rounding, for
// lo, hi within the binary16 range (±65504; larger scales saturate).
func AsymParamsF16(lo, hi float32, bits int) (scale, zero float32) {
	checkBits("AsymParamsF16", bits)
	s, _ := AsymParams(lo, hi, bits)
	if s < f16MinNormal {
		s = f16MinNormal
	}
	if a := float32(math.Abs(float64(lo))) / zeroLimit; s < a {
		s = a
	}
	if s > f16Max {
		s = f16Max
	}
	s16 := RoundF16(s)
	if s16 < s {
		s16 = F16ToFloat32(F16FromFloat32(s) + 1) // next half up (s > 0)
	}
	return s16, RoundF16(-lo / s16)
}

// EncodeAsym writes the asymmetric codes of row x into codes, packed LSB
// first (PackedLen(len(x), bits) bytes): code = floor(x/scale + zero +
// 0.5) clamped to [0, 2^bits−1] (NaN → 0). scale must be > 0. It panics on
// a bad width or a short codes slice.
func EncodeAsym(codes []byte, x []float32, bits int, scale, zero float32) {
	checkBits("EncodeAsym", bits)
	if need := PackedLen(len(x), bits); len(codes) < need {
		panic(fmt.Sprintf("kvq: EncodeAsym: codes has %d bytes, want %d", len(codes), need))
	}
	inv := 1 / scale
	off := zero + 0.5
	qmax := float32(int(1)<<bits - 1)
	per := 8 / bits
	for i := 0; i < len(x); i += per {
		var b byte
		for j := 0; j < per && i+j < len(x); j++ {
			v := x[i+j]*inv + off
			if !(v >= 0) {
				v = 0
			} else if v > qmax {
				v = qmax
			}
			b |= byte(v) << (j * bits)
		}
		codes[i/per] = b
	}
}

// DecodeAsym dequantizes len(dst) codes from codes (packed LSB first):
// dst[i] = (code_i − zero)·scale. It panics on a bad width or a short
// codes slice.
func DecodeAsym(dst []float32, codes []byte, bits int, scale, zero float32) {
	checkBits("DecodeAsym", bits)
	if need := PackedLen(len(dst), bits); len(codes) < need {
		panic(fmt.Sprintf("kvq: DecodeAsym: codes has %d bytes, want %d", len(codes), need))
	}
	switch bits {
	case 2:
		lut := [4]float32{-zero * scale, (1 - zero) * scale, (2 - zero) * scale, (3 - zero) * scale}
		n4 := len(dst) &^ 3
		for i := 0; i < n4; i += 4 {
			b := codes[i>>2]
			d := dst[i : i+4 : i+4]
			d[0], d[1], d[2], d[3] = lut[b&3], lut[b>>2&3], lut[b>>4&3], lut[b>>6]
		}
		for i := n4; i < len(dst); i++ {
			dst[i] = lut[codes[i>>2]>>((i&3)*2)&3]
		}
	case 4:
		for i := range dst {
			c := codes[i>>1] >> ((i & 1) * 4) & 15
			dst[i] = (float32(c) - zero) * scale
		}
	default:
		for i := range dst {
			dst[i] = (float32(codes[i]) - zero) * scale
		}
	}
}

// QuantizeAsym quantizes row x with per-row asymmetric min-max parameters
// (AsymParams over MinMax(x)) into codes (PackedLen(len(x), bits) bytes)
// and returns scale and zero as float32. |x[i] − x̂[i]| ≤ scale/2 plus
// float32 rounding.
func QuantizeAsym(codes []byte, x []float32, bits int) (scale, zero float32) {
	lo, hi := MinMax(x)
	scale, zero = AsymParams(lo, hi, bits)
	EncodeAsym(codes, x, bits, scale, zero)
	return scale, zero
}

// symOffset returns the code offset of the symmetric grid and the smallest
// code used: levels are (code − off)·scale.
func symOffset(bits int) (off float32, cmin float32) {
	if bits == 2 {
		return 1.5, 0
	}
	return float32(int(1) << (bits - 1)), 1
}

// SymScale returns the symmetric scale for a row whose largest magnitude
// is absmax. For 4 and 8 bits the grid is the usual zero-centred one,
// levels k·scale for k ∈ [−(2^(b−1)−1), 2^(b−1)−1], scale =
// absmax/(2^(b−1)−1), stored as code k + 2^(b−1) (code 0 unused). For 2
// bits that grid would have only the three levels {−1, 0, 1}; this package
// uses the mid-rise grid {−1.5, −0.5, 0.5, 1.5}·scale with scale =
// absmax/1.5 instead (all four codes, symmetric, no zero level; code c
// means (c − 1.5)·scale). absmax = 0 gives scale 0 (the row decodes to
// zeros).
func SymScale(absmax float32, bits int) float32 {
	checkBits("SymScale", bits)
	if bits == 2 {
		return absmax / 1.5
	}
	return absmax / float32(int(1)<<(bits-1)-1)
}

// EncodeSym writes the symmetric codes of row x (grid of SymScale) into
// codes, packed LSB first: code = floor(x/scale + off + 0.5) clamped to
// the grid, off = 1.5 for 2 bits and 2^(b−1) otherwise. scale 0 writes the
// middle code. It panics on a bad width or a short codes slice.
func EncodeSym(codes []byte, x []float32, bits int, scale float32) {
	checkBits("EncodeSym", bits)
	if need := PackedLen(len(x), bits); len(codes) < need {
		panic(fmt.Sprintf("kvq: EncodeSym: codes has %d bytes, want %d", len(codes), need))
	}
	var inv float32
	if scale != 0 {
		inv = 1 / scale
	}
	off, cmin := symOffset(bits)
	off += 0.5
	qmax := float32(int(1)<<bits - 1)
	per := 8 / bits
	for i := 0; i < len(x); i += per {
		var b byte
		for j := 0; j < per && i+j < len(x); j++ {
			v := x[i+j]*inv + off
			if !(v >= cmin) {
				v = cmin
			} else if v > qmax {
				v = qmax
			}
			b |= byte(v) << (j * bits)
		}
		codes[i/per] = b
	}
}

// DecodeSym dequantizes len(dst) symmetric codes: dst[i] = (code_i −
// off)·scale with off as in EncodeSym. It panics on a bad width or a short
// codes slice.
func DecodeSym(dst []float32, codes []byte, bits int, scale float32) {
	checkBits("DecodeSym", bits)
	if need := PackedLen(len(dst), bits); len(codes) < need {
		panic(fmt.Sprintf("kvq: DecodeSym: codes has %d bytes, want %d", len(codes), need))
	}
	off, _ := symOffset(bits)
	per := 8 / bits
	mask := byte(1)<<bits - 1
	for i := range dst {
		c := codes[i/per] >> ((i % per) * bits) & mask
		dst[i] = (float32(c) - off) * scale
	}
}

// QuantizeSym quantizes row x symmetrically (SymScale of AbsMax(x)) into
// codes and returns the scale. |x[i] − x̂[i]| ≤ scale/2 plus rounding.
func QuantizeSym(codes []byte, x []float32, bits int) (scale float32) {
	scale = SymScale(AbsMax(x), bits)
	EncodeSym(codes, x, bits, scale)
	return scale
}

// checkBlock panics unless x holds a [t, d] block and codes its packed
// codes.
func checkBlock(fn string, x []float32, codes []byte, t, d, bits int, params ...[]float32) {
	checkBits(fn, bits)
	if t < 0 || d < 0 || len(x) < t*d {
		panic(fmt.Sprintf("kvq: %s: block [%d,%d] needs %d values, have %d", fn, t, d, t*d, len(x)))
	}
	if need := t * PackedLen(d, bits); len(codes) < need {
		panic(fmt.Sprintf("kvq: %s: codes has %d bytes, want %d", fn, len(codes), need))
	}
	for _, p := range params {
		if len(p) < d {
			panic(fmt.Sprintf("kvq: %s: per-channel parameters have %d entries, want %d", fn, len(p), d))
		}
	}
}

// ChannelMinMax computes, for a [t, d] row-major block x (t tokens, d
// channels), the per-channel minimum and maximum over the t tokens into
// lo, hi ([d] each). t = 0 gives zeros.
func ChannelMinMax(lo, hi []float32, x []float32, t, d int) {
	if len(lo) < d || len(hi) < d || len(x) < t*d {
		panic(fmt.Sprintf("kvq: ChannelMinMax: block [%d,%d] with %d values, lo %d, hi %d", t, d, len(x), len(lo), len(hi)))
	}
	if t == 0 {
		clear(lo[:d])
		clear(hi[:d])
		return
	}
	copy(lo[:d], x[:d])
	copy(hi[:d], x[:d])
	for r := 1; r < t; r++ {
		row := x[r*d : (r+1)*d]
		for c, v := range row {
			if v < lo[c] {
				lo[c] = v
			}
			if v > hi[c] {
				hi[c] = v
			}
		}
	}
}

// EncodeChannels quantizes a [t, d] row-major block x with per-channel
// parameters (scales, zeros: [d] float32; KIVI's per-channel key
// quantization, Liu et al. 2024, arXiv 2402.02750): element (r, c) gets
// code floor(x/scales[c] + zeros[c] + 0.5) clamped to [0, 2^bits−1].
// codes is [t, PackedLen(d, bits)]: each token row packed LSB first, so a
// token's codes are contiguous. It panics on bad shapes.
func EncodeChannels(codes []byte, x []float32, t, d, bits int, scales, zeros []float32) {
	checkBlock("EncodeChannels", x, codes, t, d, bits, scales, zeros)
	rb := PackedLen(d, bits)
	qmax := float32(int(1)<<bits - 1)
	per := 8 / bits
	var invBuf [256]float32
	inv := invBuf[:0]
	if d > len(invBuf) {
		inv = make([]float32, d)
	} else {
		inv = invBuf[:d]
	}
	for c := range inv {
		inv[c] = 1 / scales[c]
	}
	for r := 0; r < t; r++ {
		row := x[r*d : (r+1)*d]
		out := codes[r*rb : (r+1)*rb]
		for i := 0; i < d; i += per {
			var b byte
			for j := 0; j < per && i+j < d; j++ {
				v := row[i+j]*inv[i+j] + zeros[i+j] + 0.5
				if !(v >= 0) {
					v = 0
				} else if v > qmax {
					v = qmax
				}
				b |= byte(v) << (j * bits)
			}
			out[i/per] = b
		}
	}
}

// DecodeChannels dequantizes a [t, d] block written by EncodeChannels into
// dst ([t, d] row-major float32): dst[r,c] = (code − zeros[c])·scales[c].
// It panics on bad shapes.
func DecodeChannels(dst []float32, codes []byte, t, d, bits int, scales, zeros []float32) {
	checkBlock("DecodeChannels", dst, codes, t, d, bits, scales, zeros)
	rb := PackedLen(d, bits)
	per := 8 / bits
	mask := byte(1)<<bits - 1
	for r := 0; r < t; r++ {
		row := dst[r*d : (r+1)*d]
		in := codes[r*rb : (r+1)*rb]
		for c := range row {
			q := in[c/per] >> ((c % per) * bits) & mask
			row[c] = (float32(q) - zeros[c]) * scales[c]
		}
	}
}

// QuantizeChannels quantizes a [t, d] block per channel with asymmetric
// min-max parameters over the t tokens (AsymParams of ChannelMinMax),
// writing scales and zeros ([d] float32) and the codes
// ([t, PackedLen(d, bits)]). |x − x̂| ≤ scales[c]/2 plus rounding.
func QuantizeChannels(codes []byte, x []float32, t, d, bits int, scales, zeros []float32) {
	checkBlock("QuantizeChannels", x, codes, t, d, bits, scales, zeros)
	lo, hi := make([]float32, d), make([]float32, d)
	ChannelMinMax(lo, hi, x, t, d)
	for c := 0; c < d; c++ {
		scales[c], zeros[c] = AsymParams(lo[c], hi[c], bits)
	}
	EncodeChannels(codes, x, t, d, bits, scales, zeros)
}
