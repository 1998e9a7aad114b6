package gemq

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/runtime"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// Weighting selects the forward-only weighting that replaces GEMQ's
// squared loss gradient (docs/METHODS.md §4 step 2). With p_e(t) the router's
// softmax probability of expert e for token t (over all E experts),
// g_e(t) its routing weight (p_e(t) when e is in t's top-k, renormalised
// over the top-k when the model does so; 0 otherwise) and
// ΔE_e,b(x) = E_e^(b)(x) − E_e(x) the change of the expert's output when
// only its weights are quantized at b bits, over the N calibration tokens:
//
//	WeightRouted: c[l,e,b] = (1/N) Σ_t ‖g_e(t)·ΔE_e,b(x_t)‖²
//	WeightSoft:   c[l,e,b] = (1/N) Σ_t ‖p_e(t)·ΔE_e,b(x_t)‖²
//
// WeightRouted is exactly the mean squared change of the MoE block output
// (summed over the hidden dimension) when only expert e is quantized and
// the router, which sees the unquantized input, is kept: the gradient
// weight of the paper replaced by 1 (MC-MoE style). WeightSoft uses every
// token, weighted by the full softmax probability, so experts the router
// rarely picks still get coefficients from data; it measures sensitivity
// under softened routing, not the model's exact output.
//
//	WeightKL:     c[l,e,b] = (1/N) Σ_t KL(P_t ‖ Q_t^(l,e,b))
//
// is the "KL divergence of the final logits" fallback of docs/METHODS.md §4: P_t
// is the float model's next-token distribution at calibration position t
// and Q_t that of the model with only expert e of layer l quantized at b
// bits (nats). It accounts for how an error propagates through the later
// layers, as the gradient weighting does, at the cost of one forward pass
// over the calibration windows per (layer, expert, width); it suits small
// models (see Compute).
type Weighting string

const (
	// WeightRouted is the exact block-output perturbation (default).
	WeightRouted Weighting = "routed"
	// WeightSoft weights every token by the expert's softmax probability.
	WeightSoft Weighting = "soft"
	// WeightKL measures the KL divergence of the final next-token
	// distributions (Compute only).
	WeightKL Weighting = "kl"
)

// DefaultBits are the widths GEMQ considers: 1, 2, 3 and 4 bits.
var DefaultBits = []int{1, 2, 3, 4}

// DefaultMaxCaptureBytes is Options.MaxCaptureBytes when it is 0: 256 MiB.
const DefaultMaxCaptureBytes = 256 << 20

// Options configures LayerCoefficients and Compute.
type Options struct {
	// Bits are the candidate widths, increasing, each 1 to 8; nil means
	// DefaultBits.
	Bits []int
	// Weighting is WeightRouted (the default when empty), WeightSoft or
	// WeightKL (Compute only).
	Weighting Weighting
	// Threads is the worker count of the model copies WeightKL loads;
	// <= 0 means all cores.
	Threads int
	// Quantizer quantizes one weight matrix; nil means RTN(0) (per output
	// channel, asymmetric min-max, docs/METHODS.md §4 step 2).
	Quantizer Quantizer
	// MinTokens is the fallback threshold under WeightRouted: an expert
	// routed fewer tokens (in particular one never routed) gets its
	// coefficients from WeightSoft over every token instead, and
	// ExpertCoeffs.Fallback is set. 0 means
	// calibrate.DefaultMinExpertTokens; negative disables the fallback
	// (such an expert's coefficients are then 0).
	MinTokens int
	// MaxCaptureBytes caps the captured block inputs held at once by
	// Compute (it captures as many layers per forward pass as fit, at
	// least one); 0 means DefaultMaxCaptureBytes.
	MaxCaptureBytes int64
}

func (o *Options) defaults() error {
	if o.Bits == nil {
		o.Bits = DefaultBits
	}
	if len(o.Bits) < 2 {
		return fmt.Errorf("gemq: bits %v: want at least two widths", o.Bits)
	}
	for i, b := range o.Bits {
		if b < 1 || b > 8 || (i > 0 && b <= o.Bits[i-1]) {
			return fmt.Errorf("gemq: bits %v: want increasing widths in 1..8", o.Bits)
		}
	}
	switch o.Weighting {
	case "":
		o.Weighting = WeightRouted
	case WeightRouted, WeightSoft, WeightKL:
	default:
		return fmt.Errorf("gemq: weighting %q: want %q, %q or %q", o.Weighting, WeightRouted, WeightSoft, WeightKL)
	}
	if o.Quantizer == nil {
		o.Quantizer = RTN(0)
	}
	if o.MinTokens == 0 {
		o.MinTokens = calibrate.DefaultMinExpertTokens
	}
	if o.MaxCaptureBytes < 0 {
		return fmt.Errorf("gemq: MaxCaptureBytes %d: want >= 0", o.MaxCaptureBytes)
	}
	if o.MaxCaptureBytes == 0 {
		o.MaxCaptureBytes = DefaultMaxCaptureBytes
	}
	return nil
}

// ExpertCoeffs are one expert's coefficients.
type ExpertCoeffs struct {
	// Params is the number of weights (gate, up and down_proj), 3·H·I.
	Params int64 `json:"params"`
	// Inter is the expert's intermediate size I (rows of gate/up_proj).
	Inter int `json:"intermediate_size"`
	// Routed is the number of calibration tokens routed to the expert.
	Routed int64 `json:"routed"`
	// Fallback is set when the coefficients come from WeightSoft because
	// the expert was routed fewer than Options.MinTokens tokens.
	Fallback bool `json:"fallback,omitempty"`
	// C[i] is c[l,e,Bits[i]] (see Weighting), finite and >= 0, in squared
	// block-output units per token.
	C []float64 `json:"c"`
}

// LayerCoeffs are one MoE layer's coefficients.
type LayerCoeffs struct {
	// Layer is the decoder layer index.
	Layer int `json:"layer"`
	// Experts has one entry per expert.
	Experts []ExpertCoeffs `json:"experts"`
}

// Coefficients are GEMQ's c[l,e,b] for every MoE layer of a model.
type Coefficients struct {
	// Bits are the widths, increasing; ExpertCoeffs.C is indexed like it.
	Bits []int `json:"bits"`
	// Weighting used.
	Weighting Weighting `json:"weighting"`
	// Tokens is N, the number of calibration tokens.
	Tokens int `json:"tokens"`
	// Layers, in layer order.
	Layers []LayerCoeffs `json:"layers"`
	// Warnings name the experts that fell back (and why).
	Warnings []string `json:"warnings,omitempty"`
}

// LayerCoefficients returns the coefficients of every expert of one MoE
// layer from its captured input (see Weighting for the formula): each
// expert is quantized alone at each width of opt.Bits with opt.Quantizer
// (its gate, up and down_proj), evaluated in float64 on its tokens, and
// its squared output change weighted by the router. The router and the
// other experts are unchanged, so the block output changes only through
// this expert. experts[e] are the layer's float32 weights (LoadExperts).
// The second result lists warnings for experts that fell back
// (Options.MinTokens). Errors: inconsistent sizes (naming the layer and
// expert), invalid options, and quantizer errors (naming layer, expert,
// tensor and width).
func LayerCoefficients(in *LayerInput, experts []Expert, opt Options) (*LayerCoeffs, []string, error) {
	if err := opt.defaults(); err != nil {
		return nil, nil, err
	}
	if opt.Weighting == WeightKL {
		return nil, nil, fmt.Errorf("gemq: layer %d: the %q weighting needs the whole model (Compute), not one layer's capture", in.Layer, WeightKL)
	}
	H, E, K, N := in.Hidden, in.NumExperts, in.TopK, in.N
	if H <= 0 || E <= 0 || K <= 0 || K > E || N <= 0 || len(in.X) != N*H || len(in.Logits) != N*E || len(in.Selected) != N*K {
		return nil, nil, fmt.Errorf("gemq: layer %d: capture of %d tokens with H %d, E %d, K %d has %d inputs, %d logits, %d selections",
			in.Layer, N, H, E, K, len(in.X), len(in.Logits), len(in.Selected))
	}
	if len(experts) != E {
		return nil, nil, fmt.Errorf("gemq: layer %d: %d experts, the router has %d", in.Layer, len(experts), E)
	}
	// Softmax probabilities and routing weights, float64 [N, E].
	p := make([]float64, N*E)
	g := make([]float64, N*E)
	for t := 0; t < N; t++ {
		row := p[t*E : (t+1)*E]
		mx := math.Inf(-1)
		for e := 0; e < E; e++ {
			mx = max(mx, float64(in.Logits[t*E+e]))
		}
		var s float64
		for e := range row {
			row[e] = math.Exp(float64(in.Logits[t*E+e]) - mx)
			s += row[e]
		}
		for e := range row {
			row[e] /= s
		}
		var sk float64
		for _, e := range in.Selected[t*K : (t+1)*K] {
			if e < 0 || int(e) >= E {
				return nil, nil, fmt.Errorf("gemq: layer %d: token %d selects expert %d of %d", in.Layer, t, e, E)
			}
			sk += row[e]
		}
		for _, e := range in.Selected[t*K : (t+1)*K] {
			g[t*E+int(e)] = row[e]
			if in.NormTopK {
				g[t*E+int(e)] /= sk
			}
		}
	}
	out := &LayerCoeffs{Layer: in.Layer}
	var warns []string
	for e := range experts {
		x := &experts[e]
		I := x.Inter
		if I <= 0 || len(x.Gate) != I*H || len(x.Up) != I*H || len(x.Down) != H*I {
			return nil, nil, fmt.Errorf("gemq: layer %d expert %d: weights of %d, %d, %d values for I %d, H %d", in.Layer, e, len(x.Gate), len(x.Up), len(x.Down), I, H)
		}
		var routed int64
		for t := 0; t < N; t++ {
			if g[t*E+e] > 0 || slices.Contains(in.Selected[t*K:(t+1)*K], int32(e)) {
				routed++
			}
		}
		wts, fb := g, false
		if opt.Weighting == WeightSoft {
			wts = p
		} else if routed < int64(opt.MinTokens) {
			wts, fb = p, true
			warns = append(warns, fmt.Sprintf("layer %d expert %d: routed %d calibration tokens (< %d): coefficients from the soft weighting over all %d tokens", in.Layer, e, routed, opt.MinTokens, N))
		}
		// Tokens with a non-zero weight.
		var rows []int
		var w []float64
		for t := 0; t < N; t++ {
			if v := wts[t*E+e]; v > 0 {
				rows = append(rows, t)
				w = append(w, v)
			}
		}
		ec := ExpertCoeffs{Params: x.Params(), Inter: I, Routed: routed, Fallback: fb, C: make([]float64, len(opt.Bits))}
		if len(rows) > 0 {
			X := make([]float64, len(rows)*H)
			for j, t := range rows {
				for k, v := range in.X[t*H : (t+1)*H] {
					X[j*H+k] = float64(v)
				}
			}
			y := expertForward(X, len(rows), H, I, x.Gate, x.Up, x.Down)
			for bi, b := range opt.Bits {
				var q [3][]float32
				for k, t := range []struct {
					name       string
					w          []float32
					rows, cols int
				}{{"gate_proj", x.Gate, I, H}, {"up_proj", x.Up, I, H}, {"down_proj", x.Down, H, I}} {
					v, err := opt.Quantizer(t.w, t.rows, t.cols, b)
					if err != nil {
						return nil, nil, fmt.Errorf("gemq: layer %d expert %d %s at %d bits: %w", in.Layer, e, t.name, b, err)
					}
					if len(v) != len(t.w) {
						return nil, nil, fmt.Errorf("gemq: layer %d expert %d %s at %d bits: the quantizer returned %d values, want %d", in.Layer, e, t.name, b, len(v), len(t.w))
					}
					q[k] = v
				}
				yq := expertForward(X, len(rows), H, I, q[0], q[1], q[2])
				var c float64
				for j := range rows {
					var s float64
					for k := 0; k < H; k++ {
						d := yq[j*H+k] - y[j*H+k]
						s += d * d
					}
					c += w[j] * w[j] * s
				}
				c /= float64(N)
				if math.IsNaN(c) || math.IsInf(c, 0) {
					return nil, nil, fmt.Errorf("gemq: layer %d expert %d at %d bits: coefficient %v (the expert's output overflowed)", in.Layer, e, b, c)
				}
				ec.C[bi] = c
			}
		}
		out.Experts = append(out.Experts, ec)
	}
	return out, warns, nil
}

// expertForward returns Down·(silu(Gate·x) ⊙ (Up·x)) for the n rows of X
// [n, H], as [n, H] float64.
func expertForward(X []float64, n, H, I int, gate, up, down []float32) []float64 {
	f := func(w []float32) []float64 {
		o := make([]float64, len(w))
		for i, v := range w {
			o[i] = float64(v)
		}
		return o
	}
	G, U := make([]float64, n*I), make([]float64, n*I)
	mm := func(A []float64, k int, W []float64, m int, C []float64) {
		blas64.Gemm(blas.NoTrans, blas.Trans, 1,
			blas64.General{Rows: n, Cols: k, Stride: k, Data: A},
			blas64.General{Rows: m, Cols: k, Stride: k, Data: W}, 0,
			blas64.General{Rows: n, Cols: m, Stride: m, Data: C})
	}
	mm(X, H, f(gate), I, G)
	mm(X, H, f(up), I, U)
	for i, v := range G {
		G[i] = v / (1 + math.Exp(-v)) * U[i]
	}
	Y := make([]float64, n*H)
	mm(G, I, f(down), H, Y)
	return Y
}

// Compute returns the coefficients of every MoE layer of m over the
// calibration windows (e.g. calibrate.Calibration.CalibrationWindows):
// it captures the block inputs of as many layers per forward pass as
// opt.MaxCaptureBytes allows (Capture), loads those layers' experts from ck
// (LoadExperts) and calls LayerCoefficients, releasing each layer before
// the next pass. With WeightKL it instead loads, on the CPU backend, one
// copy of the model per (layer, expert, width) from src with that expert
// fake-quantized, and compares final distributions (L·E·|Bits| forward
// passes; memory 8·N·vocab bytes of reference log-probabilities). src is
// the model's tensors (e.g. the *safetensors.Checkpoint m was loaded
// from). Errors: a model without MoE layers, invalid options, and the
// errors of Capture, LoadExperts, LayerCoefficients and model loading.
func Compute(ctx context.Context, m runtime.Model, src runtime.TensorSource, windows [][]int, opt Options) (*Coefficients, error) {
	if err := opt.defaults(); err != nil {
		return nil, err
	}
	if opt.Weighting == WeightKL {
		return computeKL(ctx, m, src, windows, opt)
	}
	d := m.Description()
	var layers []int
	var per int64
	N := 0
	for _, w := range windows {
		N += len(w)
	}
	for l := range d.Layers {
		if mo := d.Layers[l].MoE; mo != nil {
			layers = append(layers, l)
			per = max(per, inputBytes(N, d.HiddenSize, mo.NumExperts, mo.TopK))
		}
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("gemq: the model (%s) has no MoE layer", d.Architecture)
	}
	chunk := 1
	if per > 0 {
		chunk = max(1, int(opt.MaxCaptureBytes/per))
	}
	c := &Coefficients{Bits: slices.Clone(opt.Bits), Weighting: opt.Weighting, Tokens: N}
	for lo := 0; lo < len(layers); lo += chunk {
		ins, err := Capture(ctx, m, windows, layers[lo:min(lo+chunk, len(layers))])
		if err != nil {
			return nil, err
		}
		for i := range ins {
			ex, err := LoadExperts(src, d, ins[i].Layer)
			if err != nil {
				return nil, err
			}
			lc, w, err := LayerCoefficients(&ins[i], ex, opt)
			if err != nil {
				return nil, err
			}
			c.Layers = append(c.Layers, *lc)
			c.Warnings = append(c.Warnings, w...)
			ins[i] = LayerInput{} // release
		}
	}
	return c, nil
}
