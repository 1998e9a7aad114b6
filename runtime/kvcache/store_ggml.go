package kvcache

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/quantize/kvq"
)

// llama.cpp's quantized KV cache types q8_0 and q4_0 (ggml-quants.c
// quantize_row_q8_0_ref / quantize_row_q4_0_ref, which the CPU and CUDA
// copy kernels f32 → q8_0/q4_0 reproduce), and the Hadamard rotation that
// llama.cpp applies to q, k and v when the cache type is quantized
// (llama-kv-cache.cpp, PR #21038; docs/METHODS.md §3). A head's row of
// head_dim values is head_dim/32 blocks of 32 consecutive values:
//
//	q8_0  block = fp16 d, 32 × int8 q;   d = max|x|/127, q = round(x/d)
//	      (half away from zero), x̂ = q·d̂               34 bytes / 32 values
//	q4_0  block = fp16 d, 16 bytes of nibbles; m = the value of largest |x|
//	      (sign kept), d = m/−8, q = min(15, ⌊x/d + 8.5⌋), x̂ = (q−8)·d̂;
//	      byte j holds q[j] (low nibble) and q[j+16] (high)  18 bytes / 32
//
// with d̂ the binary16 rounding of d (the codes use the float32 d, as
// ggml does). head_dim must be a multiple of 32: llama.cpp refuses
// otherwise ("K cache type … with block size 32 does not divide
// n_embd_head_k").
//
// Rotation: when head_dim is a multiple of 64, llama.cpp rotates K (and
// q) with the normalized Sylvester Hadamard matrix of size n_K, the
// largest power of two ≥ 64 dividing head_dim, applied to each run of n_K
// consecutive values of a head, and V with the size-64 matrix (the
// attention output is rotated back). Here the codec rotates before
// encoding and rotates back after decoding (the matrix is symmetric and
// orthogonal, its own inverse), which gives attention the same scores
// and outputs.

const ggmlBlock = 32

// ggmlCheck refuses head_dims that llama.cpp refuses.
func ggmlCheck(_ int, l Layer) error {
	if l.HeadDim%ggmlBlock != 0 {
		return fmt.Errorf("head_dim %d is not a multiple of 32 (llama.cpp's block size for q8_0/q4_0 KV)", l.HeadDim)
	}
	return nil
}

// ggmlRotK and ggmlRotV return llama.cpp's Hadamard block sizes for K and
// V at head_dim d (0: no rotation).
func ggmlRotK(d int) int {
	if d%64 != 0 {
		return 0
	}
	n := 64
	for d%(2*n) == 0 {
		n *= 2
	}
	return n
}

func ggmlRotV(d int) int {
	if d%64 != 0 {
		return 0
	}
	return 64
}

// ggmlSpec returns the q8_0 (bits 8) or q4_0 (bits 4) method.
func ggmlSpec(bits int) spec {
	return rowSpec(func(_, _ int, l Layer) (rowCodec, rowCodec) {
		return &ggmlCodec{bits: bits, hd: l.HeadDim, rot: ggmlRotK(l.HeadDim), x: make([]float32, l.HeadDim)},
			&ggmlCodec{bits: bits, hd: l.HeadDim, rot: ggmlRotV(l.HeadDim), x: make([]float32, l.HeadDim)}
	}, ggmlCheck)
}

// ggmlCodec is a q8_0 or q4_0 row of head_dim values, Hadamard-rotated in
// blocks of rot (0: none) before encoding.
type ggmlCodec struct {
	bits, hd, rot int
	x             []float32 // scratch [hd]
}

func (c *ggmlCodec) blockBytes() int {
	if c.bits == 8 {
		return 2 + ggmlBlock
	}
	return 2 + ggmlBlock/2
}

func (c *ggmlCodec) rowBytes() int { return c.hd / ggmlBlock * c.blockBytes() }

func (c *ggmlCodec) rotate(x []float32) {
	if c.rot == 0 {
		return
	}
	for i := 0; i < len(x); i += c.rot {
		kvq.FWHT(x[i : i+c.rot])
	}
}

func (c *ggmlCodec) encode(dst []byte, x []float32) {
	copy(c.x, x)
	c.rotate(c.x)
	bb := c.blockBytes()
	for b := 0; b < c.hd/ggmlBlock; b++ {
		xb, db := c.x[b*ggmlBlock:(b+1)*ggmlBlock], dst[b*bb:(b+1)*bb]
		if c.bits == 8 {
			encodeQ8_0(db, xb)
		} else {
			encodeQ4_0(db, xb)
		}
	}
}

func (c *ggmlCodec) decode(dst []float32, src []byte) {
	bb := c.blockBytes()
	for b := 0; b < c.hd/ggmlBlock; b++ {
		xb, sb := dst[b*ggmlBlock:(b+1)*ggmlBlock], src[b*bb:(b+1)*bb]
		if c.bits == 8 {
			decodeQ8_0(xb, sb)
		} else {
			decodeQ4_0(xb, sb)
		}
	}
	c.rotate(dst[:c.hd])
}

// putF16 and getF16 store a binary16 little-endian, as ggml_half.
func putF16(dst []byte, f float32) {
	h := kvq.F16FromFloat32(f)
	dst[0], dst[1] = uint8(h), uint8(h>>8)
}

func getF16(src []byte) float32 { return kvq.F16ToFloat32(uint16(src[0]) | uint16(src[1])<<8) }

// roundAway is C's roundf: nearest integer, halves away from zero.
func roundAway(x float32) float32 { return float32(math.Round(float64(x))) }

// encodeQ8_0 writes block_q8_0 of x ([32] float32) into dst (34 bytes:
// fp16 d, then 32 int8 codes).
func encodeQ8_0(dst []byte, x []float32) {
	var amax float32
	for _, v := range x[:ggmlBlock] {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16(dst, d)
	for j, v := range x[:ggmlBlock] {
		dst[2+j] = uint8(int8(roundAway(v * id)))
	}
}

// decodeQ8_0 writes the 32 values of block_q8_0 src into dst.
func decodeQ8_0(dst []float32, src []byte) {
	d := getF16(src)
	for j := range dst[:ggmlBlock] {
		dst[j] = float32(int8(src[2+j])) * d
	}
}

// encodeQ4_0 writes block_q4_0 of x ([32] float32) into dst (18 bytes:
// fp16 d, then 16 bytes; byte j = q[j] | q[j+16]<<4).
func encodeQ4_0(dst []byte, x []float32) {
	var amax, m float32
	for _, v := range x[:ggmlBlock] {
		if a := float32(math.Abs(float64(v))); amax < a {
			amax, m = a, v
		}
	}
	d := m / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16(dst, d)
	for j := 0; j < ggmlBlock/2; j++ {
		q0 := min(15, int8(x[j]*id+8.5))
		q1 := min(15, int8(x[j+ggmlBlock/2]*id+8.5))
		dst[2+j] = uint8(q0) | uint8(q1)<<4
	}
}

// decodeQ4_0 writes the 32 values of block_q4_0 src into dst.
func decodeQ4_0(dst []float32, src []byte) {
	d := getF16(src)
	for j := 0; j < ggmlBlock/2; j++ {
		b := src[2+j]
		dst[j] = float32(int(b&15)-8) * d
		dst[j+ggmlBlock/2] = float32(int(b>>4)-8) * d
	}
}
