package calibrate

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// StatExperts is the Header.Statistics name of the MoE expert statistics
// (ExpertLayer): per MoE layer the routing counts and, per expert, the
// input Hessians of gate/up_proj and of down_proj. Tensors, for MoE layer N
// with E experts, hidden H and expert e's intermediate size I_e:
//
//	experts.layers.N.routed            I64 [E]      tokens routed to each expert (top-k)
//	experts.layers.N.samples           I64 [E]      tokens accumulated into each expert's Hessians
//	experts.layers.N.pooled_in         F64 [H, H]   (1/T) Σ_t x xᵀ over all T tokens
//	experts.layers.N.experts.e.h_in    F64 [H, H]   (1/S_e) Σ x xᵀ over the expert's S_e samples
//	experts.layers.N.experts.e.h_down  F64 [I_e, I_e] (1/S_e) Σ h hᵀ, h = silu(W_gate x) ⊙ (W_up x)
//
// x is the MoE block input (after post_attention_layernorm, the input of
// the router and of every expert's gate_proj and up_proj); h is the input
// of the expert's down_proj, computed in float64 from the checkpoint's
// weights. An expert with S_e = 0 stores zero matrices.
const StatExperts = "experts"

// DefaultMinExpertTokens is ExpertOptions.MinTokens when it is 0: an
// expert with fewer routed tokens is reported as sparse.
const DefaultMinExpertTokens = 16

// DefaultMaxExpertBytes is the expert-statistics memory budget, in bytes,
// that the CLI (--max-expert-memory) and compress recipes
// (calibrate.max_expert_memory) use when none is given: 8 GiB, about one
// Qwen3-30B-A3B MoE layer's expert statistics per pass (Options.MaxExpertBytes).
const DefaultMaxExpertBytes = 8 << 30

// ExpertOptions configures CollectExperts.
type ExpertOptions struct {
	// AllExperts accumulates every token into every expert's Hessians (for
	// statistics only: the model's output still follows its own routing,
	// and Routed still counts the real top-k routing). With it, S_e = T
	// for every expert and no expert is left without data.
	AllExperts bool
	// MinTokens is the threshold of the sparse-expert report
	// (ExpertLayer.Sparse); 0 means DefaultMinExpertTokens.
	MinTokens int
	// Layers, when not nil, restricts the statistics to these decoder
	// layers (each must be MoE), so that a caller can bound memory by
	// collecting a few layers per pass; nil means every MoE layer.
	Layers []int
}

// ExpertStat is one expert's statistics. Hessians are float64 row-major
// and symmetric positive semi-definite, normalised by Samples (a second
// moment, not a sum), zero when Samples is 0.
type ExpertStat struct {
	// Routed is the number of calibration tokens the router sent to the
	// expert (it is among the token's top-k).
	Routed int64
	// Samples is the number of tokens accumulated into HIn and HDown:
	// Routed, or every token (Header.Tokens) with AllExperts.
	Samples int64
	// Inter is the expert's intermediate size I.
	Inter int
	// HIn is (1/Samples) Σ x xᵀ, [H, H]: the input second moment of
	// gate_proj and up_proj.
	HIn []float64
	// HDown is (1/Samples) Σ h hᵀ, [I, I]: the input second moment of
	// down_proj.
	HDown []float64
}

// ExpertLayer is one MoE decoder layer's expert statistics.
type ExpertLayer struct {
	// Layer is the decoder layer index.
	Layer int
	// Hidden is H.
	Hidden int
	// Pooled is (1/T) Σ_t x xᵀ over all T calibration tokens, [H, H]: the
	// fallback input Hessian of sparse experts (see Hessians).
	Pooled []float64
	// Experts has one entry per expert, in expert order.
	Experts []ExpertStat
}

// SparseExpert names an expert that received fewer routed tokens than the
// threshold.
type SparseExpert struct {
	Layer  int   `json:"layer"`
	Expert int   `json:"expert"`
	Routed int64 `json:"routed"`
}

// Sparse lists the experts of l with fewer than minTokens routed tokens
// (minTokens <= 0: DefaultMinExpertTokens).
func (l *ExpertLayer) Sparse(minTokens int) []SparseExpert {
	if minTokens <= 0 {
		minTokens = DefaultMinExpertTokens
	}
	var out []SparseExpert
	for e, s := range l.Experts {
		if s.Routed < int64(minTokens) {
			out = append(out, SparseExpert{Layer: l.Layer, Expert: e, Routed: s.Routed})
		}
	}
	return out
}

// Hessians returns the input Hessians GPTQ should use for expert e of l:
// gate/up_proj hIn [H, H] and down_proj hDown [I, I], float64 row-major
// (copies). The documented fallback: when the expert's Samples is below
// minTokens (<= 0: DefaultMinExpertTokens), too few tokens to estimate its
// own statistics, hIn is the layer's Pooled Hessian (all tokens that
// entered the block) and hDown is the identity, under which GPTQ reduces to
// round-to-nearest; fallback is then true. With AllExperts calibration
// every expert has Samples = T and no fallback happens unless T itself is
// below minTokens. The results are always finite. It panics if e is out of
// range (a programmer error).
func (l *ExpertLayer) Hessians(e, minTokens int) (hIn, hDown []float64, fallback bool) {
	if minTokens <= 0 {
		minTokens = DefaultMinExpertTokens
	}
	s := &l.Experts[e]
	if s.Samples >= int64(minTokens) {
		return append([]float64(nil), s.HIn...), append([]float64(nil), s.HDown...), false
	}
	hDown = make([]float64, s.Inter*s.Inter)
	for i := 0; i < s.Inter; i++ {
		hDown[i*s.Inter+i] = 1
	}
	return append([]float64(nil), l.Pooled...), hDown, true
}

// ExpertTensorName returns the tensor name of statistic stat of MoE layer
// layer: expert < 0 gives a layer tensor ("routed", "samples",
// "pooled_in"), e.g. "experts.layers.3.routed"; otherwise an expert tensor
// ("h_in", "h_down"), e.g. "experts.layers.3.experts.1.h_in".
func ExpertTensorName(layer, expert int, stat string) string {
	s := StatExperts + ".layers." + strconv.Itoa(layer) + "."
	if expert >= 0 {
		s += "experts." + strconv.Itoa(expert) + "."
	}
	return s + stat
}

// ExpertLayerBytes returns the bytes CollectExperts holds for decoder
// layer l of d while it collects: the float64 Hessian accumulators
// 8·((E+1)·H² + Σ_e I_e²) (pooled_in, h_in and h_down, which become the
// results in place) plus the float64 copies of the experts' gate_proj and
// up_proj weights 8·2·Σ_e I_e·H, with E experts, hidden size H and expert
// e's intermediate size I_e. It is 0 when l is not an MoE layer (or out of
// range). Qwen3-30B-A3B (H 2048, E 128, I 768) needs about 8.1e9 bytes per
// layer.
func ExpertLayerBytes(d *arch.Description, l int) int64 {
	if l < 0 || l >= len(d.Layers) || d.Layers[l].MoE == nil {
		return 0
	}
	mo := d.Layers[l].MoE
	H := int64(d.HiddenSize)
	n := int64(len(mo.Experts)+1) * H * H
	for _, x := range mo.Experts {
		I := int64(x.IntermediateSize)
		n += I*I + 2*I*H
	}
	return 8 * n
}

// ExpertPasses splits the MoE layers of d, in layer order, into groups of
// consecutive MoE layers whose ExpertLayerBytes sum to at most maxBytes,
// filling each group greedily: one CollectExperts pass per group
// (ExpertOptions.Layers). maxBytes <= 0 means no limit: one group of every
// MoE layer. It returns nil when d has no MoE layer. Errors: an MoE layer
// that alone needs more than maxBytes (naming the layer and the bytes
// needed).
func ExpertPasses(d *arch.Description, maxBytes int64) ([][]int, error) {
	var groups [][]int
	var used int64
	for l := range d.Layers {
		need := ExpertLayerBytes(d, l)
		if need == 0 {
			continue
		}
		if maxBytes > 0 && need > maxBytes {
			return nil, fmt.Errorf("calibrate: expert statistics memory budget (calibrate --max-expert-memory, recipe calibrate.max_expert_memory) of %d bytes is below the %d bytes MoE layer %d needs; want at least %d", maxBytes, need, l, need)
		}
		if len(groups) == 0 || (maxBytes > 0 && used+need > maxBytes) {
			groups = append(groups, nil)
			used = 0
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], l)
		used += need
	}
	return groups, nil
}

// CollectExperts runs m over the windows (each from position 0 in a fresh
// cache) and returns the StatExperts statistics of every MoE layer of d
// (in layer order; only opt.Layers when set; nil, nil when d has no MoE
// layer). ck (a checkpoint or any runtime.TensorSource; quantized weights
// are dequantized, runtime.WithQuant) supplies the experts' gate_proj and up_proj weights (d's tensor names), used to
// compute each expert's down_proj input h = silu(W_gate x) ⊙ (W_up x) in
// float64 for the tokens it accumulates: the tokens routed to it, or with
// opt.AllExperts every token (statistics only; the model's output follows
// its own routing). Routing counts come from the runtime's
// RouterObserver, the block input x from its FFNObserver. Memory: per MoE
// layer collected ExpertLayerBytes ((E+1)·H² + Σ_e I_e² float64 Hessians,
// which become the results in place, and the float64 gate/up weights),
// plus one window's block inputs; independent of the number of windows
// (opt.Layers bounds it; Run's Options.MaxExpertBytes does so). progress, when not nil, is called
// after each window with the tokens forwarded so far and the total.
//
// Errors: no windows or an empty window; an opt.Layers entry that is not
// an MoE layer; a weight missing or not [I, H]
// in ck (naming the tensor); Forward errors; an observer that saw a number
// of tokens other than the windows' total; non-finite statistics
// (ErrBadStatistic naming layer and expert).
func CollectExperts(ctx context.Context, m runtime.Model, d *arch.Description, ck runtime.TensorSource, windows [][]int, opt ExpertOptions, progress func(done, total int)) ([]ExpertLayer, error) {
	// A quantized checkpoint's experts are read dequantized, as the
	// runtime runs them.
	col, err := NewExpertCollector(d, ck, opt.AllExperts, opt.Layers)
	if err != nil || col == nil {
		return nil, err
	}
	acc := col.acc
	T, longest := 0, 0
	for i, w := range windows {
		if len(w) == 0 {
			return nil, fmt.Errorf("calibrate: window %d is empty", i)
		}
		T += len(w)
		longest = max(longest, len(w))
	}
	if T == 0 {
		return nil, fmt.Errorf("calibrate: no calibration windows")
	}
	defer m.SetObserver(nil)
	m.SetObserver(acc)
	cache := m.NewCache(longest)
	logits := make([]float32, d.VocabSize)
	done := 0
	for _, w := range windows {
		cache.Truncate(0)
		if err := m.Forward(ctx, w, cache, logits, false); err != nil {
			return nil, fmt.Errorf("calibrate: expert statistics: %w", err)
		}
		if acc.err != nil {
			return nil, acc.err
		}
		done += len(w)
		if progress != nil {
			progress(done, T)
		}
	}
	return acc.result(T)
}

// ExpertCollector accumulates StatExperts statistics from whatever a
// runtime model is run on: install it with Model.SetObserver (it is a
// runtime.FFNObserver and runtime.RouterObserver), run the model, then
// call Result. CollectExperts is one collector over token windows; weight
// quantization uses one on the hidden states of the already quantized
// blocks (GPTQ's sequential inputs), on a one-layer model.
type ExpertCollector struct{ acc *expertsAcc }

// NewExpertCollector returns a collector for the MoE layers of d (only
// those in layers when not nil; the indices the runtime reports for d),
// reading every expert's gate_proj and up_proj [I, H] from ck (quantized
// weights dequantized, runtime.WithQuant) as float64 to form the down_proj
// inputs silu(x·gateᵀ)⊙(x·upᵀ) itself. all accumulates every token into
// every expert (ExpertOptions.AllExperts). It returns nil, nil when d has
// no such MoE layer. Memory: ExpertLayerBytes per layer. Errors: a layers
// entry that is not an MoE layer, a missing weight or one not [I, H]
// (naming the tensor).
func NewExpertCollector(d *arch.Description, ck runtime.TensorSource, all bool, layers []int) (*ExpertCollector, error) {
	acc, err := newExpertsAcc(d, runtime.WithQuant(d, ck), all, layers)
	if err != nil || acc == nil {
		return nil, err
	}
	return &ExpertCollector{acc: acc}, nil
}

// FFNInput implements runtime.FFNObserver.
func (c *ExpertCollector) FFNInput(layer, pos, n int, x, h []float32) {
	c.acc.FFNInput(layer, pos, n, x, h)
}

// RouterLogits implements runtime.RouterObserver.
func (c *ExpertCollector) RouterLogits(layer, pos, n int, logits []float32, selected []int32) {
	c.acc.RouterLogits(layer, pos, n, logits, selected)
}

// Err is the first error the observer hooks met (a router hook without
// its block input), or nil.
func (c *ExpertCollector) Err() error { return c.acc.err }

// Result returns the statistics of every collected layer after tokens
// tokens were run, as CollectExperts does: per expert the routed count
// and the mean input Hessians HIn [H, H] and HDown [I, I] (float64). The
// collector's accumulators become the results (call it once). Errors: a
// hook error, a layer that saw other than tokens tokens, non-finite
// statistics (ErrBadStatistic).
func (c *ExpertCollector) Result(tokens int) ([]ExpertLayer, error) {
	if c.acc.err != nil {
		return nil, c.acc.err
	}
	return c.acc.result(tokens)
}

// expertsAcc is the FFNObserver + RouterObserver accumulating the expert
// statistics. FFNInput keeps the block input of the current call; the
// router hook that follows it in the same layer accumulates.
type expertsAcc struct {
	all    bool
	byL    map[int]*expertLayerAcc
	order  []int
	x      []float32 // the current layer's block input [n, H]
	xLayer int
	err    error
}

type expertLayerAcc struct {
	layer, H, E, K int
	tokens         int64
	pooled         []float64 // upper triangle of Σ x xᵀ
	experts        []expertAcc
}

type expertAcc struct {
	inter       int
	gate, up    []float64 // [I, H]
	routed, smp int64
	hin, hdown  []float64 // upper triangles of the sums
}

func newExpertsAcc(d *arch.Description, ck runtime.TensorSource, all bool, only []int) (*expertsAcc, error) {
	a := &expertsAcc{all: all, byL: map[int]*expertLayerAcc{}, xLayer: -1}
	H := d.HiddenSize
	for _, l := range only {
		if l < 0 || l >= len(d.Layers) || d.Layers[l].MoE == nil {
			return nil, fmt.Errorf("calibrate: expert statistics: layer %d is not an MoE layer of the model (%d layers)", l, len(d.Layers))
		}
	}
	for li := range d.Layers {
		mo := d.Layers[li].MoE
		if mo == nil || (only != nil && !slices.Contains(only, li)) {
			continue
		}
		la := &expertLayerAcc{layer: li, H: H, E: mo.NumExperts, K: mo.TopK, pooled: make([]float64, H*H)}
		for e := range mo.Experts {
			x := &mo.Experts[e]
			I := x.IntermediateSize
			g, err := loadF64(ck, x.Gate, I, H)
			if err != nil {
				return nil, err
			}
			u, err := loadF64(ck, x.Up, I, H)
			if err != nil {
				return nil, err
			}
			la.experts = append(la.experts, expertAcc{inter: I, gate: g, up: u, hin: make([]float64, H*H), hdown: make([]float64, I*I)})
		}
		a.byL[li] = la
		a.order = append(a.order, li)
	}
	if len(a.order) == 0 {
		return nil, nil
	}
	return a, nil
}

// loadF64 reads tensor name from ck as float64, checking its shape.
func loadF64(ck runtime.TensorSource, name string, rows, cols int) ([]float64, error) {
	t, err := ck.Tensor(name)
	if err != nil {
		return nil, fmt.Errorf("calibrate: expert statistics: %w", err)
	}
	if len(t.Shape) != 2 || t.Shape[0] != rows || t.Shape[1] != cols {
		return nil, fmt.Errorf("calibrate: expert statistics: tensor %q: shape %v, want [%d %d]", name, t.Shape, rows, cols)
	}
	v, err := t.Float32()
	if err != nil {
		return nil, fmt.Errorf("calibrate: expert statistics: tensor %q: %w", name, err)
	}
	out := make([]float64, len(v))
	for i, f := range v {
		out[i] = float64(f)
	}
	return out, nil
}

// FFNInput implements runtime.FFNObserver: it keeps x of MoE layers.
func (a *expertsAcc) FFNInput(layer, pos, n int, x, h []float32) {
	if _, ok := a.byL[layer]; !ok {
		return
	}
	a.xLayer = layer
	a.x = append(a.x[:0], x[:n*a.byL[layer].H]...)
}

// RouterLogits implements runtime.RouterObserver.
func (a *expertsAcc) RouterLogits(layer, pos, n int, logits []float32, selected []int32) {
	la, ok := a.byL[layer]
	if !ok || a.err != nil {
		return
	}
	if a.xLayer != layer || len(a.x) != n*la.H {
		a.err = fmt.Errorf("calibrate: expert statistics: layer %d: router hook without the matching block input", layer)
		return
	}
	H := la.H
	la.tokens += int64(n)
	X := make([]float64, n*H)
	for i, v := range a.x {
		X[i] = float64(v)
	}
	syrkAdd(la.pooled, X, n, H)
	rows := make([][]int, la.E)
	for t := 0; t < n; t++ {
		for _, e := range selected[t*la.K : (t+1)*la.K] {
			rows[e] = append(rows[e], t)
		}
	}
	for e := range la.experts {
		ea := &la.experts[e]
		ea.routed += int64(len(rows[e]))
		var Xe []float64
		var ne int
		if a.all {
			Xe, ne = X, n
		} else {
			ne = len(rows[e])
			if ne == 0 {
				continue
			}
			Xe = make([]float64, ne*H)
			for j, t := range rows[e] {
				copy(Xe[j*H:(j+1)*H], X[t*H:(t+1)*H])
			}
		}
		ea.smp += int64(ne)
		syrkAdd(ea.hin, Xe, ne, H)
		I := ea.inter
		G := make([]float64, ne*I)
		U := make([]float64, ne*I)
		gemmNT(Xe, ne, H, ea.gate, I, G)
		gemmNT(Xe, ne, H, ea.up, I, U)
		for i, g := range G {
			G[i] = g / (1 + math.Exp(-g)) * U[i]
		}
		syrkAdd(ea.hdown, G, ne, I)
	}
}

// syrkAdd adds Xᵀ X (X: [n, d]) to the upper triangle of s [d, d].
func syrkAdd(s, X []float64, n, d int) {
	if n == 0 {
		return
	}
	blas64.Syrk(blas.Trans, 1, blas64.General{Rows: n, Cols: d, Stride: d, Data: X}, 1,
		blas64.Symmetric{Uplo: blas.Upper, N: d, Stride: d, Data: s})
}

// gemmNT sets C = X Wᵀ for X [n, k], W [m, k], C [n, m].
func gemmNT(X []float64, n, k int, W []float64, m int, C []float64) {
	blas64.Gemm(blas.NoTrans, blas.Trans, 1,
		blas64.General{Rows: n, Cols: k, Stride: k, Data: X},
		blas64.General{Rows: m, Cols: k, Stride: k, Data: W}, 0,
		blas64.General{Rows: n, Cols: m, Stride: m, Data: C})
}

// meanOf turns the upper-triangle sum u [d, d] into the mean in place: it
// mirrors the upper triangle into the lower one and divides by n (zero when
// n is 0), and returns u. In place, so that a layer's results take no
// memory beyond its accumulators.
func meanOf(u []float64, d int, n int64) []float64 {
	if n == 0 {
		clear(u)
		return u
	}
	s := 1 / float64(n)
	for i := 0; i < d; i++ {
		for j := i; j < d; j++ {
			v := u[i*d+j] * s
			u[i*d+j], u[j*d+i] = v, v
		}
	}
	return u
}

func (a *expertsAcc) result(T int) ([]ExpertLayer, error) {
	out := make([]ExpertLayer, 0, len(a.order))
	for _, li := range a.order {
		la := a.byL[li]
		if la.tokens != int64(T) {
			return nil, fmt.Errorf("calibrate: expert statistics: layer %d: the observer saw %d tokens, want %d", li, la.tokens, T)
		}
		l := ExpertLayer{Layer: li, Hidden: la.H, Pooled: meanOf(la.pooled, la.H, la.tokens)}
		if j := firstNonFinite(l.Pooled); j >= 0 {
			return nil, fmt.Errorf("calibrate: layer %d: pooled expert input Hessian element %d is %v: %w", li, j, l.Pooled[j], ErrBadStatistic)
		}
		for e := range la.experts {
			ea := &la.experts[e]
			ea.gate, ea.up = nil, nil // no longer needed
			s := ExpertStat{Routed: ea.routed, Samples: ea.smp, Inter: ea.inter,
				HIn: meanOf(ea.hin, la.H, ea.smp), HDown: meanOf(ea.hdown, ea.inter, ea.smp)}
			for _, m := range [][]float64{s.HIn, s.HDown} {
				if j := firstNonFinite(m); j >= 0 {
					return nil, fmt.Errorf("calibrate: layer %d expert %d: Hessian element %d is %v: %w", li, e, j, m[j], ErrBadStatistic)
				}
			}
			l.Experts = append(l.Experts, s)
		}
		out = append(out, l)
	}
	return out, nil
}

// expertTensors encodes the expert statistics (StatExperts) for Write.
// Errors: inconsistent sizes or non-finite values (ErrBadStatistic naming
// the tensor), counts that are negative or Samples above Tokens.
func expertTensors(path string, ls []ExpertLayer, tokens int) ([]safetensors.WriteTensor, error) {
	var ts []safetensors.WriteTensor
	f64 := func(name string, m []float64, d int) error {
		if d <= 0 || len(m) != d*d {
			return fmt.Errorf("calibrate: %s: tensor %q: %d values, want %d×%d: %w", path, name, len(m), d, d, ErrBadStatistic)
		}
		if i := firstNonFinite(m); i >= 0 {
			return fmt.Errorf("calibrate: %s: tensor %q: element %d is %v: %w", path, name, i, m[i], ErrBadStatistic)
		}
		// Streamed (f64WriteTo), not copied: the encoded bytes would double
		// the memory of the statistics.
		ts = append(ts, safetensors.WriteTensor{Name: name, DType: safetensors.F64, Shape: []int{d, d}, WriteTo: f64WriteTo(m)})
		return nil
	}
	prev := -1
	for _, l := range ls {
		if l.Layer <= prev {
			return nil, fmt.Errorf("calibrate: %s: expert statistics: layer %d after layer %d, want increasing layers: %w", path, l.Layer, prev, ErrBadStatistic)
		}
		prev = l.Layer
		E := len(l.Experts)
		if E == 0 {
			return nil, fmt.Errorf("calibrate: %s: expert statistics: layer %d has no experts: %w", path, l.Layer, ErrBadStatistic)
		}
		routed, samples := make([]byte, 8*E), make([]byte, 8*E)
		for e, s := range l.Experts {
			if s.Routed < 0 || s.Samples < 0 || s.Samples > int64(tokens) || s.Routed > int64(tokens) {
				return nil, fmt.Errorf("calibrate: %s: layer %d expert %d: routed %d, samples %d: want 0 to the header's %d tokens: %w", path, l.Layer, e, s.Routed, s.Samples, tokens, ErrBadStatistic)
			}
			binary.LittleEndian.PutUint64(routed[8*e:], uint64(s.Routed))
			binary.LittleEndian.PutUint64(samples[8*e:], uint64(s.Samples))
		}
		ts = append(ts,
			safetensors.WriteTensor{Name: ExpertTensorName(l.Layer, -1, "routed"), DType: safetensors.I64, Shape: []int{E}, Data: routed},
			safetensors.WriteTensor{Name: ExpertTensorName(l.Layer, -1, "samples"), DType: safetensors.I64, Shape: []int{E}, Data: samples})
		if err := f64(ExpertTensorName(l.Layer, -1, "pooled_in"), l.Pooled, l.Hidden); err != nil {
			return nil, err
		}
		for e, s := range l.Experts {
			if err := f64(ExpertTensorName(l.Layer, e, "h_in"), s.HIn, l.Hidden); err != nil {
				return nil, err
			}
			if err := f64(ExpertTensorName(l.Layer, e, "h_down"), s.HDown, s.Inter); err != nil {
				return nil, err
			}
		}
	}
	return ts, nil
}

// f64WriteTo returns a safetensors.WriteTensor.WriteTo that writes v as
// little-endian float64 (the bytes of f64Bytes) through a 64 KiB buffer.
func f64WriteTo(v []float64) func(io.Writer) error {
	return func(w io.Writer) error {
		var buf [64 << 10]byte
		for len(v) > 0 {
			n := min(len(v), len(buf)/8)
			for i, x := range v[:n] {
				binary.LittleEndian.PutUint64(buf[8*i:], math.Float64bits(x))
			}
			if _, err := w.Write(buf[:8*n]); err != nil {
				return err
			}
			v = v[n:]
		}
		return nil
	}
}

// readExperts reads StatExperts. With d, the layers must be exactly d's
// MoE layers and every shape must match d; without d, the layers are those
// named by "experts.layers.N.routed" tensors and shapes need only be
// consistent.
func readExperts(f *safetensors.File, path string, d *arch.Description, tokens int) ([]ExpertLayer, error) {
	var layers []int
	if d != nil {
		for li := range d.Layers {
			if d.Layers[li].MoE != nil {
				layers = append(layers, li)
			}
		}
		for _, ti := range f.Tensors() {
			var l int
			var rest string
			if _, err := fmt.Sscanf(ti.Name, StatExperts+".layers.%d.%s", &l, &rest); err == nil && (l < 0 || l >= len(d.Layers) || d.Layers[l].MoE == nil) {
				return nil, fmt.Errorf("calibrate: %s: tensor %q: layer %d is not an MoE layer of the model: %w", path, ti.Name, l, ErrBadStatistic)
			}
		}
	} else {
		seen := map[int]bool{}
		for _, ti := range f.Tensors() {
			var l int
			var rest string
			if _, err := fmt.Sscanf(ti.Name, StatExperts+".layers.%d.%s", &l, &rest); err == nil && ti.Name == ExpertTensorName(l, -1, "routed") && !seen[l] {
				seen[l] = true
				layers = append(layers, l)
			}
		}
		for i := 1; i < len(layers); i++ { // tensor order is by name; sort numerically
			for j := i; j > 0 && layers[j] < layers[j-1]; j-- {
				layers[j], layers[j-1] = layers[j-1], layers[j]
			}
		}
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("calibrate: %s: statistics list %q but there is no MoE layer with %q tensors: %w", path, StatExperts, StatExperts, ErrBadStatistic)
	}
	out := make([]ExpertLayer, 0, len(layers))
	for _, li := range layers {
		E := 0
		H := 0
		if d != nil {
			E, H = d.Layers[li].MoE.NumExperts, d.HiddenSize
		}
		routed, err := readI64(f, path, ExpertTensorName(li, -1, "routed"), E, tokens)
		if err != nil {
			return nil, err
		}
		E = len(routed)
		samples, err := readI64(f, path, ExpertTensorName(li, -1, "samples"), E, tokens)
		if err != nil {
			return nil, err
		}
		pooled, H, err := readSquare(f, path, ExpertTensorName(li, -1, "pooled_in"), H)
		if err != nil {
			return nil, err
		}
		l := ExpertLayer{Layer: li, Hidden: H, Pooled: pooled}
		for e := 0; e < E; e++ {
			hin, _, err := readSquare(f, path, ExpertTensorName(li, e, "h_in"), H)
			if err != nil {
				return nil, err
			}
			I := 0
			if d != nil {
				I = d.Layers[li].MoE.Experts[e].IntermediateSize
			}
			hdown, I, err := readSquare(f, path, ExpertTensorName(li, e, "h_down"), I)
			if err != nil {
				return nil, err
			}
			l.Experts = append(l.Experts, ExpertStat{Routed: routed[e], Samples: samples[e], Inter: I, HIn: hin, HDown: hdown})
		}
		out = append(out, l)
	}
	return out, nil
}

// readI64 reads an I64 [n] tensor of counts in [0, tokens]; n == 0 accepts
// any length >= 1.
func readI64(f *safetensors.File, path, name string, n, tokens int) ([]int64, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w: %w", err, ErrBadStatistic)
	}
	if t.DType != safetensors.I64 || len(t.Shape) != 1 || t.Shape[0] < 1 || (n > 0 && t.Shape[0] != n) {
		want := "[E >= 1]"
		if n > 0 {
			want = fmt.Sprintf("[%d] (num_experts)", n)
		}
		return nil, fmt.Errorf("calibrate: %s: tensor %q: %s %v, want I64 %s: %w", path, name, t.DType, t.Shape, want, ErrBadStatistic)
	}
	v := make([]int64, t.Shape[0])
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(t.Data[8*i:]))
		if v[i] < 0 || v[i] > int64(tokens) {
			return nil, fmt.Errorf("calibrate: %s: tensor %q: element %d is %d, want a token count in [0, %d]: %w", path, name, i, v[i], tokens, ErrBadStatistic)
		}
	}
	return v, nil
}
