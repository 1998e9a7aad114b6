package wquant

import (
	"context"
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// Sentinel errors, wrapped with the flag, file or tensor.
var (
	// ErrOptions: an invalid option (method, bits, group, target).
	ErrOptions = errors.New("wquant: invalid options")
	// ErrUnsupported: a model this stage cannot quantize (a layer with
	// neither a dense FFN nor experts, an already quantized checkpoint).
	ErrUnsupported = errors.New("wquant: unsupported model")
	// ErrOutput: OUT is the model directory, lies inside it, or exists.
	ErrOutput = errors.New("wquant: bad output directory")
	// ErrCalibration: the calibration file holds no token ids.
	ErrCalibration = errors.New("wquant: unusable calibration file")
)

// Input groups: tensors that share an input share its Hessian.
const (
	inAttn = iota // q, k, v: input_layernorm output [n, hidden]
	inO           // o_proj: attention output [n, heads*head_dim]
	inFFN         // gate, up: post_attention_layernorm output [n, hidden]
	inDown        // down_proj: silu(gate)*up [n, intermediate]
	// inSharedDown: an MoE layer's shared-expert down_proj input
	// silu(x·gateᵀ)⊙(x·upᵀ) [n, shared intermediate], computed by the
	// observer (sharedDown) since the runtime does not expose it.
	inSharedDown
	numInputs
)

// Target is one Linear weight the pipeline quantizes.
type Target struct {
	// Name is the weight tensor name, e.g. "model.layers.0.mlp.down_proj.weight".
	Name string `json:"name"`
	// Layer is the decoder block index.
	Layer int `json:"layer"`
	// Kind is "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj" or "down_proj".
	Kind string `json:"kind"`
	// Rows, Cols: the weight's shape [out_features, in_features].
	Rows int `json:"rows"`
	Cols int `json:"cols"`
	// Expert is the expert index of a routed expert's gate/up/down_proj
	// in an MoE layer, -1 for every other weight (the shared expert's
	// included).
	Expert int `json:"expert"`
	// Shared marks the gate/up/down_proj of an MoE layer's shared expert
	// (Qwen2-MoE mlp.shared_expert): quantized like the dense weights
	// (Options.Bits, GroupSize, Symmetric), never by the GEMQ allocation.
	Shared bool `json:"shared_expert,omitempty"`
	input  int
}

// IsExpert tells whether t is a routed expert's weight.
func (t *Target) IsExpert() bool { return t.Expert >= 0 }

// Targets lists the Linear weights of d's decoder blocks in block order,
// each block q, k, v, o, then gate, up, down of the dense FFN or of every
// routed expert of an MoE layer (expert order) followed by its shared
// expert's gate, up, down (Shared; gate/up [I_s, hidden], down
// [hidden, I_s]). Embeddings, norms, biases, the router, the shared
// expert's gate vector [1, hidden] and lm_head are not targets (they stay
// float). Errors: ErrUnsupported for an already quantized description or
// a layer with neither a dense FFN nor experts.
func Targets(d *arch.Description) ([]Target, error) {
	if d.Quant != nil {
		return nil, fmt.Errorf("%w: the checkpoint is already quantized (config.json has %s)", ErrUnsupported, arch.QuantKey)
	}
	H := d.HiddenSize
	var out []Target
	tg := func(name string, l int, kind string, rows, cols, expert, input int) Target {
		return Target{Name: name, Layer: l, Kind: kind, Rows: rows, Cols: cols, Expert: expert, input: input}
	}
	for i := range d.Layers {
		l := &d.Layers[i]
		a := l.Attn
		out = append(out,
			tg(a.Q, i, "q_proj", l.QDim(), H, -1, inAttn),
			tg(a.K, i, "k_proj", l.KVDim(), H, -1, inAttn),
			tg(a.V, i, "v_proj", l.KVDim(), H, -1, inAttn),
			tg(a.O, i, "o_proj", H, l.QDim(), -1, inO),
		)
		if m := l.MLP; m != nil {
			out = append(out,
				tg(m.Gate, i, "gate_proj", m.IntermediateSize, H, -1, inFFN),
				tg(m.Up, i, "up_proj", m.IntermediateSize, H, -1, inFFN),
				tg(m.Down, i, "down_proj", H, m.IntermediateSize, -1, inDown),
			)
			continue
		}
		mo := l.MoE
		if mo == nil {
			return nil, fmt.Errorf("%w: layer %d has neither a dense FFN nor experts", ErrUnsupported, i)
		}
		for e, m := range mo.Experts {
			out = append(out,
				tg(m.Gate, i, "gate_proj", m.IntermediateSize, H, e, inFFN),
				tg(m.Up, i, "up_proj", m.IntermediateSize, H, e, inFFN),
				tg(m.Down, i, "down_proj", H, m.IntermediateSize, e, inDown),
			)
		}
		if m := mo.Shared; m != nil {
			sh := []Target{
				tg(m.Gate, i, "gate_proj", m.IntermediateSize, H, -1, inFFN),
				tg(m.Up, i, "up_proj", m.IntermediateSize, H, -1, inFFN),
				tg(m.Down, i, "down_proj", H, m.IntermediateSize, -1, inSharedDown),
			}
			for j := range sh {
				sh[j].Shared = true
			}
			out = append(out, sh...)
		}
	}
	return out, nil
}

// isMoE tells whether d has an MoE layer.
func isMoE(d *arch.Description) bool {
	for i := range d.Layers {
		if d.Layers[i].MoE != nil {
			return true
		}
	}
	return false
}

// hessians accumulates the input Hessians of one block from the
// runtime's observer hooks (layer index 0 of a one-layer model).
type hessians struct {
	h [numInputs]*weights.Hessian
	// shared accumulates the shared expert's down_proj Hessian of an MoE
	// layer (nil otherwise); finish turns it into h[inSharedDown].
	shared *sharedDown
	err    error
}

// newHessians: for an MoE layer the attention inputs are observed, and
// with a shared expert the MoE block input (the shared gate/up input) and,
// when sd is not nil, the shared down_proj input through sd; the routed
// experts' Hessians come from calibrate.ExpertCollector.
func newHessians(l *arch.Layer, hidden int, sd *sharedDown) *hessians {
	hs := &hessians{h: [numInputs]*weights.Hessian{
		inAttn: weights.NewHessian(hidden),
		inO:    weights.NewHessian(l.QDim()),
	}}
	if l.MLP != nil {
		hs.h[inFFN] = weights.NewHessian(hidden)
		hs.h[inDown] = weights.NewHessian(l.MLP.IntermediateSize)
	}
	if l.MoE != nil && l.MoE.Shared != nil {
		hs.h[inFFN] = weights.NewHessian(hidden)
		hs.shared = sd
	}
	return hs
}

// finish sets h[inSharedDown] from the shared-expert accumulator and
// returns the first accumulation error.
func (h *hessians) finish() error {
	if h.err == nil && h.shared != nil {
		h.h[inSharedDown], h.err = h.shared.hessian()
	}
	return h.err
}

func (h *hessians) add(i int, x []float32, n int) {
	if h.err == nil && h.h[i] != nil {
		if err := h.h[i].Add(x, n); err != nil {
			h.err = fmt.Errorf("wquant: accumulating a Hessian: %w", err)
		}
	}
}

func (h *hessians) AttnInput(_, _, n int, x []float32)  { h.add(inAttn, x, n) }
func (h *hessians) OProjInput(_, _, n int, a []float32) { h.add(inO, a, n) }
func (h *hessians) FFNInput(_, _, n int, x, d []float32) {
	h.add(inFFN, x, n)
	if d != nil {
		h.add(inDown, d, n)
	} else if h.shared != nil && h.err == nil {
		h.err = h.shared.add(x, n)
	}
}

// sharedDown accumulates the GPTQ Hessian of an MoE layer's shared-expert
// down_proj, whose input the runtime does not expose: for every token's
// MoE block input x (post_attention_layernorm output, [hidden]) it
// computes h = silu(x·gateᵀ) ⊙ (x·upᵀ) ([I], gate and up [I, hidden], the
// runtime's mlp: SiLU of the gate projection times the up projection) in
// float64 and adds h hᵀ to a float64 sum, as calibrate's expert collector
// does for the routed experts.
type sharedDown struct {
	hidden, inter int
	gate, up      []float64 // [inter, hidden]
	sum           []float64 // upper triangle of Σ h hᵀ, [inter, inter]
	n             int64
}

// newSharedDown loads the shared expert's gate and up weights of m
// ([I, hidden] each, any float dtype) from src as float64.
// Errors: a missing tensor, a wrong shape, a non-float dtype.
func newSharedDown(src runtime.TensorSource, m *arch.MLP, hidden int) (*sharedDown, error) {
	load := func(name string) ([]float64, error) {
		t, err := src.Tensor(name)
		if err != nil {
			return nil, fmt.Errorf("wquant: shared expert: %w", err)
		}
		if len(t.Shape) != 2 || t.Shape[0] != m.IntermediateSize || t.Shape[1] != hidden {
			return nil, fmt.Errorf("wquant: %s: tensor %q: shape %v, want [%d, %d]", t.File, name, t.Shape, m.IntermediateSize, hidden)
		}
		v, err := t.Float32()
		if err != nil {
			return nil, fmt.Errorf("wquant: %s: tensor %q: %w", t.File, name, err)
		}
		out := make([]float64, len(v))
		for i, f := range v {
			out[i] = float64(f)
		}
		return out, nil
	}
	g, err := load(m.Gate)
	if err != nil {
		return nil, err
	}
	u, err := load(m.Up)
	if err != nil {
		return nil, err
	}
	I := m.IntermediateSize
	return &sharedDown{hidden: hidden, inter: I, gate: g, up: u, sum: make([]float64, I*I)}, nil
}

// add accumulates n tokens' MoE block inputs x, [n, hidden] float32.
// Errors: a wrong length, a non-finite input.
func (s *sharedDown) add(x []float32, n int) error {
	H, I := s.hidden, s.inter
	if n < 0 || len(x) < n*H {
		return fmt.Errorf("wquant: shared expert down_proj Hessian: input has %d elements, want %d×%d", len(x), n, H)
	}
	if n == 0 {
		return nil
	}
	X := make([]float64, n*H)
	for i, v := range x[:n*H] {
		if !finite(float64(v)) {
			return fmt.Errorf("wquant: shared expert down_proj Hessian: input [%d, %d] is %v", i/H, i%H, v)
		}
		X[i] = float64(v)
	}
	G := make([]float64, n*I)
	U := make([]float64, n*I)
	gen := func(W, C []float64) {
		blas64.Gemm(blas.NoTrans, blas.Trans, 1, blas64.General{Rows: n, Cols: H, Stride: H, Data: X},
			blas64.General{Rows: I, Cols: H, Stride: H, Data: W}, 0, blas64.General{Rows: n, Cols: I, Stride: I, Data: C})
	}
	gen(s.gate, G)
	gen(s.up, U)
	for i, g := range G {
		G[i] = g / (1 + math.Exp(-g)) * U[i]
	}
	blas64.Syrk(blas.Trans, 1, blas64.General{Rows: n, Cols: I, Stride: I, Data: G}, 1,
		blas64.Symmetric{Uplo: blas.Upper, N: I, Stride: I, Data: s.sum})
	s.n += int64(n)
	return nil
}

// hessian returns (2/N)·Σ h hᵀ over the N tokens added, [I, I], in the
// weights.Hessian convention (zero with no tokens). It scales the sum in
// place (the accumulator is spent: add no more tokens).
// Errors: weights.ErrNonFinite (an overflowed activation).
func (s *sharedDown) hessian() (*weights.Hessian, error) {
	I := s.inter
	f := 0.0
	if s.n > 0 {
		f = 2 / float64(s.n)
	}
	for i := 0; i < I; i++ {
		for j := i; j < I; j++ {
			v := s.sum[i*I+j] * f
			s.sum[i*I+j], s.sum[j*I+i] = v, v
		}
	}
	h, err := weights.NewHessianFromMatrix(I, s.sum)
	s.sum = nil
	if err != nil {
		return nil, fmt.Errorf("wquant: shared expert down_proj Hessian: %w", err)
	}
	return h, nil
}

// layerDesc is the description of the one-layer model that runs block l
// of d alone (loadLayer): that block as layer 0 (tensor names unchanged),
// a 1-row tied embedding stub, no quantization section.
func layerDesc(d *arch.Description, l int) *arch.Description {
	d1 := *d
	d1.Layers = []arch.Layer{d.Layers[l]}
	d1.VocabSize, d1.TieWordEmbeddings, d1.BOSTokenID, d1.EOSTokenIDs, d1.Quant = 1, true, -1, nil, nil
	return &d1
}

// hessiansExperts is the observer of a block's Hessian pass that also
// collects its routed experts' statistics.
type hessiansExperts struct {
	*hessians
	ex *calibrate.ExpertCollector
}

// FFNInput implements runtime.FFNObserver for both.
func (o *hessiansExperts) FFNInput(layer, pos, n int, x, d []float32) {
	o.hessians.FFNInput(layer, pos, n, x, d)
	o.ex.FFNInput(layer, pos, n, x, d)
}

// RouterLogits implements runtime.RouterObserver.
func (o *hessiansExperts) RouterLogits(layer, pos, n int, logits []float32, selected []int32) {
	o.ex.RouterLogits(layer, pos, n, logits, selected)
}

// layerSource serves one block's tensors to a one-layer model: a zero
// [1, hidden] embedding stub, float32 replacements (dequantized weights),
// and everything else from the checkpoint.
type layerSource struct {
	base      runtime.TensorSource
	embedding string
	hidden    int
	repl      map[string][]float32
	shapes    map[string][]int
}

func (s *layerSource) Tensor(name string) (*safetensors.Tensor, error) {
	if name == s.embedding {
		return &safetensors.Tensor{Name: name, File: "(stub)", DType: safetensors.F32, Shape: []int{1, s.hidden}, Data: make([]byte, 4*s.hidden)}, nil
	}
	if w, ok := s.repl[name]; ok {
		return &safetensors.Tensor{Name: name, File: "(dequantized)", DType: safetensors.F32, Shape: s.shapes[name], Data: safetensors.F32Bytes(w)}, nil
	}
	return s.base.Tensor(name)
}

// loadLayer loads block l of d alone as a one-layer runtime model whose
// weights come from src (with repl overriding weights by name).
func loadLayer(ctx context.Context, d *arch.Description, l int, src runtime.TensorSource, repl map[string][]float32, shapes map[string][]int, threads int) (runtime.Model, error) {
	return runtime.NewCPU().Load(ctx, layerDesc(d, l), &layerSource{base: src, embedding: d.Embedding, hidden: d.HiddenSize, repl: repl, shapes: shapes},
		runtime.LoadOptions{Threads: threads})
}

// pushHidden runs every window's hidden states through m in place.
func pushHidden(ctx context.Context, m runtime.Model, xs [][]float32, hidden int) error {
	hf, ok := m.(runtime.HiddenForwarder)
	if !ok {
		return fmt.Errorf("wquant: the runtime model cannot run hidden states")
	}
	for _, x := range xs {
		T := len(x) / hidden
		if err := hf.ForwardHidden(ctx, x, T, m.NewCache(T)); err != nil {
			return err
		}
	}
	return nil
}

// outputError returns the mean over calibration tokens of ‖(W − Ŵ)x‖²
// and of ‖Wx‖², both ½·Σ_r d_r H d_rᵀ with H = (2/N)Σxxᵀ ([cols, cols]
// float64), computed as ½·Σ (D∘(D·H)) with one BLAS product for D = W − Ŵ
// and one for W.
func outputError(w, wq []float32, rows, cols int, H []float64) (errv, energy float64) {
	D := make([]float64, rows*cols)
	O := make([]float64, rows*cols)
	for i := range D {
		O[i] = float64(w[i])
		D[i] = O[i] - float64(wq[i])
	}
	P := make([]float64, rows*cols)
	h := blas64.General{Rows: cols, Cols: cols, Stride: cols, Data: H}
	quad := func(A []float64) float64 {
		blas64.Gemm(blas.NoTrans, blas.NoTrans, 1, blas64.General{Rows: rows, Cols: cols, Stride: cols, Data: A}, h, 0,
			blas64.General{Rows: rows, Cols: cols, Stride: cols, Data: P})
		s := 0.0
		for i, a := range A {
			s += a * P[i]
		}
		return s / 2
	}
	return quad(D), quad(O)
}

// quantizeOne quantizes w ([rows, cols]) with method ("rtn" or "gptq")
// and options on threads workers (≤ 0: all cores), returning the packed
// result and its dequantized matrix.
func quantizeOne(w []float32, t Target, method string, o weights.Options, actOrder bool, damp float64, h *weights.Hessian, threads int) (*weights.Quantized, []float32, error) {
	var q *weights.Quantized
	var err error
	if method == MethodGPTQ {
		q, err = weights.QuantizeGPTQ(w, t.Rows, t.Cols, h, weights.GPTQOptions{Options: o, Damp: damp, ActOrder: actOrder, Threads: max(threads, 0)})
	} else {
		q, err = weights.QuantizeRTN(w, t.Rows, t.Cols, o)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("wquant: tensor %q (%d bits, group %d): %w", t.Name, o.Bits, o.GroupSize, err)
	}
	dq := make([]float32, t.Rows*t.Cols)
	q.Dequantize(dq)
	return q, dq, nil
}

// effectiveGroup returns the group size used for a tensor of cols
// columns: group when it divides cols, else 0 (per-channel).
func effectiveGroup(group, cols int) int {
	if group > 0 && cols%group != 0 {
		return 0
	}
	return group
}

// StorageBits returns the bits a [rows, cols] weight takes in the
// quantized checkpoint format (docs/QUANT.md): packed codes
// rows·ceil(cols·bits/8)·8, an fp16 scale per group, an fp16 zero-point
// per group unless symmetric, and 32 bits per column when it has a
// permutation. group ≤ 0 means per-channel (one group per row).
func StorageBits(rows, cols, bits, group int, symmetric, perm bool) int64 {
	g := group
	if g <= 0 || g > cols {
		g = cols
	}
	groups := int64(rows) * int64((cols+g-1)/g)
	b := int64(rows) * int64(weights.RowBytes(cols, bits)) * 8
	b += 16 * groups
	if !symmetric {
		b += 16 * groups
	}
	if perm {
		b += 32 * int64(cols)
	}
	return b
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
