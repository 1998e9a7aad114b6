package wquant

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/alloc"
	"github.com/lmpack/lmpack/quantize/gemq"
	"github.com/lmpack/lmpack/quantize/weights"
)

// Methods.
const (
	MethodRTN  = "rtn"
	MethodGPTQ = "gptq"
)

// Options configures Run. Exactly one of Bits (> 0) and TargetBPW (> 0)
// selects the widths; MoEBudget (> 0, with Bits) additionally chooses the
// widths of an MoE model's routed experts.
type Options struct {
	// Model is a model directory or hub id; Calib a calibration file of
	// that model holding its token ids (lmpack calibrate); Out the
	// directory to create (must not exist, nor lie inside Model).
	Model, Calib, Out string
	// Method is MethodRTN or MethodGPTQ.
	Method string
	// Bits (2, 3, 4, 8) and GroupSize (32, 64, 128, 0 = per-channel) for
	// every tensor. A tensor whose columns the group does not divide falls
	// back to per-channel (reported as group_fallback).
	Bits, GroupSize int
	// Symmetric selects the symmetric grid (no stored zero-points).
	Symmetric bool
	// MSEClip searches each group's clipping range for the least squared
	// rounding error (weights.Options.MSEClip) for every weight, and in
	// the GEMQ coefficients' quantizer. Same storage format.
	MSEClip bool
	// ActOrder (GPTQ only) quantizes columns by decreasing Hessian diagonal.
	ActOrder bool
	// TrueSequential collects each input's Hessian on the block with the
	// weights before it quantized (q/k/v, then o_proj, then gate/up, then
	// down_proj and a shared expert's down_proj: four Hessian passes per
	// block instead of one), as the GPTQ reference's --true-sequential
	// does.
	TrueSequential bool
	// Damp is GPTQ's relative damping (0: 0.01).
	Damp float64
	// TargetBPW > 0 chooses (bits, group) per tensor from Choices so that
	// the quantized tensors take at most TargetBPW bits per weight
	// (StorageBits: codes, scales, zero-points) with the least summed
	// predicted error (exact DP, alloc.SolveDP).
	TargetBPW float64
	// Choices are the allocator's candidate options; nil means
	// DefaultChoices.
	Choices []Choice
	// MeasureTokens is how many calibration tokens (whole windows, at
	// least one) the allocator's error measurement runs; 0 means
	// DefaultMeasureTokens.
	MeasureTokens int
	// MoEBudget > 0 (MoE models only, with Bits for the other weights)
	// gives every routed expert a width in MoEWidths (1-4 bits) chosen by
	// GEMQ (quantize/gemq: coefficients, then exact DP or the Lagrangian
	// solver) so that the experts take at most MoEBudget bits per expert
	// weight as stored: codes plus an fp16 scale and zero-point per group
	// of MoEGroup and each row's padding to whole bytes, the same counting
	// as TargetBPW. Attention weights and shared experts keep Bits and
	// GroupSize (shared experts are not in the budget). Experts are
	// always asymmetric (Symmetric applies to the other weights) and are
	// quantized with Method; with GPTQ their Hessians come from the
	// calibration file's expert statistics (calibrate.ExpertLayer.Hessians:
	// a sparse expert falls back to the layer's pooled input Hessian and
	// the identity, with a warning in Report.Warnings).
	MoEBudget float64
	// MoEGroup is the experts' group size under MoEBudget (0, the default:
	// per output channel, as GEMQ's coefficients); it must divide every
	// expert weight's columns.
	MoEGroup int
	// MoEWeighting is GEMQ's forward-only weighting (gemq.WeightRouted
	// when empty, gemq.WeightSoft, gemq.WeightKL).
	MoEWeighting gemq.Weighting
	// MoERule requires, in every MoE layer, one expert at 4 bits and
	// another at 3 (GEMQ's per-layer rule, docs/METHODS.md §4 step 3).
	MoERule bool
	// MoESolver is gemq.SolverDP (when empty) or gemq.SolverLagrangian.
	MoESolver gemq.Solver
	// MoEMinTokens is the sparse-expert threshold of both the GEMQ
	// coefficients' fallback and the expert Hessians' fallback (0:
	// calibrate.DefaultMinExpertTokens).
	MoEMinTokens int
	// PerTensor overrides the options of named weights (bits, group,
	// symmetric), after the allocation. A hook for later stages (MoE
	// expert widths); the CLI does not set it.
	PerTensor map[string]weights.Options
	// Threads is the CPU worker count (≤ 0: all cores).
	Threads int
	// Version is the lmpack version recorded in the report.
	Version string
	// Progress, when not nil, is called after each block with (blocks
	// done, total); the allocator's measurement pass counts as L more.
	Progress func(done, total int)
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
	// floatExpertHessians (tests) takes the routed experts' GPTQ Hessians
	// from the calibration file (float model) instead of collecting them
	// on the quantized prefix's hidden states.
	floatExpertHessians bool
}

// DefaultMeasureTokens is the allocator's default measurement size.
const DefaultMeasureTokens = 2048

// Choice is one allocator option: a code width and a group size (0 =
// per-channel).
type Choice struct {
	Bits      int `json:"bits"`
	GroupSize int `json:"group_size"`
}

// DefaultChoices are bits {2, 3, 4, 8} × group {32, 64, 128, per-channel}.
func DefaultChoices() []Choice {
	var c []Choice
	for _, b := range []int{2, 3, 4, 8} {
		for _, g := range []int{32, 64, 128, 0} {
			c = append(c, Choice{b, g})
		}
	}
	return c
}

// TensorReport is one quantized weight in the Report.
type TensorReport struct {
	Target
	Bits      int  `json:"bits"`
	GroupSize int  `json:"group_size"` // effective; = cols for per-channel
	Symmetric bool `json:"symmetric"`
	Perm      bool `json:"perm"`
	// GroupFallback: the requested group did not divide cols, so the
	// tensor is per-channel.
	GroupFallback bool `json:"group_fallback,omitempty"`
	// BitsPerWeight counts codes, scales, zero-points and the permutation.
	BitsPerWeight float64 `json:"bits_per_weight"`
	// BytesBefore (stored dtype) and BytesAfter (quantized storage).
	BytesBefore int64 `json:"bytes_before"`
	BytesAfter  int64 `json:"bytes_after"`
	// Error is the mean over calibration tokens of ‖(W − Ŵ)x‖² for the
	// tensor's actual inputs x; RelError divides it by the mean ‖Wx‖².
	Error    float64 `json:"error"`
	RelError float64 `json:"rel_error"`
}

// LayerReport sums a block's tensors.
type LayerReport struct {
	Layer         int     `json:"layer"`
	BitsPerWeight float64 `json:"bits_per_weight"`
	Error         float64 `json:"error"`
	Seconds       float64 `json:"seconds"`
}

// Report describes a finished Run.
type Report struct {
	Out       string  `json:"out"`
	Method    string  `json:"method"`
	MSEClip   bool    `json:"mse_clip,omitempty"`
	TargetBPW float64 `json:"target_bpw,omitempty"`
	// Params is the number of quantized weights; BitsPerWeight their
	// storage bits per weight (codes, scales, zero-points, permutations).
	Params        int64   `json:"params"`
	BitsPerWeight float64 `json:"bits_per_weight"`
	// PredictedError is Σ TensorReport.Error.
	PredictedError float64 `json:"predicted_error"`
	// QuantBytesBefore/After: the quantized tensors before (stored dtype)
	// and after; BytesBefore/After: all tensor data of the checkpoint.
	QuantBytesBefore int64 `json:"quant_bytes_before"`
	QuantBytesAfter  int64 `json:"quant_bytes_after"`
	BytesBefore      int64 `json:"bytes_before"`
	BytesAfter       int64 `json:"bytes_after"`
	// CalibTokens is the number of calibration tokens used.
	CalibTokens int `json:"calib_tokens"`
	// MoEBudget echoes Options.MoEBudget; MoE is the GEMQ allocation
	// (widths per layer and expert, bits per expert weight, predicted
	// error Σc[l,e,b], solver gap, warnings) and ExpertBitsPerWeight the
	// experts' stored bits per weight as written (codes, scales,
	// zero-points), ≤ MoEBudget.
	MoEBudget           float64          `json:"moe_budget,omitempty"`
	MoE                 *gemq.Allocation `json:"moe_allocation,omitempty"`
	ExpertBitsPerWeight float64          `json:"expert_bits_per_weight,omitempty"`
	// Warnings: experts that fell back (sparse or never routed), in the
	// allocation or in the GPTQ Hessians.
	Warnings []string `json:"warnings,omitempty"`
	// Allocation is the allocator's plan (TargetBPW only): the chosen
	// option per tensor, in Tensors order; its errors are relative
	// block-output errors (Σ‖y − ŷ‖²/Σ‖y‖² of the block with only that
	// tensor quantized), not TensorReport.Error.
	Allocation *alloc.Plan     `json:"allocation,omitempty"`
	Layers     []LayerReport   `json:"layers"`
	Tensors    []TensorReport  `json:"tensors"`
	Seconds    float64         `json:"seconds"`
	Version    string          `json:"lmpack_version,omitempty"`
	Config     json.RawMessage `json:"quantization"`
}

// spec is the resolved quantization of one target.
type spec struct {
	o        weights.Options
	fallback bool
}

// Run quantizes opt.Model's decoder-block weights with the calibration
// tokens of opt.Calib and writes the quantized checkpoint to opt.Out (a
// temporary directory beside it, renamed at the end). See the package doc
// for the pipeline and docs/QUANT.md for the output.
//
// An MoE model is quantized with Bits (every expert at Bits too) or with
// MoEBudget (GEMQ widths per expert, see Options.MoEBudget); the
// calibration file must hold its expert statistics.
//
// Errors: ErrOptions (Validate and ValidateModel, wrapping their
// *field.Error; also a MoEBudget below the all-1-bit cost); ErrOutput;
// ErrUnsupported (already quantized); ErrCalibration (no
// token ids, no expert statistics); model.ErrModelMismatch (a calibration
// file of another model); quantizer errors naming the tensor; I/O errors
// naming the file.
func Run(ctx context.Context, opt Options) (*Report, error) {
	t0 := time.Now()
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	dir, d, ck, err := model.Open(ctx, opt.Model, nil)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	if err := checkOut(dir, opt.Out); err != nil {
		return nil, err
	}
	targets, err := Targets(d)
	if err != nil {
		return nil, err
	}
	fp, err := model.Fingerprint(dir, ck)
	if err != nil {
		return nil, err
	}
	cal, err := calibrate.Read(opt.Calib, model.Expect{ModelFingerprint: fp, Desc: d})
	if err != nil {
		return nil, err
	}
	wins := cal.CalibrationWindows()
	if len(wins) == 0 {
		return nil, fmt.Errorf("%w: %s holds no calibration token ids (written by an older lmpack calibrate; calibrate again)", ErrCalibration, opt.Calib)
	}
	if err := opt.ValidateModel(d); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrOptions, opt.Model, err)
	}
	moe := isMoE(d)
	switch {
	case moe && len(cal.Experts) == 0:
		return nil, fmt.Errorf("%w: %s holds no expert statistics for the MoE model %s (calibrate again with this lmpack)", ErrCalibration, opt.Calib, opt.Model)
	}
	p := &pipeline{opt: opt, d: d, ck: ck, targets: targets, wins: wins, experts: cal.Experts, floatExpertHessians: opt.floatExpertHessians}
	if opt.Logger == nil {
		p.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	} else {
		p.log = opt.Logger
	}
	L := len(d.Layers)
	p.total = L
	if opt.TargetBPW > 0 {
		p.total = 2 * L
	}
	if opt.MoEBudget > 0 {
		p.total = L + 1
	}
	specs := make([]spec, len(targets))
	rep := &Report{Method: opt.Method, MSEClip: opt.MSEClip, TargetBPW: opt.TargetBPW, MoEBudget: opt.MoEBudget, Version: opt.Version, Out: opt.Out}
	for _, w := range wins {
		rep.CalibTokens += len(w)
	}
	if opt.TargetBPW > 0 {
		plan, sp, err := p.allocate(ctx)
		if err != nil {
			return nil, err
		}
		rep.Allocation = plan
		specs = sp
	} else {
		for i, t := range targets {
			g := effectiveGroup(opt.GroupSize, t.Cols)
			specs[i] = spec{o: weights.Options{Bits: opt.Bits, GroupSize: g, Symmetric: opt.Symmetric, MSEClip: opt.MSEClip}, fallback: g != opt.GroupSize}
		}
	}
	if opt.MoEBudget > 0 {
		a, err := p.allocateMoE(ctx)
		if err != nil {
			return nil, err
		}
		if err := p.moeSpecs(a, specs); err != nil {
			return nil, err
		}
		rep.MoE = a
		rep.Warnings = append(rep.Warnings, a.Warnings...)
	}
	for i, t := range targets {
		if o, ok := opt.PerTensor[t.Name]; ok {
			g := effectiveGroup(o.GroupSize, t.Cols)
			specs[i] = spec{o: weights.Options{Bits: o.Bits, GroupSize: g, Symmetric: o.Symmetric, MSEClip: o.MSEClip}, fallback: g != o.GroupSize}
		}
	}

	var qErr error // the pipeline's, returned unchanged
	err = fsx.WriteDir(opt.Out, func(tmp string) error {
		qErr = p.quantize(ctx, specs, tmp, rep)
		return qErr
	})
	if err != nil && err != qErr {
		return nil, fmt.Errorf("wquant: output %s: %w", opt.Out, err)
	} else if err != nil {
		return nil, err
	}
	rep.Seconds = time.Since(t0).Seconds()
	return rep, nil
}

// pipeline is the state of one Run.
type pipeline struct {
	opt     Options
	d       *arch.Description
	ck      *safetensors.Checkpoint
	targets []Target
	wins    [][]int
	experts []calibrate.ExpertLayer
	// seqExperts holds the current layer's expert statistics collected on
	// the quantized prefix's hidden states (nil for a dense layer, or with
	// floatExpertHessians).
	seqExperts          *calibrate.ExpertLayer
	floatExpertHessians bool
	log                 *slog.Logger
	done                int
	total               int
}

func (p *pipeline) progress() {
	p.done++
	if p.opt.Progress != nil {
		p.opt.Progress(p.done, p.total)
	}
}

// hidden returns the embedding rows of every window: [T_w, hidden] each.
func (p *pipeline) hidden() ([][]float32, error) {
	H := p.d.HiddenSize
	t, err := p.ck.Tensor(p.d.Embedding)
	if err != nil {
		return nil, fmt.Errorf("wquant: %w", err)
	}
	if !slices.Equal(t.Shape, []int{p.d.VocabSize, H}) {
		return nil, fmt.Errorf("wquant: %s: tensor %q: shape %v, want [%d, %d]", t.File, p.d.Embedding, t.Shape, p.d.VocabSize, H)
	}
	emb, err := t.Float32()
	if err != nil {
		return nil, fmt.Errorf("wquant: %s: tensor %q: %w", t.File, p.d.Embedding, err)
	}
	xs := make([][]float32, len(p.wins))
	for i, w := range p.wins {
		x := make([]float32, len(w)*H)
		for j, id := range w {
			copy(x[j*H:(j+1)*H], emb[id*H:(id+1)*H])
		}
		xs[i] = x
	}
	return xs, nil
}

// weight loads target t as float32 [rows, cols].
func (p *pipeline) weight(t Target) ([]float32, error) {
	tt, err := p.ck.Tensor(t.Name)
	if err != nil {
		return nil, fmt.Errorf("wquant: %w", err)
	}
	if !slices.Equal(tt.Shape, []int{t.Rows, t.Cols}) {
		return nil, fmt.Errorf("wquant: %s: tensor %q: shape %v, want [%d, %d]", tt.File, t.Name, tt.Shape, t.Rows, t.Cols)
	}
	w, err := tt.Float32()
	if err != nil {
		return nil, fmt.Errorf("wquant: %s: tensor %q: %w", tt.File, t.Name, err)
	}
	for i, v := range w {
		if !finite(float64(v)) {
			return nil, fmt.Errorf("wquant: %s: tensor %q: element [%d, %d] is %v", tt.File, t.Name, i/t.Cols, i%t.Cols, v)
		}
	}
	return w, nil
}

// layerHessians runs xs through block l (weights from the checkpoint)
// with the Hessian observers. When advance, xs becomes the block's output.
func (p *pipeline) layerHessians(ctx context.Context, l int, xs [][]float32, advance bool) (*hessians, error) {
	return p.layerHessiansWith(ctx, l, xs, advance, nil, nil, nil, true)
}

// layerHessiansWith is layerHessians with weights repl (shapes) replacing
// the checkpoint's; ex, when not nil, also collects the block's expert
// statistics (the one-layer model reports the block as layer 0). With
// withShared and a shared expert in block l it also accumulates the
// shared down_proj's Hessian (h[inSharedDown]) from the shared gate/up
// weights the block runs with (the checkpoint's, or repl's when already
// quantized: TrueSequential).
func (p *pipeline) layerHessiansWith(ctx context.Context, l int, xs [][]float32, advance bool, repl map[string][]float32, shapes map[string][]int, ex *calibrate.ExpertCollector, withShared bool) (*hessians, error) {
	m, err := loadLayer(ctx, p.d, l, p.ck, repl, shapes, p.opt.Threads)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var sd *sharedDown
	if mo := p.d.Layers[l].MoE; withShared && mo != nil && mo.Shared != nil {
		src := &layerSource{base: p.ck, embedding: p.d.Embedding, hidden: p.d.HiddenSize, repl: repl, shapes: shapes}
		if sd, err = newSharedDown(src, mo.Shared, p.d.HiddenSize); err != nil {
			return nil, err
		}
	}
	hs := newHessians(&p.d.Layers[l], p.d.HiddenSize, sd)
	if ex != nil {
		m.SetObserver(&hessiansExperts{hessians: hs, ex: ex})
	} else {
		m.SetObserver(hs)
	}
	if advance {
		if err := pushHidden(ctx, m, xs, p.d.HiddenSize); err != nil {
			return nil, err
		}
		return hs, layerErr(l, hs.finish())
	}
	// One window at a time through a scratch copy: the hidden states are
	// not duplicated.
	var buf []float32
	for _, x := range xs {
		buf = append(buf[:0], x...)
		if err := pushHidden(ctx, m, [][]float32{buf}, p.d.HiddenSize); err != nil {
			return nil, err
		}
	}
	return hs, layerErr(l, hs.finish())
}

// layerErr names decoder layer l in a Hessian error (whose message names
// the input: q/k/v, o_proj, FFN, down_proj or the shared expert's
// down_proj), or returns nil.
func layerErr(l int, err error) error {
	if err != nil {
		return fmt.Errorf("layer %d: %w", l, err)
	}
	return nil
}

// quantize is the main pass: block by block, Hessians on the quantized
// prefix's hidden states, quantization, the block's shard, the next
// block's input through the dequantized block (quantizeBlock); then the
// tensors outside the blocks, the index and config.json (writeRest).
func (p *pipeline) quantize(ctx context.Context, specs []spec, tmp string, rep *Report) error {
	xs, err := p.hidden()
	if err != nil {
		return err
	}
	L := len(p.d.Layers)
	out := &quantOut{
		tmp:       tmp,
		layers:    L,
		byLayer:   layerTensors(p.ck.Names()),
		weightMap: map[string]string{},
		qcfg:      &arch.Quantization{Format: arch.QuantFormat, Version: arch.QuantVersion, Method: p.opt.Method, Tensors: map[string]arch.TensorQuant{}},
	}
	for l := 0; l < L; l++ {
		if err := p.quantizeBlock(ctx, l, specs, xs, out, rep); err != nil {
			return err
		}
	}
	return p.writeRest(out, rep)
}

// quantOut accumulates what the main pass writes: the shards' weight map
// and total size, the quantization block of config.json and the routed
// experts' storage bits and parameters.
type quantOut struct {
	tmp                      string // output directory being written
	layers                   int    // L; the model has L+1 shards
	byLayer                  map[int][]string
	weightMap                map[string]string
	totalSize                int64
	qcfg                     *arch.Quantization
	expertBits, expertParams int64
}

// shard is the file name of shard i (block i, or L for the rest).
func (o *quantOut) shard(i int) string {
	return fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, o.layers+1)
}

// quantBlock is the state of one block during the main pass.
type quantBlock struct {
	l int
	// repl and shapes hold the dequantized weights quantized so far; the
	// block's later stages and the next block's input run with them.
	repl      map[string][]float32
	shapes    map[string][]int
	files     []safetensors.WriteTensor
	quantized map[string]bool
	lr        LayerReport
	bits      int64
	params    int64
	// expertH caches each routed expert's (input, down_proj) Hessians.
	expertH map[[2]int][2]*weights.Hessian
}

// blockStages are the Hessian passes of a block: one for all inputs, or
// with TrueSequential one per input, each on the block with the weights
// quantized in the earlier stages.
func (p *pipeline) blockStages() [][]int {
	if p.opt.TrueSequential {
		return [][]int{{inAttn}, {inO}, {inFFN}, {inDown, inSharedDown}}
	}
	return [][]int{{inAttn, inO, inFFN, inDown, inSharedDown}}
}

// quantizeBlock quantizes the targets of block l stage by stage
// (quantizeStage), writes the block's shard (its unquantized tensors
// copied) and advances xs through the dequantized block.
func (p *pipeline) quantizeBlock(ctx context.Context, l int, specs []spec, xs [][]float32, out *quantOut, rep *Report) error {
	lt := time.Now()
	b := &quantBlock{l: l, repl: map[string][]float32{}, shapes: map[string][]int{}, quantized: map[string]bool{},
		lr: LayerReport{Layer: l}, expertH: map[[2]int][2]*weights.Hessian{}}
	p.seqExperts = nil
	for _, stage := range p.blockStages() {
		if err := p.quantizeStage(ctx, b, stage, specs, xs, out, rep); err != nil {
			return err
		}
	}
	// Unquantized tensors of the block (norms, biases) are copied.
	for _, n := range out.byLayer[l] {
		if b.quantized[n] {
			continue
		}
		t, err := p.ck.Tensor(n)
		if err != nil {
			return fmt.Errorf("wquant: %w", err)
		}
		b.files = append(b.files, safetensors.WriteTensor{Name: n, DType: t.DType, Shape: t.Shape, Data: t.Data})
	}
	size, err := writeShard(filepath.Join(out.tmp, out.shard(l)), b.files, out.weightMap)
	if err != nil {
		return err
	}
	out.totalSize += size
	m, err := loadLayer(ctx, p.d, l, p.ck, b.repl, b.shapes, p.opt.Threads)
	if err != nil {
		return err
	}
	err = pushHidden(ctx, m, xs, p.d.HiddenSize)
	m.Close()
	if err != nil {
		return err
	}
	b.lr.BitsPerWeight = float64(b.bits) / float64(b.params)
	b.lr.Seconds = time.Since(lt).Seconds()
	rep.Layers = append(rep.Layers, b.lr)
	p.log.Info("layer quantized", "layer", l, "bits_per_weight", b.lr.BitsPerWeight, "error", b.lr.Error, "seconds", b.lr.Seconds)
	p.progress()
	return nil
}

// quantizeStage runs one Hessian pass of block b over xs (with the
// weights quantized so far; collecting the routed experts' statistics on
// the quantized prefix in the pass that gives the FFN input Hessian) and
// quantizes the block's targets whose input is in stage.
func (p *pipeline) quantizeStage(ctx context.Context, b *quantBlock, stage []int, specs []spec, xs [][]float32, out *quantOut, rep *Report) error {
	l := b.l
	var ex *calibrate.ExpertCollector
	if p.d.Layers[l].MoE != nil && slices.Contains(stage, inFFN) && !p.floatExpertHessians && p.hasExpertTargets(l) {
		var err error
		if ex, err = calibrate.NewExpertCollector(layerDesc(p.d, l), p.ck, p.allExpertSamples(), nil); err != nil {
			return fmt.Errorf("wquant: layer %d expert statistics: %w", l, err)
		}
	}
	hs, err := p.layerHessiansWith(ctx, l, xs, false, b.repl, b.shapes, ex, slices.Contains(stage, inSharedDown))
	if err != nil {
		return err
	}
	if ex != nil {
		if err := p.keepSeqExperts(ex, l, xs); err != nil {
			return err
		}
	}
	for ti := range p.targets {
		if p.targets[ti].Layer != l || !slices.Contains(stage, p.targets[ti].input) {
			continue
		}
		if err := p.quantizeTarget(b, p.targets[ti], specs[ti], hs, out, rep); err != nil {
			return err
		}
	}
	return nil
}

// keepSeqExperts sets p.seqExperts to block l's expert statistics that ex
// collected over the tokens of xs.
func (p *pipeline) keepSeqExperts(ex *calibrate.ExpertCollector, l int, xs [][]float32) error {
	T := 0
	for _, x := range xs {
		T += len(x) / p.d.HiddenSize
	}
	got, err := ex.Result(T)
	if err != nil {
		return fmt.Errorf("wquant: layer %d expert statistics on the quantized prefix: %w", l, err)
	}
	if len(got) != 1 {
		return fmt.Errorf("wquant: layer %d: expert statistics of %d layers, want 1", l, len(got))
	}
	got[0].Layer = l
	p.seqExperts = &got[0]
	return nil
}

// targetHessian is the Hessian target t is quantized with: the block's
// for its input, or for a routed expert its own (input or down_proj,
// computed once per expert and cached in b.expertH; a sparse expert's
// fallback is added to rep's warnings).
func (p *pipeline) targetHessian(b *quantBlock, t Target, hs *hessians, rep *Report) (*weights.Hessian, error) {
	if !t.IsExpert() {
		return hs.h[t.input], nil
	}
	key := [2]int{t.Layer, t.Expert}
	eh, ok := b.expertH[key]
	if !ok {
		hin, hdown, warn, err := p.expertHessians(t.Layer, t.Expert)
		if err != nil {
			return nil, err
		}
		if warn != "" {
			rep.Warnings = append(rep.Warnings, warn)
			p.log.Warn("sparse expert", "layer", t.Layer, "expert", t.Expert, "fallback", warn)
		}
		eh = [2]*weights.Hessian{hin, hdown}
		b.expertH[key] = eh
	}
	if t.input == inDown {
		return eh[1], nil
	}
	return eh[0], nil
}

// quantizeTarget quantizes target t with spec sp and its Hessian, keeps
// its dequantized weight in b for the rest of the block, adds its storage
// tensors to b's shard and its format to out.qcfg, and records its sizes
// and output error in rep and b.
func (p *pipeline) quantizeTarget(b *quantBlock, t Target, sp spec, hs *hessians, out *quantOut, rep *Report) error {
	w, err := p.weight(t)
	if err != nil {
		return err
	}
	h, err := p.targetHessian(b, t, hs, rep)
	if err != nil {
		return err
	}
	// Under a moe budget an expert's act-order permutation (32
	// bits a column with groups) is not in the allocation's
	// costs: experts then keep the natural order unless per-channel.
	ao := p.opt.ActOrder && !(t.IsExpert() && p.opt.MoEBudget > 0 && sp.o.GroupSize > 0 && sp.o.GroupSize < t.Cols)
	q, dq, err := quantizeOne(w, t, p.opt.Method, sp.o, ao, p.opt.Damp, h, p.opt.Threads)
	if err != nil {
		return err
	}
	e, energy := outputError(w, dq, t.Rows, t.Cols, h.Matrix())
	b.repl[t.Name], b.shapes[t.Name] = dq, []int{t.Rows, t.Cols}
	b.files = append(b.files, storageTensors(t.Name, q)...)
	b.quantized[t.Name] = true
	out.qcfg.Tensors[t.Name] = arch.TensorQuant{Bits: q.Bits, GroupSize: q.GroupSize, Symmetric: q.Symmetric, Perm: q.Perm != nil}
	bits := StorageBits(t.Rows, t.Cols, q.Bits, q.GroupSize, q.Symmetric, q.Perm != nil)
	info, _, _ := p.ck.Info(t.Name)
	before := int64(t.Rows*t.Cols) * int64(info.DType.Size())
	tr := TensorReport{Target: t, Bits: q.Bits, GroupSize: q.GroupSize, Symmetric: q.Symmetric, Perm: q.Perm != nil,
		GroupFallback: sp.fallback, BitsPerWeight: float64(bits) / float64(t.Rows*t.Cols),
		BytesBefore: before, BytesAfter: bits / 8, Error: e}
	if energy > 0 {
		tr.RelError = e / energy
	}
	rep.Tensors = append(rep.Tensors, tr)
	rep.Params += int64(t.Rows * t.Cols)
	rep.QuantBytesBefore += before
	rep.QuantBytesAfter += bits / 8
	rep.PredictedError += e
	b.bits += bits
	b.params += int64(t.Rows * t.Cols)
	if t.IsExpert() {
		out.expertBits += bits
		out.expertParams += int64(t.Rows * t.Cols)
	}
	b.lr.Error += e
	return nil
}

// writeRest writes the last shard (everything outside the blocks:
// embedding, final norm, lm_head), the shard index and config.json with
// the quantization block, copies the side files, and completes rep's
// sizes and bits per weight.
func (p *pipeline) writeRest(out *quantOut, rep *Report) error {
	var rest []safetensors.WriteTensor
	for _, n := range out.byLayer[-1] {
		t, err := p.ck.Tensor(n)
		if err != nil {
			return fmt.Errorf("wquant: %w", err)
		}
		rest = append(rest, safetensors.WriteTensor{Name: n, DType: t.DType, Shape: t.Shape, Data: t.Data})
	}
	size, err := writeShard(filepath.Join(out.tmp, out.shard(out.layers)), rest, out.weightMap)
	if err != nil {
		return err
	}
	out.totalSize += size
	if err := safetensors.WriteIndex(filepath.Join(out.tmp, "model.safetensors.index.json"), out.totalSize, out.weightMap); err != nil {
		return fmt.Errorf("wquant: %w", err)
	}
	for _, n := range p.ck.Names() {
		info, _, _ := p.ck.Info(n)
		rep.BytesBefore += int64(info.NumElements()) * int64(info.DType.Size())
	}
	rep.BytesAfter = out.totalSize
	rep.BitsPerWeight = float64(8*rep.QuantBytesAfter) / float64(rep.Params)
	if out.expertParams > 0 {
		rep.ExpertBitsPerWeight = float64(out.expertBits) / float64(out.expertParams)
	}
	cfg, err := quantConfig(filepath.Join(p.ck.Dir(), "config.json"), out.qcfg)
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(out.qcfg)
	rep.Config = raw
	if err := os.WriteFile(filepath.Join(out.tmp, "config.json"), cfg, 0o644); err != nil {
		return fmt.Errorf("wquant: %w", err)
	}
	return copySideFiles(p.ck.Dir(), out.tmp)
}

// storageTensors returns the docs/QUANT.md tensors of a quantized weight.
func storageTensors(name string, q *weights.Quantized) []safetensors.WriteTensor {
	p := arch.QuantPrefix(name)
	ng := q.Cols / q.GroupSize
	u16 := func(v []uint16) []byte {
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], x)
		}
		return b
	}
	out := []safetensors.WriteTensor{
		{Name: p + arch.SuffixQWeight, DType: safetensors.U8, Shape: []int{q.Rows, weights.RowBytes(q.Cols, q.Bits)}, Data: q.Codes},
		{Name: p + arch.SuffixScales, DType: safetensors.F16, Shape: []int{q.Rows, ng}, Data: u16(q.Scales)},
	}
	if !q.Symmetric {
		out = append(out, safetensors.WriteTensor{Name: p + arch.SuffixQZeros, DType: safetensors.F16, Shape: []int{q.Rows, ng}, Data: u16(q.Zeros)})
	}
	if q.Perm != nil {
		b := make([]byte, 4*len(q.Perm))
		for i, v := range q.Perm {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
		}
		out = append(out, safetensors.WriteTensor{Name: p + arch.SuffixPerm, DType: safetensors.I32, Shape: []int{q.Cols}, Data: b})
	}
	return out
}

// writeShard writes one shard (tensors sorted by name), records its
// tensors in weightMap and returns its tensor data bytes.
func writeShard(path string, ts []safetensors.WriteTensor, weightMap map[string]string) (int64, error) {
	slices.SortFunc(ts, func(a, b safetensors.WriteTensor) int { return strings.Compare(a.Name, b.Name) })
	var size int64
	for _, t := range ts {
		weightMap[t.Name] = filepath.Base(path)
		size += int64(len(t.Data))
	}
	if err := safetensors.WriteFile(path, ts, map[string]string{"format": "pt"}); err != nil {
		return 0, fmt.Errorf("wquant: %w", err)
	}
	return size, nil
}

var layerRE = regexp.MustCompile(`(^|\.)layers\.(\d+)\.`)

// layerTensors groups tensor names by decoder block (-1: outside blocks).
func layerTensors(names []string) map[int][]string {
	out := map[int][]string{}
	for _, n := range names {
		l := -1
		if m := layerRE.FindStringSubmatch(n); m != nil {
			if v, err := strconv.Atoi(m[2]); err == nil {
				l = v
			}
		}
		out[l] = append(out[l], n)
	}
	return out
}

// quantConfig returns config.json (at path) with the lmpack_quantization
// block set (arch.RewriteConfig). Errors name path.
func quantConfig(path string, q *arch.Quantization) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("wquant: %w", err)
	}
	out, err := arch.RewriteConfig(b, arch.ConfigEdit{Quant: q})
	if err != nil {
		return nil, fmt.Errorf("wquant: %s: %w", path, err)
	}
	return out, nil
}

// checkOut refuses an out that is modelDir, lies inside it, or exists
// (fsx.CheckNewDir). Errors: ErrOutput.
func checkOut(modelDir, out string) error {
	if err := fsx.CheckNewDir(modelDir, out, "the quantized checkpoint"); err != nil {
		return fmt.Errorf("%w: %v", ErrOutput, err)
	}
	return nil
}

// copySideFiles copies the tokenizer and other side files
// (fsx.CopySideFiles; the model card describes the float model and is not
// copied).
func copySideFiles(src, dst string) error {
	if err := fsx.CopySideFiles(src, dst); err != nil {
		return fmt.Errorf("wquant: %w", err)
	}
	return nil
}
