package kvcache

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// Layer gives the KV shape of one decoder layer: num_key_value_heads and
// head_dim. A token's key (and value) row in that layer is
// [NumKVHeads*HeadDim] float32, heads contiguous.
type Layer struct {
	NumKVHeads, HeadDim int
	// SlidingWindow is the layer's attention window in tokens, the query
	// included (arch.Layer.SlidingWindow; 0: full causal attention). The
	// cache stores every token either way (the runtime masks the older
	// ones); only ReadAt, which counts what a query reads, uses it.
	SlidingWindow int
}

// LayersOf returns the KV shape (and sliding window) of every layer of d,
// in layer order.
func LayersOf(d *arch.Description) []Layer {
	out := make([]Layer, len(d.Layers))
	for i, l := range d.Layers {
		out[i] = Layer{NumKVHeads: l.NumKVHeads, HeadDim: l.HeadDim, SlidingWindow: l.SlidingWindow}
	}
	return out
}

// Rotations are OSCAR's calibrated per-layer rotations and clipping
// ratios (docs/METHODS.md §1), computed offline by quantize/oscar.
type Rotations struct {
	// K and V hold one orthogonal matrix R per layer, [head_dim*head_dim]
	// row-major float32, shared by all KV heads of the layer: the cache
	// quantizes x_rot = x·R (x a [head_dim] row of one head) and
	// un-rotates on Read with x = x_rot·Rᵀ.
	K, V [][]float32
	// ClipK and ClipV hold one clipping ratio per layer, in (0, 1], for
	// the 2-bit sides (oscar2, and the 2-bit layers of oscar-mixed):
	// after the rotation each (token, head) row is clamped to ±τ with τ =
	// sorted(|x|)[⌊ratio·head_dim⌋] (kvq.Clip). OSCAR's published INT2
	// defaults are 0.96 and 0.92. nil means no clipping (ratio 1).
	ClipK, ClipV []float64
	// ClipK4, ClipV4 and ClipK8, ClipV8 are the same for the 4-bit
	// (oscar4) and 8-bit sides; nil (the default) means no clipping: the
	// INT2 ratios do not apply to wider codes.
	ClipK4, ClipV4, ClipK8, ClipV8 []float64
	// BitsK and BitsV give every layer's K and V width in {2, 4, 8} for
	// oscar-mixed (required there, ignored by oscar2 and oscar4).
	BitsK, BitsV []int
}

// clipFor returns the ratios of r for bits-bit K and V sides (nil: none).
func (r *Rotations) clipFor(bits int) (k, v []float64) {
	switch bits {
	case 2:
		return r.ClipK, r.ClipV
	case 4:
		return r.ClipK4, r.ClipV4
	case 8:
		return r.ClipK8, r.ClipV8
	}
	return nil, nil
}

// MixedWidths are the per-layer widths oscar-mixed accepts.
var MixedWidths = []int{2, 4, 8}

// NeedsRotations reports whether method takes (and requires)
// Options.Rotations: oscar2, oscar2-g32, oscar4 and oscar-mixed.
func NeedsRotations(method string) bool { return methods[method].needRot }

// Options configure New.
type Options struct {
	// Sink is the number of first tokens (attention sinks) kept in fp16
	// and never quantized; 0 = none. OSCAR publishes 64.
	Sink int
	// Recent is the number of newest tokens kept in fp16; a token is
	// quantized when it leaves this window. 0 = none, except for kivi2 and
	// oscars2, whose methods include a residual window: there 0 means the
	// published 128. OSCAR publishes 256. Block methods (kivi2, oscars2)
	// quantize 32 tokens at a time, so between Recent−31 and Recent
	// tokens are fp16 once more than Recent were written.
	Recent int
	// Rotations are required by the oscar kinds (NeedsRotations) and ignored by the
	// other methods.
	Rotations *Rotations
	// ExactWindows makes Sink and Recent exact for every method: Recent 0
	// then means no recent window for kivi2 and oscars2 too (their
	// published 128-token residual applies only when it is false, i.e. no
	// window was given), so that every method can be compared with the
	// same windows.
	ExactWindows bool
}

// Sizer is an optional ability of the caches New returns: the average
// stored bits per K or V element, Bytes()·8 / (2·Len()·Σ kvDim), counting
// codes, scales, zero points, norms and fp16 windows. It is 0 for an empty
// cache.
type Sizer interface{ BitsPerElement() float64 }

// Sentinel errors of New.
var (
	// ErrUnknownMethod: the name is not one of Methods().
	ErrUnknownMethod = errors.New("kvcache: unknown method")
	// ErrNoRotations: oscar2/oscar4 need Options.Rotations.
	ErrNoRotations = errors.New("kvcache: method needs calibrated rotations (Options.Rotations)")
	// ErrBadShape: a layer, the capacity, a window or a rotation has an
	// invalid size or value.
	ErrBadShape = errors.New("kvcache: bad shape")
)

// rotKind says how a side (K or V) is rotated before quantization.
type rotKind int

const (
	rotNone     rotKind = iota
	rotHadamard         // normalized Walsh–Hadamard along head_dim (kvq.FWHT)
	rotMatrix           // Options.Rotations, x·R
)

// storeKind says how a side's quantized tokens are stored.
type storeKind int

const (
	storeF16     storeKind = iota // binary16 rows
	storeAsym                     // per (token, head, group) asymmetric, fp16 scale and zero
	storeSym2                     // per (token, head) symmetric INT2, fp16 scale
	storeChannel                  // per (32-token block, head, channel) asymmetric, fp16 scale and zero
	storeF32                      // test only: float32 rows (no quantization)
)

// sideSpec describes the K or the V half of a method.
type sideSpec struct {
	store storeKind
	bits  int
	// group is the channel group of storeAsym rows in elements; 0 means
	// head_dim, groupKIVI means 32 when head_dim is a multiple of 32 and
	// head_dim otherwise.
	group int
	rot   rotKind
	// tokenNorm: divide each token by its ℓ2 norm over all heads and
	// channels (stored fp32) before quantization (OScaR).
	tokenNorm bool
	// clip: apply Rotations.ClipK/ClipV after the rotation.
	clip bool
}

const (
	groupKIVI = -1
	// kiviBlock is the token block of per-channel key quantization.
	kiviBlock = 32
	// kiviResidual is the fp16 residual of kivi2 and oscars2.
	kiviResidual = 128
)

// spec is a method: its two sides and its window policy.
type spec struct {
	name string
	k, v sideSpec
	// block is the number of tokens quantized together (1, or kiviBlock
	// for per-channel keys).
	block int
	// defaultRecent replaces Options.Recent == 0.
	defaultRecent int
	// noWindows: Sink and Recent do not apply (fp16).
	noWindows bool
	needRot   bool
	// check and stores, when set, replace the sides' specs (store_rows.go):
	// check validates the layers, stores builds layer i's K and V stores.
	check  func(layers []Layer) error
	stores func(layer, nLayers int, l Layer, lay *layout, p *pages) (k, v store)
	// mixed: the K and V widths of each layer come from
	// Rotations.BitsK/BitsV.
	mixed bool
}

var methods = map[string]spec{
	"fp16":       {k: sideSpec{store: storeF16}, v: sideSpec{store: storeF16}, block: 1, noWindows: true},
	"int8":       {k: sideSpec{store: storeAsym, bits: 8}, v: sideSpec{store: storeAsym, bits: 8}, block: 1},
	"int4":       {k: sideSpec{store: storeAsym, bits: 4}, v: sideSpec{store: storeAsym, bits: 4}, block: 1},
	"int2-naive": {k: sideSpec{store: storeSym2, bits: 2}, v: sideSpec{store: storeSym2, bits: 2}, block: 1},
	"kivi2": {
		k:     sideSpec{store: storeChannel, bits: 2},
		v:     sideSpec{store: storeAsym, bits: 2, group: groupKIVI},
		block: kiviBlock, defaultRecent: kiviResidual,
	},
	"quarot2": {
		k:     sideSpec{store: storeAsym, bits: 2, rot: rotHadamard},
		v:     sideSpec{store: storeAsym, bits: 2, rot: rotHadamard},
		block: 1,
	},
	"oscar2": {
		k:     sideSpec{store: storeAsym, bits: 2, rot: rotMatrix, clip: true},
		v:     sideSpec{store: storeAsym, bits: 2, rot: rotMatrix, clip: true},
		block: 1, needRot: true,
	},
	// oscar2-g32: oscar2 at kivi2's cost: the same rotation and per-row
	// clipping, then asymmetric INT2 per group of 32 channels.
	"oscar2-g32": {
		k:     sideSpec{store: storeAsym, bits: 2, group: groupKIVI, rot: rotMatrix, clip: true},
		v:     sideSpec{store: storeAsym, bits: 2, group: groupKIVI, rot: rotMatrix, clip: true},
		block: 1, needRot: true,
	},
	"oscar4": {
		k:     sideSpec{store: storeAsym, bits: 4, rot: rotMatrix, clip: true},
		v:     sideSpec{store: storeAsym, bits: 4, rot: rotMatrix, clip: true},
		block: 1, needRot: true,
	},
	// oscar-mixed: OSCAR with each layer's K and V width taken from
	// Rotations.BitsK/BitsV (bits 0 here: per layer).
	"oscar-mixed": {
		k:     sideSpec{store: storeAsym, rot: rotMatrix, clip: true},
		v:     sideSpec{store: storeAsym, rot: rotMatrix, clip: true},
		block: 1, needRot: true, mixed: true,
	},
	"oscars2": {
		k:     sideSpec{store: storeChannel, bits: 2, rot: rotHadamard, tokenNorm: true},
		v:     sideSpec{store: storeAsym, bits: 2, rot: rotHadamard},
		block: kiviBlock, defaultRecent: kiviResidual,
	},
	// Serving-engine baselines (store_turbo.go, store_vllm.go, store_ggml.go).
	"turboquant_k8v4":        turboSpec(turboPreset{kBits: 8, vBits: 4, skip: true}),
	"turboquant_4bit_nc":     turboSpec(turboPreset{kBits: 4, vBits: 4, nc: true, skip: true}),
	"turboquant_k3v4_nc":     turboSpec(turboPreset{kBits: 3, vBits: 4, nc: true, skip: true}),
	"turboquant_3bit_nc":     turboSpec(turboPreset{kBits: 3, vBits: 3, nc: true, skip: true}),
	"turboquant_k8v4-all":    turboSpec(turboPreset{kBits: 8, vBits: 4}),
	"turboquant_4bit_nc-all": turboSpec(turboPreset{kBits: 4, vBits: 4, nc: true}),
	"turboquant_k3v4_nc-all": turboSpec(turboPreset{kBits: 3, vBits: 4, nc: true}),
	"turboquant_3bit_nc-all": turboSpec(turboPreset{kBits: 3, vBits: 3, nc: true}),
	"fp8":                    fp8Spec(),
	"int4_per_token_head":    int4PTHSpec(),
	"q8_0":                   ggmlSpec(8),
	"q4_0":                   ggmlSpec(4),
}

// Methods returns the names New accepts, sorted.
func Methods() []string {
	names := []string{"fp32"}
	for n := range methods {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// New returns an empty KV cache for layers holding up to capacity tokens,
// storing keys and values as the named method (docs/METHODS.md §1–3):
//
//	fp32        float32 (runtime.F32Cache, with the zero-copy F32KV ability)      32 bits
//	fp16        binary16                                                           16 bits
//	int8, int4  asymmetric min-max per (token, kv head) row of head_dim,
//	            fp16 scale and zero                                     b + 32/head_dim bits
//	int2-naive  symmetric INT2 per (token, kv head) row, grid
//	            {−1.5,−0.5,0.5,1.5}·scale, fp16 scale, no rotation        2 + 16/head_dim bits
//	kivi2       KIVI: K asymmetric INT2 per channel over 32-token blocks, V asymmetric
//	            INT2 per token in groups of 32 channels (head_dim if not a multiple
//	            of 32), fp16 scales and zeros, newest ≤128 tokens fp16     3 + 3 bits
//	quarot2     QuaRot: normalized Hadamard along head_dim on K and V, then
//	            asymmetric INT2 per (token, head) row                    2 + 32/head_dim bits
//	oscar2/4    OSCAR: K·R_K and V·R_V (Options.Rotations), clipping (oscar2:
//	            Rotations.ClipK/ClipV; oscar4: ClipK4/ClipV4, none by default),
//	            asymmetric INT2 (INT4) per (token, head) row, fp16 scale and zero;
//	            Sink and Recent windows fp16                             b + 32/head_dim bits
//	oscar2-g32  oscar2 (same rotation, same per-row clipping with the 2-bit ratios)
//	            with asymmetric INT2 per group of 32 channels (head_dim when it is not
//	            a multiple of 32), fp16 scale and zero per group: kivi2's cost at
//	            head_dim 64, P_br spreading high-variance directions over the groups;
//	            attention dequantizes its blocks (runtime.KVAttender, not the
//	            raw-code kernels, which take one group per row)
//	                                         2 + 32/g bits, g the group (32 or head_dim)
//	oscar-mixed OSCAR as oscar2/4 with each layer's K and V width in {2, 4, 8} from
//	            Rotations.BitsK/BitsV, each width with its own clip ratios
//	                                                  Σ_l (b_l + 32/head_dim)/layers bits
//	oscars2     OScaR: Hadamard on K and V, K divided by one fp32 ℓ2 norm per token
//	            over all kv heads (32/kvDim bits), K per channel over 32-token blocks
//	            (3 bits), V per (token, head) row (2 + 32/head_dim bits), all
//	            asymmetric INT2, newest ≤128 tokens fp16
//
// (bits per element before windows; kivi2 is K + V). The returned caches other than fp32
// do not implement runtime.F32KV: Read dequantizes, and for rotated
// methods un-rotates, so attention sees keys and values in the model's
// original space; they implement runtime.KVAttender (attention against
// the packed codes, doc.go), which Forward uses instead of Read. All of them implement Sizer. A cache is not safe for
// concurrent use. The storage of a cache is allocated here for its whole
// capacity (one block of the paged storage; Pool shares blocks between
// caches instead).
//
// The serving-engine baselines (docs/METHODS.md §3), bytes per
// (token, kv head) of K / V at head_dim d:
//
//	turboquant_k8v4     vLLM: K FP8 E4M3 unscaled, V 4-bit asymmetric   d / d/2+4
//	turboquant_4bit_nc  K ℓ2 norm + Hadamard + 4-bit Lloyd–Max codes with
//	                    norm correction, V 4-bit                 d/2+2 / d/2+4
//	turboquant_k3v4_nc  K 3-bit Lloyd–Max nc, V 4-bit         3d/8+2 / d/2+4
//	turboquant_3bit_nc  K 3-bit Lloyd–Max nc, V 3-bit         3d/8+2 / 3d/8+4
//	                    (all four: K+V padded to even bytes; the first and
//	                    last min(2, ⌊layers/2⌋) layers binary16, 2d / 2d;
//	                    the "-all" variants quantize every layer)
//	fp8                 vLLM fp8_e4m3, per-tensor scale 1.0        d / d
//	int4_per_token_head vLLM: randomized Hadamard, asymmetric 4-bit per
//	                    (token, head), fp32 scale with the zero point
//	                    in its low mantissa bits                 d/2+4 / d/2+4
//	q8_0, q4_0          llama.cpp blocks of 32 along head_dim, fp16 scale,
//	                    Hadamard-rotated when 64 | head_dim   34d/32, 18d/32
//
// (store_turbo.go, store_vllm.go and store_ggml.go state each encoding).
// The engines keep no fp16 windows: Sink = Recent = 0 reproduces them;
// other windows apply as for every method but fp16.
//
// Errors: ErrUnknownMethod for an unknown name, ErrNoRotations when
// oscar2/oscar2-g32/oscar4/oscar-mixed get none, ErrBadShape (wrapped, naming the
// layer and field) for capacity < 1, no layers, non-positive heads or
// head_dim, negative windows, a head_dim that is not a power of two for
// Hadamard methods, a head_dim the serving-engine kind does not take
// (q8_0/q4_0: a multiple of 32; TurboQuant: a power of two ≥ 8;
// int4_per_token_head: a power of two), and rotations with the wrong count
// or size, not orthogonal (max|R·Rᵀ − I| > 1e-3), with clipping ratios
// outside (0, 1], or (oscar-mixed) without one width in {2, 4, 8} per
// layer and side.
func New(name string, layers []Layer, capacity int, opt Options) (runtime.KVCache, error) {
	if err := checkLayers(layers, capacity, opt); err != nil {
		return nil, err
	}
	if name == "fp32" {
		kv, hd := make([]int, len(layers)), make([]int, len(layers))
		for i, l := range layers {
			kv[i], hd[i] = l.NumKVHeads*l.HeadDim, l.HeadDim
		}
		return &f32Cache{runtime.NewF32Cache(kv, hd, capacity), kv}, nil
	}
	sp, ok := methods[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownMethod, name, strings.Join(Methods(), ", "))
	}
	sp.name = name
	return newCache(sp, layers, capacity, opt)
}

func checkLayers(layers []Layer, capacity int, opt Options) error {
	if capacity < 1 {
		return fmt.Errorf("%w: capacity %d, want ≥ 1 token", ErrBadShape, capacity)
	}
	if len(layers) == 0 {
		return fmt.Errorf("%w: no layers", ErrBadShape)
	}
	for i, l := range layers {
		if l.NumKVHeads < 1 || l.HeadDim < 1 {
			return fmt.Errorf("%w: layer %d: num_key_value_heads %d, head_dim %d, want both ≥ 1", ErrBadShape, i, l.NumKVHeads, l.HeadDim)
		}
	}
	if opt.Sink < 0 || opt.Recent < 0 {
		return fmt.Errorf("%w: Sink %d, Recent %d, want ≥ 0", ErrBadShape, opt.Sink, opt.Recent)
	}
	return nil
}

// checkRotations validates OSCAR rotations for layers (mixed: per-layer
// widths required).
func checkRotations(r *Rotations, layers []Layer, mixed bool) error {
	if len(r.K) != len(layers) || len(r.V) != len(layers) {
		return fmt.Errorf("%w: Rotations has %d K and %d V matrices, want %d (one per layer)", ErrBadShape, len(r.K), len(r.V), len(layers))
	}
	for _, c := range []struct {
		name string
		b    []int
	}{{"BitsK", r.BitsK}, {"BitsV", r.BitsV}} {
		if c.b == nil && !mixed {
			continue
		}
		if len(c.b) != len(layers) {
			hint := ""
			if len(c.b) == 0 {
				hint = ": oscar-mixed needs a rotation file with per-layer widths, made by lmpack quantize kv --kv-bits B (recipe: cache oscar-mixed with quantize.kv.kv_bits)"
			}
			return fmt.Errorf("%w: Rotations.%s has %d widths, want %d (one per layer)%s", ErrBadShape, c.name, len(c.b), len(layers), hint)
		}
		for i, b := range c.b {
			if !slices.Contains(MixedWidths, b) {
				return fmt.Errorf("%w: layer %d: Rotations.%s width %d, want 2, 4 or 8 bits", ErrBadShape, i, c.name, b)
			}
		}
	}
	for _, c := range []struct {
		name string
		r    []float64
	}{{"ClipK", r.ClipK}, {"ClipV", r.ClipV}, {"ClipK4", r.ClipK4}, {"ClipV4", r.ClipV4}, {"ClipK8", r.ClipK8}, {"ClipV8", r.ClipV8}} {
		if c.r == nil {
			continue
		}
		if len(c.r) != len(layers) {
			return fmt.Errorf("%w: Rotations.%s has %d ratios, want %d (one per layer)", ErrBadShape, c.name, len(c.r), len(layers))
		}
		for i, x := range c.r {
			if !(x > 0 && x <= 1) {
				return fmt.Errorf("%w: layer %d: Rotations.%s ratio %v, want in (0, 1]", ErrBadShape, i, c.name, x)
			}
		}
	}
	for i, l := range layers {
		d := l.HeadDim
		for _, m := range []struct {
			name string
			r    []float32
		}{{"K", r.K[i]}, {"V", r.V[i]}} {
			if len(m.r) != d*d {
				return fmt.Errorf("%w: layer %d: Rotations.%s has %d elements, want head_dim² = %d", ErrBadShape, i, m.name, len(m.r), d*d)
			}
			if e := orthError(m.r, d); !(e <= 1e-3) {
				return fmt.Errorf("%w: layer %d: Rotations.%s is not orthogonal: max|R·Rᵀ − I| = %.3g > 1e-3", ErrBadShape, i, m.name, e)
			}
		}
	}
	return nil
}

// orthError returns max|R·Rᵀ − I| for a [d, d] row-major R (NaN if R has
// NaNs).
func orthError(r []float32, d int) float64 {
	p := make([]float32, d*d)
	kernels.MatMulNT(d, d, d, r, d, r, d, p, d)
	var worst float64
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			x := float64(p[i*d+j])
			if i == j {
				x--
			}
			if math.IsNaN(x) {
				return math.NaN()
			}
			worst = max(worst, math.Abs(x))
		}
	}
	return worst
}

// isPow2 reports whether n is a positive power of two.
func isPow2(n int) bool { return n > 0 && n&(n-1) == 0 }
