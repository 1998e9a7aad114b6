package kvcache

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/lmpack/lmpack/quantize/kvq"
)

// vLLM's fp8 and int4_per_token_head KV caches (docs/METHODS.md §3).
//
// fp8 (kv_cache_dtype "fp8" = fp8_e4m3, FP8_PER_TENSOR): every element is
// stored as FP8 E4M3 of x/scale (round to nearest even, saturating at
// ±448) and read as e4m3·scale, 1 byte per element. The scale is per
// tensor (one for K, one for V, per layer); vLLM uses 1.0 unless the
// checkpoint carries k_scale/v_scale or --calculate-kv-scales estimates
// them from the first batch (amax/200 for K, amax/100 for V). Checkpoints
// here carry none, so the scale is vLLM's default 1.0 (kept in the
// engine's model state, not in the cache: not counted in Bytes).
//
// int4_per_token_head (INT4_PER_TOKEN_HEAD, vllm/v1/attention/ops/
// triton_quant_kv/packed_per_token_head.py and _hadamard.py): each
// (token, kv head) row x of head_dim d is rotated by the randomized
// Hadamard transform y = H_d·(D∘x) (H_d the unnormalized Sylvester
// matrix, entries ±1, D a fixed ±1 sign vector), then quantized
// asymmetric 4-bit: s = max((max y − min y)/15, 1e-6), zp = clamp(
// round(−min y/s), 0, 15), q = clamp(round(y/s + zp), 0, 15) (round:
// halves away from zero), two codes per byte (even index in the low
// nibble), and one float32 whose bits are those of s with the low 4
// mantissa bits replaced by zp: d/2 + 4 bytes. Decode: s̃ = s with those
// bits cleared, ŷ = (q − zp)·s̃, x̂ = D∘(H_d·ŷ)/d. vLLM draws D with
// torch.bernoulli from a seeded CPU generator; here D comes from a fixed
// PCG seed (a different but equally fixed sign pattern), and the rotated
// rows stay float32 (vLLM casts them back to the model dtype).

// fp8Codec is a row of FP8 E4M3 values of x/scale.
type fp8Codec struct {
	hd    int
	scale float32
}

func (c *fp8Codec) rowBytes() int { return c.hd }

func (c *fp8Codec) encode(dst []byte, x []float32) {
	inv := 1 / c.scale
	for i, v := range x {
		dst[i] = kvq.F8E4M3FromFloat32(v * inv)
	}
}

func (c *fp8Codec) decode(dst []float32, src []byte) {
	for i := range dst {
		dst[i] = kvq.F8E4M3ToFloat32(src[i]) * c.scale
	}
}

// fp8Spec is vLLM's fp8 cache with the uncalibrated per-tensor scale 1.0.
func fp8Spec() spec {
	return rowSpec(func(_, _ int, l Layer) (rowCodec, rowCodec) {
		return &fp8Codec{hd: l.HeadDim, scale: 1}, &fp8Codec{hd: l.HeadDim, scale: 1}
	}, func(int, Layer) error { return nil })
}

// rhtSigns returns the fixed ±1 sign vector D of the randomized Hadamard
// transform at head_dim d.
func rhtSigns(d int) []float32 {
	rng := rand.New(rand.NewPCG(0x9E3779B9, uint64(d)))
	s := make([]float32, d)
	for i := range s {
		s[i] = 1
		if rng.IntN(2) == 0 {
			s[i] = -1
		}
	}
	return s
}

func int4PTHSpec() spec {
	return rowSpec(func(_, _ int, l Layer) (rowCodec, rowCodec) {
		d := l.HeadDim
		signs := rhtSigns(d)
		return &int4PTHCodec{hd: d, signs: signs, y: make([]float32, d)}, &int4PTHCodec{hd: d, signs: signs, y: make([]float32, d)}
	}, func(_ int, l Layer) error {
		if !isPow2(l.HeadDim) || l.HeadDim < 2 {
			return fmt.Errorf("head_dim %d is not a power of two ≥ 2 (int4_per_token_head's Hadamard transform)", l.HeadDim)
		}
		return nil
	})
}

// int4PTHCodec is an int4_per_token_head row.
type int4PTHCodec struct {
	hd    int
	signs []float32
	y     []float32 // scratch [hd]
}

func (c *int4PTHCodec) rowBytes() int { return c.hd/2 + 4 }

// rht writes H_d·(D∘x) into y (unnormalized: ‖y‖ = √d·‖x‖).
func (c *int4PTHCodec) rht(y, x []float32) {
	for i, v := range x {
		y[i] = v * c.signs[i]
	}
	kvq.FWHT(y)
	r := float32(math.Sqrt(float64(len(y))))
	for i := range y {
		y[i] *= r
	}
}

func (c *int4PTHCodec) encode(dst []byte, x []float32) {
	c.rht(c.y, x)
	encodeInt4PTH(dst, c.y)
}

func (c *int4PTHCodec) decode(dst []float32, src []byte) {
	decodeInt4PTH(dst, src)
	// x = D∘(H_d·ŷ)/d = D∘(H_n·ŷ)/√d with H_n the normalized matrix.
	kvq.FWHT(dst)
	r := float32(1 / math.Sqrt(float64(len(dst))))
	for i := range dst {
		dst[i] *= r * c.signs[i]
	}
}

// int4PTHParams returns vLLM's int4 scale and zero point for a rotated row
// with range [lo, hi].
func int4PTHParams(lo, hi float32) (s, zp float32) {
	s = max((hi-lo)/15, 1e-6)
	zp = min(max(roundAway(-lo/s), 0), 15)
	return s, zp
}

// encodeInt4PTH writes the int4_per_token_head encoding of the rotated row
// y ([d], d even) into dst (d/2 + 4 bytes).
func encodeInt4PTH(dst []byte, y []float32) {
	d := len(y)
	lo, hi := kvq.MinMax(y)
	s, zp := int4PTHParams(lo, hi)
	inv := 1 / s
	for j := 0; j < d/2; j++ {
		q0 := min(max(roundAway(y[2*j]*inv+zp), 0), 15)
		q1 := min(max(roundAway(y[2*j+1]*inv+zp), 0), 15)
		dst[j] = uint8(q0) | uint8(q1)<<4
	}
	bits := math.Float32bits(s)&^0xF | uint32(zp)
	dst[d/2], dst[d/2+1], dst[d/2+2], dst[d/2+3] = uint8(bits), uint8(bits>>8), uint8(bits>>16), uint8(bits>>24)
}

// decodeInt4PTH writes the rotated row ŷ that src encodes into dst ([d]).
func decodeInt4PTH(dst []float32, src []byte) {
	d := len(dst)
	bits := uint32(src[d/2]) | uint32(src[d/2+1])<<8 | uint32(src[d/2+2])<<16 | uint32(src[d/2+3])<<24
	zp := float32(bits & 0xF)
	s := math.Float32frombits(bits &^ 0xF)
	for j := 0; j < d/2; j++ {
		b := src[j]
		dst[2*j] = (float32(b&15) - zp) * s
		dst[2*j+1] = (float32(b>>4) - zp) * s
	}
}
