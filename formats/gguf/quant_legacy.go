package gguf

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// The 32-element block types Q8_0, Q4_0 and Q4_1 (ggml-common.h block_q8_0,
// block_q4_0, block_q4_1), their reference quantizers (ggml-quants.c
// quantize_row_q8_0_ref, quantize_row_q4_0_ref, quantize_row_q4_1_ref) and
// builders that write lmpack's own integer codes into them without
// requantising.

// qk is the block size of Q4_0, Q4_1 and Q8_0 (ggml-common.h QK4_0 = QK4_1 =
// QK8_0 = 32).
const qk = 32

func putHalf(b []byte, h uint16) { binary.LittleEndian.PutUint16(b, h) }
func half(b []byte) float32      { return safetensors.F16ToFloat32(binary.LittleEndian.Uint16(b)) }

// scaleHalf rounds a block scale to fp16 and refuses one beyond its range.
func scaleHalf(what string, v float32) (uint16, error) {
	h := safetensors.F16FromFloat32(v)
	if !halfFinite(h) {
		return 0, fmt.Errorf("%w: %s %g does not fit in fp16 (max 65504)", ErrValue, what, v)
	}
	return h, nil
}

// quantizeQ8_0 is quantize_row_q8_0_ref for one block: d = max|x|/127,
// qs = round(x/d) (half away from zero), so |x − d·qs| ≤ d/2 up to the
// fp16 rounding of d.
func quantizeQ8_0(dst []byte, x []float32) error {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	h, err := scaleHalf("scale d", d)
	if err != nil {
		return err
	}
	putHalf(dst, h)
	for j, v := range x {
		dst[2+j] = byte(int8(math.Round(float64(v * id))))
	}
	return nil
}

func dequantizeQ8_0(dst []float32, b []byte) {
	d := half(b)
	for j := range dst {
		dst[j] = float32(int8(b[2+j])) * d
	}
}

// quantizeQ4_0 is quantize_row_q4_0_ref for one block: d = m/−8 with m the
// element of largest magnitude (so m itself maps to nibble 0), nibble =
// min(15, trunc(x/d + 8.5)).
func quantizeQ4_0(dst []byte, x []float32) error {
	var amax, mx float32
	for _, v := range x {
		if a := float32(math.Abs(float64(v))); amax < a {
			amax, mx = a, v
		}
	}
	d := mx / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	h, err := scaleHalf("scale d", d)
	if err != nil {
		return err
	}
	putHalf(dst, h)
	code := func(v float32) byte {
		c := int(float32(v*id) + 8.5) // truncation toward zero, as the C (int8_t) cast
		return byte(min(15, max(0, c)))
	}
	for j := 0; j < qk/2; j++ {
		dst[2+j] = code(x[j]) | code(x[j+qk/2])<<4
	}
	return nil
}

func dequantizeQ4_0(dst []float32, b []byte) {
	d := half(b)
	for j := 0; j < qk/2; j++ {
		q := b[2+j]
		dst[j] = float32(int(q&0xf)-8) * d
		dst[j+qk/2] = float32(int(q>>4)-8) * d
	}
}

// quantizeQ4_1 is quantize_row_q4_1_ref for one block: d = (max−min)/15,
// m = min, nibble = min(15, trunc((x − min)/d + 0.5)).
func quantizeQ4_1(dst []byte, x []float32) error {
	lo, hi := float32(math.MaxFloat32), float32(-math.MaxFloat32)
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	d := (hi - lo) / 15
	var id float32
	if d != 0 {
		id = 1 / d
	}
	hd, err := scaleHalf("scale d", d)
	if err != nil {
		return err
	}
	hm, err := scaleHalf("min m", lo)
	if err != nil {
		return err
	}
	putHalf(dst, hd)
	putHalf(dst[2:], hm)
	code := func(v float32) byte {
		c := int(float32((v-lo)*id) + 0.5)
		return byte(min(15, max(0, c)))
	}
	for j := 0; j < qk/2; j++ {
		dst[4+j] = code(x[j]) | code(x[j+qk/2])<<4
	}
	return nil
}

func dequantizeQ4_1(dst []float32, b []byte) {
	d, m := half(b), half(b[2:])
	for j := 0; j < qk/2; j++ {
		q := b[4+j]
		dst[j] = float32(q&0xf)*d + m
		dst[j+qk/2] = float32(q>>4)*d + m
	}
}

// checkCodes validates the common arguments of the FromCodes builders:
// n codes in blocks of 32, one fp16 scale per block, finite.
func checkCodes(n int, scales []uint16, what string) error {
	if n == 0 || n%qk != 0 {
		return fmt.Errorf("%w: %d codes, want a positive multiple of %d", ErrShape, n, qk)
	}
	if len(scales) != n/qk {
		return fmt.Errorf("%w: %d codes need %d %s (one per block of %d), got %d", ErrShape, n, n/qk, what, qk, len(scales))
	}
	for i, s := range scales {
		if !halfFinite(s) {
			return fmt.Errorf("%w: %s of block %d is fp16 %#04x, not finite", ErrValue, what, i, s)
		}
	}
	return nil
}

// Q8_0FromCodes writes signed 8-bit codes with one fp16 scale per 32
// consecutive codes as Q8_0 blocks, without requantising: block b is
// d = scales[b], qs = codes[32b : 32b+32], so it decodes to exactly
// float32(d)·q. codes: [32·B] int8 (all of [−128, 127] is valid; ggml's own
// quantizer uses [−127, 127]); scales: [B] fp16 bits, finite. lmpack's
// symmetric 8-bit code c with zero-point 128 is q = c − 128.
// Errors: ErrShape (lengths), ErrValue (a non-finite scale).
func Q8_0FromCodes(codes []int8, scales []uint16) ([]byte, error) {
	if err := checkCodes(len(codes), scales, "scales"); err != nil {
		return nil, err
	}
	out := make([]byte, len(scales)*34)
	for b, s := range scales {
		blk := out[b*34 : (b+1)*34]
		putHalf(blk, s)
		for j, c := range codes[b*qk : (b+1)*qk] {
			blk[2+j] = byte(c)
		}
	}
	return out, nil
}

// Q4_0FromCodes writes unsigned 4-bit codes (the stored nibbles, each in
// [0, 15]) with one fp16 scale per 32 consecutive codes as Q4_0 blocks,
// without requantising: block b decodes to float32(scales[b])·(c − 8)
// exactly. That is lmpack's symmetric 4-bit grid as it stands (codes with
// the implicit zero-point 8: ŵ = s·(c − 8)), so its codes pass unchanged.
// codes: [32·B] uint8; scales: [B] fp16 bits, finite.
// Errors: ErrShape (lengths), ErrValue (a code above 15 or a non-finite
// scale).
func Q4_0FromCodes(codes []uint8, scales []uint16) ([]byte, error) {
	if err := checkCodes(len(codes), scales, "scales"); err != nil {
		return nil, err
	}
	out := make([]byte, len(scales)*18)
	for b, s := range scales {
		blk := out[b*18 : (b+1)*18]
		putHalf(blk, s)
		if err := packNibbles(blk[2:], codes[b*qk:(b+1)*qk], b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Q4_1FromCodes writes unsigned 4-bit codes (nibbles in [0, 15]) with one
// fp16 scale d and one fp16 offset m per 32 consecutive codes as Q4_1
// blocks, without requantising: block b decodes to
// float32(d)·c + float32(m). For lmpack's asymmetric grid ŵ = s·(c − z)
// the offset is m = −s·z; Q4_1FromZeros computes it and says when fp16
// cannot hold it exactly. codes: [32·B] uint8; scales, mins: [B] fp16 bits,
// finite. Errors: ErrShape (lengths), ErrValue (a code above 15, a
// non-finite scale or offset).
func Q4_1FromCodes(codes []uint8, scales, mins []uint16) ([]byte, error) {
	if err := checkCodes(len(codes), scales, "scales"); err != nil {
		return nil, err
	}
	if err := checkCodes(len(codes), mins, "mins"); err != nil {
		return nil, err
	}
	out := make([]byte, len(scales)*20)
	for b := range scales {
		blk := out[b*20 : (b+1)*20]
		putHalf(blk, scales[b])
		putHalf(blk[2:], mins[b])
		if err := packNibbles(blk[4:], codes[b*qk:(b+1)*qk], b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// packNibbles packs 32 codes into 16 bytes: code j in the low nibble of
// byte j, code j+16 in its high nibble.
func packNibbles(dst []byte, codes []uint8, block int) error {
	for j, c := range codes {
		if c > 15 {
			return fmt.Errorf("%w: code %d of block %d is %d, want 0..15", ErrValue, j, block, c)
		}
	}
	for j := 0; j < qk/2; j++ {
		dst[j] = codes[j] | codes[j+qk/2]<<4
	}
	return nil
}

// Q4_1FromZeros is Q4_1FromCodes for lmpack's asymmetric grid
// ŵ = s·(c − z), with s = scales[b] and z = zeros[b] (fp16 bits; integer
// zero-points, or fractional at 1 bit). Q4_1 needs d = s and m = −s·(z+k)
// for nibbles c + k; fp16 holds s·z exactly only when it has at most 11
// significant bits (z a power of two times a small odd number, e.g. z ≤ 2
// always, z = 3 when s's mantissa is short). Per block the shift k in
// [−min c, 15 − max c] whose m is nearest to exact is used (k = 0 first),
// and errs[b] = m − (−s·(z+k)), the constant offset every element of block
// b then carries: |errs[b]| ≤ half an fp16 ulp of s·(z+k), at most
// 2^−11·s·(z+k) (≤ 15·2^−11·s ≈ 0.0073·s for 4-bit z ≤ 15). codes: [32·B]
// uint8 in [0, 15]. Errors: as Q4_1FromCodes, and ErrValue when −s·z is
// beyond fp16's range.
func Q4_1FromZeros(codes []uint8, scales, zeros []uint16) (blocks []byte, errs []float64, err error) {
	if err := checkCodes(len(codes), scales, "scales"); err != nil {
		return nil, nil, err
	}
	if err := checkCodes(len(codes), zeros, "zeros"); err != nil {
		return nil, nil, err
	}
	nb := len(scales)
	shifted := make([]uint8, len(codes))
	mins := make([]uint16, nb)
	errs = make([]float64, nb)
	for b := 0; b < nb; b++ {
		cs := codes[b*qk : (b+1)*qk]
		lo, hi := uint8(255), uint8(0)
		for _, c := range cs {
			lo, hi = min(lo, c), max(hi, c)
		}
		if hi > 15 {
			return nil, nil, fmt.Errorf("%w: a code of block %d is %d, want 0..15", ErrValue, b, hi)
		}
		s := float64(safetensors.F16ToFloat32(scales[b]))
		z := float64(safetensors.F16ToFloat32(zeros[b]))
		best, bestK, bestErr := uint16(0), 0, math.Inf(1)
		try := func(k int) {
			want := -s * (z + float64(k)) // exact in float64: 11 × 16 significant bits
			h := safetensors.F16FromFloat32(float32(want))
			if float64(float32(want)) != want {
				// float32 rounding first could double-round; fp16 of the
				// exact value via the neighbours of the float32 result.
				h = nearestHalf(want)
			}
			if !halfFinite(h) {
				return
			}
			e := float64(safetensors.F16ToFloat32(h)) - want
			if math.Abs(e) < math.Abs(bestErr) {
				best, bestK, bestErr = h, k, e
			}
		}
		try(0)
		for k := -int(lo); k <= 15-int(hi) && bestErr != 0; k++ {
			if k != 0 {
				try(k)
			}
		}
		if math.IsInf(bestErr, 1) {
			return nil, nil, fmt.Errorf("%w: block %d: offset −scale·zero = %g is beyond fp16's range", ErrValue, b, -s*z)
		}
		mins[b], errs[b] = best, bestErr
		for j, c := range cs {
			shifted[b*qk+j] = uint8(int(c) + bestK)
		}
	}
	blocks, err = Q4_1FromCodes(shifted, scales, mins)
	return blocks, errs, err
}

// nearestHalf returns the fp16 nearest to x (ties to even) without an
// intermediate float32 rounding.
func nearestHalf(x float64) uint16 {
	h := safetensors.F16FromFloat32(float32(x))
	best, bestD := h, math.Abs(float64(safetensors.F16ToFloat32(h))-x)
	for _, c := range []uint16{h - 1, h + 1} {
		if !halfFinite(c) || (c^h)&0x8000 != 0 {
			continue
		}
		d := math.Abs(float64(safetensors.F16ToFloat32(c)) - x)
		if d < bestD || (d == bestD && c&1 == 0) {
			best, bestD = c, d
		}
	}
	return best
}
