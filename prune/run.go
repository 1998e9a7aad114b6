package prune

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/prune/depth"
)

// ErrOptions: the options are invalid (budget, ratio, method).
var ErrOptions = errors.New("prune: bad options")

// Options configures Run (depth pruning).
type Options struct {
	// Model is a model directory or a Hugging Face hub id (model.Open).
	Model string
	// Calib is the calibration file (lmpack calibrate). Required for the
	// lorp and shortgpt methods; optional for list:, where it is only
	// checked against the model when given.
	Calib string
	// Out is the directory to create for the pruned checkpoint.
	Out string
	// Layers is the number of blocks to remove (> 0), or 0 to use
	// LayerRatio.
	Layers int
	// LayerRatio in (0, 1): remove round(LayerRatio·L) blocks (at least 1).
	LayerRatio float64
	// Method is "lorp", "shortgpt" or "list:3,7" (the layers to remove;
	// then Layers and LayerRatio must be 0 or agree with the list).
	Method string

	// Width pruning (Putri, docs/METHODS.md §6). It cannot be combined
	// with layer removal in one run, and needs dense (non-MoE) models.

	// HeadGroups is the number of GQA groups (one KV head and its query
	// heads) to remove over all layers, or 0 to use HeadRatio (both 0: no
	// head pruning). Every layer keeps at least one group (HeadBudget).
	HeadGroups int
	// HeadRatio in (0, 1): remove round(HeadRatio·total groups).
	HeadRatio float64
	// HeadMethod is HeadPutri (default when empty) or HeadProxy.
	HeadMethod string
	// HeadStep is the number of groups Putri removes per round (0: 1).
	HeadStep int
	// FFNRatio in (0, 1) removes round(FFNRatio·F) intermediate nodes of
	// every FFN (FFNKeepCount); 0: no FFN pruning.
	FFNRatio float64
	// NoRefit keeps the kept down_proj columns instead of the
	// least-squares refit.
	NoRefit bool
	// HeadRefit replaces the o_proj of every layer that loses head groups
	// by the least-squares refit on its kept input channels (Putri's
	// optional o_proj update, docs/METHODS.md §6; headsRefit), instead of
	// slicing its columns. It needs the calibration tokens and at least
	// RefitTokensPerUnit tokens per kept channel.
	HeadRefit bool
	// Sparsity in (0, 1), when not 0, is the fraction of decoder
	// parameters to remove by Putri's budget split (docs/METHODS.md §6,
	// SparsityPlan): it sets the head groups and the FFN keep count, so
	// HeadGroups, HeadRatio and FFNRatio must be 0 (and no layer removal).
	// HeadMethod, HeadStep and NoRefit apply as usual. Errors (ErrOptions)
	// name the sparsities the model can reach.
	Sparsity float64
	// keepAllFFN (tests) refits every FFN with all nodes kept.
	keepAllFFN bool
	// Threads is the CPU worker count for the model runs; <= 0: all cores.
	Threads int
	// Progress, when not nil, is called during width pruning with the
	// steps done and the steps expected: one per Putri masked-perplexity
	// run, per layer whose o_proj is refit, per FFN layer. The expected
	// total may shrink while Putri runs (later rounds are bounded from
	// above) and ends equal to done.
	Progress func(done, total int)
}

// RemovedLayer is one removed block in a Report.
type RemovedLayer struct {
	// Layer is the original block index.
	Layer int `json:"layer"`
	// Redundancy is LoRP's r(l) (lorp only).
	Redundancy *float64 `json:"redundancy,omitempty"`
	// BlockInfluence is ShortGPT's BI_l (whenever the calibration file was
	// given).
	BlockInfluence *float64 `json:"block_influence,omitempty"`
}

// Report describes a finished Run.
type Report struct {
	Model string `json:"model"`
	Out   string `json:"out"`
	// Method is "lorp", "shortgpt" or "list".
	Method string `json:"method"`
	// LayersBefore and LayersAfter are L and L'.
	LayersBefore int `json:"layers_before"`
	LayersAfter  int `json:"layers_after"`
	// RLS, K and Labels ([L]) are LoRP's (see depth.Plan); zero for others.
	RLS    float64 `json:"rls,omitempty"`
	K      int     `json:"k,omitempty"`
	Labels []int   `json:"labels,omitempty"`
	// Fallback and FallbackReason are the plan's (depth.Plan): set when a
	// degenerate LoRP clustering made Block Influence choose the layers.
	Fallback       string `json:"fallback,omitempty"`
	FallbackReason string `json:"fallback_reason,omitempty"`
	// Removed lists the removed blocks, ascending.
	Removed []RemovedLayer `json:"removed"`
	// Kept lists the original index of each new block.
	Kept []int `json:"kept"`
	// Before and After count every tensor of the input and output
	// checkpoints (elements; data bytes in their stored dtype).
	Before Sizes `json:"before"`
	After  Sizes `json:"after"`
	// Plan is the depth plan applied (nil for width pruning).
	Plan *depth.Plan `json:"plan"`

	// HeadMethod is HeadPutri or HeadProxy when head groups were removed.
	HeadMethod string `json:"head_method,omitempty"`
	// HeadBasePPL is the unmasked perplexity of the Putri scoring sequence.
	HeadBasePPL float64 `json:"head_base_ppl,omitempty"`
	// HeadsRemoved lists the removed groups by (layer, group).
	HeadsRemoved []RemovedGroup `json:"heads_removed,omitempty"`
	// HeadRefit tells whether o_proj was refit by least squares
	// (Options.HeadRefit) in the layers that lost head groups.
	HeadRefit bool `json:"head_refit,omitempty"`
	// FFN lists every layer's FFN size before and after (FFN pruning).
	FFN []FFNLayer `json:"ffn,omitempty"`
	// Refit tells whether down_proj was refit by least squares.
	Refit bool `json:"refit,omitempty"`
	// LayerSizes is each layer's shape after width pruning (the
	// layer_configs written to config.json).
	LayerSizes []LayerSize `json:"layer_sizes,omitempty"`
	// Sparsity is the budget Options.Sparsity resolved to and the
	// decoder-parameter sparsity achieved (nil without Sparsity).
	Sparsity *SparsityPlan `json:"sparsity,omitempty"`
}

// LayerBudget turns Options.Layers / LayerRatio into a block count for an
// L-block model: exactly one of them must be set; the ratio must lie in
// (0, 1) and gives round(r·L), at least 1. Errors: ErrOptions.
func LayerBudget(layers int, ratio float64, L int) (int, error) {
	switch {
	case layers != 0 && ratio != 0:
		return 0, fmt.Errorf("%w: give the number of layers or the layer ratio, not both", ErrOptions)
	case layers < 0:
		return 0, fmt.Errorf("%w: layers %d: want > 0", ErrOptions, layers)
	case layers > 0:
		return layers, nil
	case ratio == 0:
		return 0, fmt.Errorf("%w: give the number of layers to remove or a layer ratio", ErrOptions)
	case !(ratio > 0 && ratio < 1):
		return 0, fmt.Errorf("%w: layer ratio %v: want in (0, 1)", ErrOptions, ratio)
	}
	return max(1, int(math.Round(ratio*float64(L)))), nil
}

// ParseList parses the layers of a "list:3,7" method. Errors: ErrOptions
// for an empty list or a non-integer entry.
func ParseList(spec string) ([]int, error) {
	s, ok := strings.CutPrefix(spec, "list:")
	if !ok || s == "" {
		return nil, fmt.Errorf("%w: method %q: want list:L1,L2,... (layer indices)", ErrOptions, spec)
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%w: method %q: %q is not a layer index", ErrOptions, spec, f)
		}
		out = append(out, n)
	}
	return out, nil
}

// Run is `lmpack prune` for depth: it opens the model's checkpoint, reads
// and checks the calibration file (same model fingerprint and layer
// count), builds the plan (depth.LoRP on the leading L×L block of the
// similarity, depth.ShortGPT on the full (L+1)×(L+1) matrix, or
// depth.ListPlan) and applies it (ApplyDepth).
//
// Errors: ErrOptions (Validate and ValidateModel, wrapping their
// *field.Error, and budgets the calibration decides); ErrNoStatistic when
// the calibration file has no "lorp" statistic ("re-run lmpack
// calibrate"); model.ErrModelMismatch
// and other calibrate.Read errors; depth errors (ErrTooManyLayers,
// ErrProtectedLayer, ErrLayerRange); ApplyDepth's errors.
//
// When opt asks for head groups or FFN units (HeadGroups, HeadRatio,
// FFNRatio, Sparsity) Run does width pruning instead (see the package doc): the
// report then has HeadsRemoved, FFN and LayerSizes, Method "none" and no
// Plan. Extra errors: ErrOptions (depth and width together, an MoE model,
// a head count that breaks GQA grouping, bad ratios or method);
// ErrNoStatistic (no token ids, or no head proxy for proxy); runtime and
// prune/width errors.
func Run(ctx context.Context, opt Options) (*Report, error) {
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	dir, desc, ck, err := model.Open(ctx, opt.Model, nil)
	if err != nil {
		return nil, fmt.Errorf("prune: %w", err)
	}
	defer ck.Close()
	if err := opt.ValidateModel(desc); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrOptions, dir, err)
	}
	if desc.Quant != nil {
		return nil, fmt.Errorf("%w: %s is a quantized checkpoint (lmpack_quantization in config.json): prune the float checkpoint, then quantize the result", ErrOptions, dir)
	}
	// Never write a checkpoint the runtime cannot load: the config must
	// agree with the weights and the tokenizer must load.
	if err := model.Check(dir, desc, ck); err != nil {
		return nil, fmt.Errorf("prune: %w", err)
	}
	if _, err := tokenizer.Load(dir); err != nil {
		return nil, fmt.Errorf("prune: %s: %w (the pruned checkpoint would have no usable tokenizer)", dir, err)
	}
	if opt.wantsWidth() {
		return runWidth(ctx, opt, dir, desc, ck)
	}
	L := len(desc.Layers)
	var list []int
	isList := strings.HasPrefix(opt.Method, "list:")
	if isList {
		if list, err = ParseList(opt.Method); err != nil {
			return nil, err
		}
	}
	var S []float64
	if opt.Calib != "" {
		fp, err := model.Fingerprint(dir, ck)
		if err != nil {
			return nil, fmt.Errorf("prune: %w", err)
		}
		c, err := calibrate.Read(opt.Calib, model.Expect{ModelFingerprint: fp, Desc: desc})
		if err != nil {
			return nil, fmt.Errorf("prune: %w", err)
		}
		if !c.Has(calibrate.StatLoRP) {
			if !isList {
				return nil, fmt.Errorf("%w: calibration file %s lacks %s: re-run lmpack calibrate", ErrNoStatistic, opt.Calib, calibrate.SimilarityTensor)
			}
		} else {
			S = c.Similarity
		}
	}
	var plan *depth.Plan
	if isList {
		plan, err = depth.ListPlan(list, L)
	} else {
		n, berr := LayerBudget(opt.Layers, opt.LayerRatio, L)
		if berr != nil {
			return nil, berr
		}
		if opt.Method == depth.MethodLoRP {
			plan, err = depth.LoRP(leading(S, L+1, L), L, n)
		} else {
			plan, err = depth.ShortGPT(S, L, n)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("prune: %w", err)
	}
	var bi []float64
	if S != nil {
		if bi, err = depth.BlockInfluence(S, L+1); err != nil {
			return nil, fmt.Errorf("prune: %w", err)
		}
	}
	before, after, err := ApplyDepth(dir, ck, plan, opt.Out, tiedHead(desc))
	if err != nil {
		return nil, err
	}
	r := &Report{Model: dir, Out: opt.Out, Method: plan.Method, LayersBefore: L, LayersAfter: L - len(plan.Removed),
		RLS: plan.RLS, K: plan.K, Labels: plan.Labels, Fallback: plan.Fallback, FallbackReason: plan.FallbackReason,
		Kept: plan.Kept(), Before: before, After: after, Plan: plan}
	for _, l := range plan.Removed {
		rl := RemovedLayer{Layer: l}
		if plan.Redundancy != nil {
			rl.Redundancy = &plan.Redundancy[l]
		}
		if bi != nil {
			rl.BlockInfluence = &bi[l]
		}
		r.Removed = append(r.Removed, rl)
	}
	return r, nil
}

// leading returns the leading k×k block of the row-major m×m matrix S.
func leading(S []float64, m, k int) []float64 {
	out := make([]float64, 0, k*k)
	for i := 0; i < k; i++ {
		out = append(out, S[i*m:i*m+k]...)
	}
	return out
}

// tiedHead is d's lm_head tensor name when it is tied to the embedding
// (a stored copy is not a parameter), else "".
func tiedHead(d *arch.Description) string {
	if d.TieWordEmbeddings {
		return d.LMHead
	}
	return ""
}
