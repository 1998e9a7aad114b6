package prune

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/runtime"
)

// LayerSize is one layer's shape after width pruning in a Report (and in
// the output's config.json layer_configs).
type LayerSize struct {
	Layer             int `json:"layer"`
	NumAttentionHeads int `json:"num_attention_heads"`
	NumKeyValueHeads  int `json:"num_key_value_heads"`
	IntermediateSize  int `json:"intermediate_size"`
}

// wantsWidth reports whether opt asks for head or FFN pruning.
func (opt *Options) wantsWidth() bool {
	return opt.HeadGroups != 0 || opt.HeadRatio != 0 || opt.FFNRatio != 0 || opt.Sparsity != 0
}

// wantsDepth reports whether opt asks for layer removal.
func (opt *Options) wantsDepth() bool {
	return opt.Layers != 0 || opt.LayerRatio != 0 || strings.HasPrefix(opt.Method, "list:")
}

// MinPutriTokens is the least number of calibration tokens that Putri's
// head scoring accepts: its masked perplexity is measured over every
// calibration window, and a few tokens rank the groups by noise.
const MinPutriTokens = 32

// widthJob is what runWidth resolved from the options before any model
// run: the sparsity plan (nil without Options.Sparsity), the head method,
// the number of GQA groups to remove and the phases to run.
type widthJob struct {
	plan      *SparsityPlan
	method    string
	nGroups   int
	wantHeads bool
	wantFFN   bool
}

// runWidth is Run for head-group and FFN pruning (Putri): heads first
// (scored on the unpruned model), then the FFNs layer by layer on the
// head-pruned model; the result is written with layer_configs.
func runWidth(ctx context.Context, opt Options, dir string, desc *arch.Description, ck *safetensors.Checkpoint) (*Report, error) {
	job, err := planWidth(opt, desc, ck)
	if err != nil {
		return nil, err
	}
	if err := checkOut(dir, opt.Out); err != nil {
		return nil, err
	}
	c, windows, err := readWidthCalibration(opt, job, dir, desc, ck)
	if err != nil {
		return nil, err
	}
	L := len(desc.Layers)
	r := &Report{Model: dir, Out: opt.Out, Method: "none", LayersBefore: L, LayersAfter: L, Removed: []RemovedLayer{}}
	w := newWorkState(desc, ck)
	prog := &widthProgress{fn: opt.Progress}
	if job.wantFFN {
		prog.ffnLayers = L
	}
	if job.wantHeads && opt.HeadRefit {
		prog.refit = min(job.nGroups, L) // bound until the groups are chosen
	}
	prog.report()
	if job.wantHeads {
		if err := pruneHeads(ctx, opt, job, c, windows, desc, ck, w, prog, r); err != nil {
			return nil, err
		}
	}
	if job.wantFFN {
		keepOf := func(F int) (int, error) { return FFNKeepCount(F, opt.FFNRatio) }
		switch {
		case opt.keepAllFFN:
			keepOf = func(F int) (int, error) { return F, nil }
		case job.plan != nil:
			keepOf = func(F int) (int, error) { return F - job.plan.FFNRemoved, nil }
		}
		if r.FFN, err = pruneFFN(ctx, w, windows, keepOf, opt.NoRefit, opt.Threads, prog); err != nil {
			return nil, err
		}
		r.Refit = !opt.NoRefit
	}
	for l, ly := range w.desc.Layers {
		r.LayerSizes = append(r.LayerSizes, LayerSize{Layer: l, NumAttentionHeads: ly.NumHeads, NumKeyValueHeads: ly.NumKVHeads, IntermediateSize: ly.MLP.IntermediateSize})
	}
	if err := writeWidth(dir, opt.Out, desc, ck, w, job.plan, r); err != nil {
		return nil, err
	}
	return r, nil
}

// planWidth checks what width pruning needs of the model and options
// (dense layers, a calibration file, ratios, a head method) and resolves
// the sparsity plan and the head-group budget. Errors: ErrOptions;
// sparsityPlan's and HeadBudget's.
func planWidth(opt Options, desc *arch.Description, ck *safetensors.Checkpoint) (*widthJob, error) {
	for l, ly := range desc.Layers {
		if ly.MoE != nil {
			return nil, fmt.Errorf("%w: layer %d is a mixture-of-experts layer: width pruning (heads, FFN units) supports dense models only; layer pruning (--layers) works on MoE models", ErrOptions, l)
		}
	}
	if opt.Calib == "" {
		return nil, fmt.Errorf("%w: head and FFN pruning need a calibration file (--calib)", ErrOptions)
	}
	if opt.FFNRatio != 0 && !(opt.FFNRatio > 0 && opt.FFNRatio < 1) {
		return nil, fmt.Errorf("%w: FFN ratio %v: want in (0, 1)", ErrOptions, opt.FFNRatio)
	}
	job := &widthJob{}
	if opt.Sparsity != 0 {
		if opt.HeadGroups != 0 || opt.HeadRatio != 0 || opt.FFNRatio != 0 {
			return nil, fmt.Errorf("%w: a sparsity sets the head groups and FFN sizes itself: give it without head groups, head ratio or FFN ratio", ErrOptions)
		}
		var err error
		if job.plan, err = sparsityPlan(desc, ck, opt.Sparsity); err != nil {
			return nil, err
		}
	}
	plan := job.plan
	job.wantHeads = opt.HeadGroups != 0 || opt.HeadRatio != 0 || (plan != nil && plan.HeadGroups > 0)
	job.wantFFN = opt.FFNRatio != 0 || (plan != nil && plan.FFNRemoved > 0)
	job.method = opt.HeadMethod
	if job.method == "" {
		job.method = HeadPutri
	}
	if (job.wantHeads || plan != nil) && job.method != HeadPutri && job.method != HeadProxy {
		return nil, fmt.Errorf("%w: head method %q: want putri or proxy", ErrOptions, opt.HeadMethod)
	}
	total := 0
	for _, ly := range desc.Layers {
		total += ly.NumKVHeads
	}
	if plan != nil {
		job.nGroups = plan.HeadGroups
	} else if job.wantHeads {
		var err error
		if job.nGroups, err = HeadBudget(opt.HeadGroups, opt.HeadRatio, total, len(desc.Layers)); err != nil {
			return nil, err
		}
	}
	return job, nil
}

// readWidthCalibration reads the calibration file for the model (same
// fingerprint) and returns it with its token windows (nil when it holds no
// token ids). Errors: calibrate.Read's; ErrOptions for an o_proj refit
// without head pruning; ErrNoStatistic when the phases that rerun the
// model (FFN pruning, Putri, the o_proj refit) find no token ids.
func readWidthCalibration(opt Options, job *widthJob, dir string, desc *arch.Description, ck *safetensors.Checkpoint) (*calibrate.Calibration, [][]int, error) {
	fp, err := model.Fingerprint(dir, ck)
	if err != nil {
		return nil, nil, fmt.Errorf("prune: %w", err)
	}
	c, err := calibrate.Read(opt.Calib, model.Expect{ModelFingerprint: fp, Desc: desc})
	if err != nil {
		return nil, nil, fmt.Errorf("prune: %w", err)
	}
	windows := c.CalibrationWindows()
	if opt.HeadRefit && !job.wantHeads {
		if job.plan != nil {
			return nil, nil, fmt.Errorf("%w: sparsity %v removes no KV head group of this model (%d attention units, only FFN nodes), so the o_proj refit (--head-refit, recipe prune.head_refit) has nothing to refit: drop it or raise the sparsity", ErrOptions, opt.Sparsity, job.plan.AttentionUnits)
		}
		return nil, nil, fmt.Errorf("%w: the o_proj refit (--head-refit, recipe prune.head_refit) applies to head pruning: give head groups, a head ratio or a sparsity that removes heads", ErrOptions)
	}
	needTokens := job.wantFFN || (job.wantHeads && (job.method == HeadPutri || opt.HeadRefit))
	if needTokens && windows == nil {
		return nil, nil, fmt.Errorf("%w: calibration file %s lacks %s (needed to rerun the model): re-run lmpack calibrate", ErrNoStatistic, opt.Calib, calibrate.TokensTensor)
	}
	return c, windows, nil
}

// pruneHeads selects job.nGroups GQA groups (by the calibration head proxy
// or by Putri on the unpruned model) and removes them from w (slicing, or
// the o_proj refit with Options.HeadRefit), filling r's head fields.
// Errors: ErrNoStatistic (no head proxy for proxy), ErrOptions (too few
// calibration tokens for Putri), model load, selectPutri, headsRefit and
// applyHeads errors.
func pruneHeads(ctx context.Context, opt Options, job *widthJob, c *calibrate.Calibration, windows [][]int, desc *arch.Description, ck *safetensors.Checkpoint, w *workState, prog *widthProgress, r *Report) error {
	r.HeadMethod = job.method
	var removed []RemovedGroup
	var err error
	if job.method == HeadProxy {
		if !c.Has(calibrate.StatHeads) {
			return fmt.Errorf("%w: calibration file %s lacks %s: re-run lmpack calibrate", ErrNoStatistic, opt.Calib, calibrate.HeadProxyTensorName(0))
		}
		if removed, err = selectProxy(c.HeadProxy, job.nGroups); err != nil {
			return err
		}
	} else {
		if len(c.TokenIDs) < MinPutriTokens {
			return fmt.Errorf("%w: the calibration file has %d tokens; Putri's masked perplexity needs at least %d to rank head groups (calibrate with more --tokens, or use --head-method proxy)", ErrOptions, len(c.TokenIDs), MinPutriTokens)
		}
		m, err := runtime.NewCPU().Load(ctx, desc, ck, runtime.LoadOptions{Threads: opt.Threads})
		if err != nil {
			return fmt.Errorf("prune: %w", err)
		}
		removed, r.HeadBasePPL, err = selectPutri(ctx, m, windows, job.nGroups, opt.HeadStep, prog)
		m.Close()
		if err != nil {
			return err
		}
	}
	if opt.HeadRefit {
		if _, err := headsRefit(ctx, w, windows, removed, opt.Threads, prog); err != nil {
			return err
		}
		r.HeadRefit = true
	} else if err := applyHeads(w, removed); err != nil {
		return err
	}
	slices.SortFunc(removed, func(a, b RemovedGroup) int {
		if a.Layer != b.Layer {
			return a.Layer - b.Layer
		}
		return a.Group - b.Group
	})
	r.HeadsRemoved = removed
	return nil
}

// writeWidth writes the width-pruned checkpoint to out: every tensor of ck,
// those w changed in their stored float dtype (F16, BF16, else F32), with
// config.json's layer_configs from r.LayerSizes. It counts r.Before and
// r.After (a tied lm_head copy is not a parameter) and completes plan's
// achieved sparsity (plan may be nil). Errors: widthConfig's, safetensors
// and writeDir errors.
func writeWidth(dir, out string, desc *arch.Description, ck *safetensors.Checkpoint, w *workState, plan *SparsityPlan, r *Report) error {
	cfg, err := widthConfig(filepath.Join(dir, "config.json"), r.LayerSizes)
	if err != nil {
		return err
	}
	var ts []safetensors.WriteTensor
	for _, name := range ck.Names() {
		t, err := ck.Tensor(name)
		if err != nil {
			return fmt.Errorf("prune: %w", err)
		}
		if name != tiedHead(desc) {
			r.Before.Params += int64(t.NumElements())
		}
		r.Before.Bytes += int64(len(t.Data))
		wt := safetensors.WriteTensor{Name: name, DType: t.DType, Shape: t.Shape, Data: t.Data}
		if nt, ok := w.changed[name]; ok {
			v, _ := nt.Float32()
			dt := t.DType
			if dt != safetensors.F16 && dt != safetensors.BF16 {
				dt = safetensors.F32
			}
			if wt, err = safetensors.FromFloat32As(name, dt, nt.Shape, v); err != nil {
				return fmt.Errorf("prune: %w", err)
			}
		}
		if name != tiedHead(desc) {
			r.After.Params += int64(numElements(wt.Shape))
		}
		r.After.Bytes += int64(len(wt.Data))
		ts = append(ts, wt)
	}
	if plan != nil {
		// Only attention and FFN tensors change, so the parameter
		// difference is the decoder parameters removed.
		plan.RemovedParams = r.Before.Params - r.After.Params
		plan.Achieved = float64(plan.RemovedParams) / float64(plan.DecoderParams)
		r.Sparsity = plan
	}
	slices.SortFunc(ts, func(a, b safetensors.WriteTensor) int { return strings.Compare(a.Name, b.Name) })
	return writeDir(dir, out, ts, cfg)
}

func numElements(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// widthConfig returns config.json (at path) with a "layer_configs" list
// (one object per layer: num_attention_heads, num_key_value_heads,
// intermediate_size; arch.RewriteConfig); the stock fields are left as
// they were. Stock loaders ignore layer_configs and so cannot load the
// checkpoint. Errors: ErrConfig naming path.
func widthConfig(path string, sizes []LayerSize) ([]byte, error) {
	lcs := make([]arch.LayerConfig, len(sizes))
	for i, s := range sizes {
		lcs[i] = arch.LayerConfig{NumAttentionHeads: s.NumAttentionHeads, NumKeyValueHeads: s.NumKeyValueHeads, IntermediateSize: s.IntermediateSize}
	}
	return rewriteConfig(path, arch.ConfigEdit{Layers: len(sizes), LayerConfigs: lcs})
}
