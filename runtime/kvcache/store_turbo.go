package kvcache

import (
	"fmt"
	"math"
	"sync"

	"github.com/lmpack/lmpack/quantize/kvq"
)

// vLLM's TurboQuant KV cache presets (vllm/model_executor/layers/
// quantization/turboquant/config.py and centroids.py, the store and
// decode kernels in vllm/v1/attention/ops/triton_turboquant_*.py;
// docs/METHODS.md §3). Per (token, kv head), with d = head_dim:
//
//	keys, MSE mode (b_K = 3 or 4): n = ‖k‖₂, y = (k/(n+1e-8))·H with H the
//	  normalized Sylvester Hadamard matrix (vLLM's current backend uses
//	  it for every layer; earlier versions used a seeded Haar-random QR
//	  matrix, which METHODS §3 describes), code_i = number of Lloyd–Max
//	  midpoints ≤ y_i (the nearest of the 2^b_K centroids for N(0, 1/d)),
//	  stored as a b_K-bit LSB-first stream, then fp16 n:
//	  ⌈d·b_K/8⌉ + 2 bytes. Decode: c = centroid[code]; "nc" (norm
//	  correction) divides c by √(Σc² + 1e-16); k̂ = n̂·c·H.
//	keys, FP8 mode (k8v4): the key cast to FP8 E4M3 without a scale
//	  (saturating at ±448): d bytes.
//	values (b_V = 3 or 4): lo = min v, s = max((max v − lo)/(2^b_V − 1),
//	  1e-8), code = clamp(⌊(v − lo)/s + 0.5⌋, 0, 2^b_V − 1), b_V-bit
//	  stream, fp16 s, fp16 lo: ⌈d·b_V/8⌉ + 4 bytes; v̂ = code·ŝ + lô.
//
// vLLM packs K and V of a head into one slot rounded up to an even size
// (slot_size_aligned); the padding byte, when there is one, is counted
// with V. Boundary layers: vLLM leaves the first n and last n layers
// unquantized, n = min(2, ⌊layers/2⌋) (TurboQuantConfig.
// get_boundary_skip_layers, applied to every preset); those layers hold
// binary16 rows (the model dtype, 2 bytes per element). On a model of ≤ 4
// layers no layer is quantized; the "-all" variants, not vLLM presets,
// quantize every layer to make the format comparable there.

// turboPreset is one TurboQuant preset.
type turboPreset struct {
	kBits, vBits int  // kBits 8: FP8 keys
	nc           bool // norm correction
	skip         bool // vLLM's boundary-layer rule
}

// turboBoundary reports whether vLLM leaves layer i of n unquantized.
func turboBoundary(i, n int) bool {
	b := min(2, n/2)
	return i < b || i >= n-b
}

func turboCheck(_ int, l Layer) error {
	if !isPow2(l.HeadDim) || l.HeadDim < 8 {
		return fmt.Errorf("head_dim %d is not a power of two ≥ 8 (TurboQuant's Hadamard rotation and 3-bit packing)", l.HeadDim)
	}
	return nil
}

func turboSpec(p turboPreset) spec {
	return rowSpec(func(i, n int, l Layer) (rowCodec, rowCodec) {
		if p.skip && turboBoundary(i, n) {
			return nil, nil
		}
		d := l.HeadDim
		v := &turboValueCodec{bits: p.vBits, hd: d, codes: make([]uint8, d)}
		var k rowCodec
		if p.kBits == 8 {
			k = &fp8Codec{hd: d, scale: 1}
		} else {
			cb := lloydMaxCodebook(d, p.kBits)
			k = &turboKeyCodec{bits: p.kBits, hd: d, nc: p.nc, cb: cb, y: make([]float32, d), codes: make([]uint8, d)}
		}
		if (k.rowBytes()+v.rowBytes())%2 != 0 {
			v.pad = 1
		}
		return k, v
	}, turboCheck)
}

// lmCodebook is the b-bit Lloyd–Max quantizer for N(0, 1/d): centroids
// (2^b, ascending) and midpoints (2^b − 1), float32 as vLLM keeps them.
type lmCodebook struct {
	centroids, midpoints []float32
}

var (
	lmMu    sync.Mutex
	lmCache = map[[2]int]*lmCodebook{}
)

// lloydMaxCodebook returns the codebook for (d, bits), computed once:
// vLLM's solve_lloyd_max (centroids.py): start from 2^b points evenly
// spread over ±3.5σ (σ = 1/√d), then at most 200 Lloyd iterations — cell
// edges at the midpoints, outer edges ±10.5σ, each centroid the
// conditional mean of its cell by the trapezoid rule with 200 intervals —
// stopping when no centroid moves by 1e-10 or more. Midpoints are taken
// in float32 from the float32 centroids, as the backend does.
func lloydMaxCodebook(d, bits int) *lmCodebook {
	lmMu.Lock()
	defer lmMu.Unlock()
	if cb, ok := lmCache[[2]int{d, bits}]; ok {
		return cb
	}
	n := 1 << bits
	s2 := 1 / float64(d)
	sigma := math.Sqrt(s2)
	pdf := func(x float64) float64 { return math.Exp(-x*x/(2*s2)) / math.Sqrt(2*math.Pi*s2) }
	trapz := func(f func(float64) float64, a, b float64) float64 {
		const m = 200
		h := (b - a) / m
		r := 0.5 * (f(a) + f(b))
		for i := 1; i < m; i++ {
			r += f(a + float64(i)*h)
		}
		return r * h
	}
	lo, hi := -3.5*sigma, 3.5*sigma
	c := make([]float64, n)
	for i := range c {
		c[i] = lo + (hi-lo)*(float64(i)+0.5)/float64(n)
	}
	for it := 0; it < 200; it++ {
		edges := make([]float64, n+1)
		edges[0], edges[n] = 3*lo, 3*hi
		for i := 1; i < n; i++ {
			edges[i] = (c[i-1] + c[i]) / 2
		}
		next := make([]float64, n)
		var moved float64
		for i := range next {
			a, b := edges[i], edges[i+1]
			num := trapz(func(x float64) float64 { return x * pdf(x) }, a, b)
			den := trapz(pdf, a, b)
			next[i] = c[i]
			if den > 1e-15 {
				next[i] = num / den
			}
			moved = max(moved, math.Abs(next[i]-c[i]))
		}
		if moved < 1e-10 {
			break
		}
		c = next
	}
	cb := &lmCodebook{centroids: make([]float32, n), midpoints: make([]float32, n-1)}
	for i, x := range c {
		cb.centroids[i] = float32(x)
	}
	for i := range cb.midpoints {
		cb.midpoints[i] = (cb.centroids[i] + cb.centroids[i+1]) / 2
	}
	lmCache[[2]int{d, bits}] = cb
	return cb
}

// code returns the number of midpoints ≤ y (vLLM's bucketize: y ≥ mid
// goes right), the index of the nearest centroid.
func (cb *lmCodebook) code(y float32) uint8 {
	lo, hi := 0, len(cb.midpoints)
	for lo < hi {
		m := (lo + hi) / 2
		if y >= cb.midpoints[m] {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return uint8(lo)
}

// turboKeyCodec is a TurboQuant MSE key row: b-bit codes then fp16 norm.
type turboKeyCodec struct {
	bits, hd int
	nc       bool
	cb       *lmCodebook
	y        []float32 // scratch [hd]
	codes    []uint8   // scratch [hd]
}

func (c *turboKeyCodec) rowBytes() int { return (c.hd*c.bits+7)/8 + 2 }

func (c *turboKeyCodec) encode(dst []byte, x []float32) {
	encodeTurboKey(dst, x, c.bits, c.cb, c.y, c.codes)
}

func (c *turboKeyCodec) decode(dst []float32, src []byte) {
	decodeTurboKey(dst, src, c.bits, c.nc, c.cb, c.codes)
}

// encodeTurboKey writes the TurboQuant key encoding of x ([d]) into dst
// (⌈d·bits/8⌉ + 2 bytes); y and codes are [d] scratch.
func encodeTurboKey(dst []byte, x []float32, bits int, cb *lmCodebook, y []float32, codes []uint8) {
	d := len(x)
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	n := float32(math.Sqrt(s))
	for i, v := range x {
		y[i] = v / (n + 1e-8)
	}
	kvq.FWHT(y[:d])
	for i, v := range y[:d] {
		codes[i] = cb.code(v)
	}
	mb := (d*bits + 7) / 8
	packBits(dst[:mb], codes[:d], bits)
	putF16(dst[mb:], n)
}

// decodeTurboKey writes the key that src encodes into dst ([d]); codes is
// [d] scratch.
func decodeTurboKey(dst []float32, src []byte, bits int, nc bool, cb *lmCodebook, codes []uint8) {
	d := len(dst)
	mb := (d*bits + 7) / 8
	unpackBits(codes[:d], src[:mb], bits)
	n := getF16(src[mb:])
	var s float64
	for i, c := range codes[:d] {
		v := cb.centroids[c]
		dst[i] = v
		s += float64(v) * float64(v)
	}
	scale := n
	if nc {
		scale = n * float32(1/math.Sqrt(s+1e-16))
	}
	for i := range dst {
		dst[i] *= scale
	}
	kvq.FWHT(dst)
}

// turboValueCodec is a TurboQuant value row: b-bit codes, fp16 scale,
// fp16 min, pad bytes.
type turboValueCodec struct {
	bits, hd, pad int
	codes         []uint8 // scratch [hd]
}

func (c *turboValueCodec) rowBytes() int { return (c.hd*c.bits+7)/8 + 4 + c.pad }

func (c *turboValueCodec) encode(dst []byte, x []float32) {
	encodeTurboValue(dst, x, c.bits, c.codes)
}

func (c *turboValueCodec) decode(dst []float32, src []byte) {
	decodeTurboValue(dst, src, c.bits, c.codes)
}

// encodeTurboValue writes the TurboQuant value encoding of x ([d]) into
// dst (⌈d·bits/8⌉ + 4 bytes); codes is [d] scratch.
func encodeTurboValue(dst []byte, x []float32, bits int, codes []uint8) {
	d := len(x)
	lo, hi := kvq.MinMax(x)
	top := float32(int(1)<<bits - 1)
	s := (hi - lo) / top
	if !(s > 1e-8) {
		s = 1e-8
	}
	for i, v := range x {
		q := float32(math.Floor(float64((v-lo)/s + 0.5)))
		codes[i] = uint8(min(max(q, 0), top))
	}
	mb := (d*bits + 7) / 8
	packBits(dst[:mb], codes[:d], bits)
	putF16(dst[mb:], s)
	putF16(dst[mb+2:], lo)
}

// decodeTurboValue writes the value that src encodes into dst ([d]).
func decodeTurboValue(dst []float32, src []byte, bits int, codes []uint8) {
	d := len(dst)
	mb := (d*bits + 7) / 8
	unpackBits(codes[:d], src[:mb], bits)
	s, lo := getF16(src[mb:]), getF16(src[mb+2:])
	for i, q := range codes[:d] {
		dst[i] = float32(q)*s + lo
	}
}
