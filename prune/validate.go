package prune

import (
	"fmt"
	"math"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/prune/depth"
)

// widthField names the first width field opt sets (HeadGroups,
// HeadRatio, FFNRatio, Sparsity), or "".
func (opt *Options) widthField() string {
	switch {
	case opt.HeadGroups != 0:
		return "HeadGroups"
	case opt.HeadRatio != 0:
		return "HeadRatio"
	case opt.FFNRatio != 0:
		return "FFNRatio"
	case opt.Sparsity != 0:
		return "Sparsity"
	}
	return ""
}

// depthField names the first layer-removal field opt sets (Layers,
// LayerRatio, a list Method), or "".
func (opt *Options) depthField() string {
	switch {
	case opt.Layers != 0:
		return "Layers"
	case opt.LayerRatio != 0:
		return "LayerRatio"
	case strings.HasPrefix(opt.Method, "list:"):
		return "Method"
	}
	return ""
}

// Validate checks opt's values without opening anything. Model and Out
// given; either layer removal (Layers, LayerRatio or a list Method) or
// width pruning (HeadGroups, HeadRatio, FFNRatio, Sparsity), not both.
// Layer removal: Method lorp, shortgpt (both need Calib, and exactly one
// of Layers > 0 and LayerRatio in (0, 1)) or list:L1,L2,... (integer
// indices, none twice; Layers 0 or the list's length). Width pruning:
// Calib given; HeadGroups >= 0; at most one of HeadGroups and HeadRatio;
// HeadRatio, FFNRatio and Sparsity in (0, 1); Sparsity alone (it sets the
// heads and FFN units); HeadMethod empty, putri or proxy; HeadStep >= 0;
// HeadMethod, HeadStep and HeadRefit only with head pruning (HeadGroups,
// HeadRatio or Sparsity); NoRefit only with FFNRatio or Sparsity.
// Model-dependent limits are ValidateModel's.
//
// Errors: a *field.Error naming the Go field (Run wraps it in
// ErrOptions; cmd/lmpack and compress rename it to their flag or key).
func (opt *Options) Validate() error {
	w, dp := opt.widthField(), opt.depthField()
	ratio := func(v float64) bool { return v > 0 && v < 1 }
	switch {
	case opt.Model == "":
		return field.New("Model", nil, "a model directory or hub id")
	case opt.Out == "":
		return field.New("Out", nil, "the directory to create for the pruned checkpoint")
	case w != "" && dp != "":
		return field.New(w, nil, "no layer removal ({"+dp+"}) in the same run: remove layers first, calibrate the result, then prune heads or FFNs")
	case w != "" && opt.Method != "":
		return field.New("Method", opt.Method, "none with width pruning ({"+w+"}): it chooses the layers to remove")
	}
	wantsHeads := opt.HeadGroups != 0 || opt.HeadRatio != 0 || opt.Sparsity != 0
	switch {
	case opt.HeadMethod != "" && !wantsHeads:
		return field.New("HeadMethod", opt.HeadMethod, "{HeadGroups}, {HeadRatio} or {Sparsity} (it scores head groups)")
	case opt.HeadStep != 0 && !wantsHeads:
		return field.New("HeadStep", opt.HeadStep, "{HeadGroups}, {HeadRatio} or {Sparsity}")
	case opt.HeadRefit && !wantsHeads:
		return field.New("HeadRefit", nil, "{HeadGroups}, {HeadRatio} or {Sparsity} (it refits o_proj after head removal)")
	case opt.NoRefit && opt.FFNRatio == 0 && opt.Sparsity == 0:
		return field.New("NoRefit", nil, "{FFNRatio} or {Sparsity} (it concerns the pruned FFNs' down_proj)")
	case w == "" && dp == "" && opt.Method != depth.MethodLoRP && opt.Method != depth.MethodShortGPT && opt.Method != "":
		return field.New("Method", opt.Method, "lorp, shortgpt or list:L1,L2,... (layer indices)")
	case w == "" && dp == "" && opt.Method != "":
		return field.New("Method", opt.Method, "{Layers} or {LayerRatio} with it (it chooses the layers to remove), or {HeadGroups}, {HeadRatio}, {FFNRatio} or {Sparsity} without it (width pruning)")
	case w == "" && dp == "":
		return field.New("Layers", nil, "something to prune: a number of layers to remove, or {LayerRatio} (layer removal), or {HeadGroups}, {HeadRatio}, {FFNRatio} or {Sparsity} (width pruning)")
	}
	if dp != "" {
		return opt.validateDepth()
	}
	switch {
	case opt.Calib == "":
		return field.New("Calib", nil, "a calibration file (head and FFN pruning rerun the model on its token ids)")
	case opt.HeadGroups < 0:
		return field.New("HeadGroups", opt.HeadGroups, "> 0 (KV head groups to remove over all layers)")
	case opt.HeadGroups != 0 && opt.HeadRatio != 0:
		return field.New("HeadGroups", opt.HeadGroups, "at most one of {HeadGroups} and {HeadRatio}")
	case opt.HeadRatio != 0 && !ratio(opt.HeadRatio):
		return field.New("HeadRatio", opt.HeadRatio, "in (0, 1)")
	case opt.FFNRatio != 0 && !ratio(opt.FFNRatio):
		return field.New("FFNRatio", opt.FFNRatio, "in (0, 1) (the share of every FFN's intermediate units to remove)")
	case opt.Sparsity != 0 && !ratio(opt.Sparsity):
		return field.New("Sparsity", opt.Sparsity, "in (0, 1) (the share of the decoder's attention and FFN parameters to remove)")
	case opt.Sparsity != 0 && (opt.HeadGroups != 0 || opt.HeadRatio != 0 || opt.FFNRatio != 0):
		return field.New("Sparsity", opt.Sparsity, "no {HeadGroups}, {HeadRatio} or {FFNRatio} with it (it sets head groups and FFN units itself)")
	case opt.HeadMethod != "" && opt.HeadMethod != HeadPutri && opt.HeadMethod != HeadProxy:
		return field.New("HeadMethod", opt.HeadMethod, "putri or proxy")
	case opt.HeadStep < 0:
		return field.New("HeadStep", opt.HeadStep, ">= 1 (0: 1)")
	}
	return nil
}

// validateDepth is Validate for layer removal.
func (opt *Options) validateDepth() error {
	if list, err := ParseList(opt.Method); strings.HasPrefix(opt.Method, "list:") {
		if err != nil {
			return field.New("Method", opt.Method, "list:L1,L2,... (comma-separated layer indices)")
		}
		seen := map[int]bool{}
		for _, l := range list {
			if seen[l] {
				return field.New("Method", opt.Method, fmt.Sprintf("each layer once (layer %d is listed twice: a duplicate index)", l))
			}
			seen[l] = true
		}
		if opt.Layers != 0 && opt.Layers != len(list) {
			return field.New("Layers", opt.Layers, fmt.Sprintf("none, or the %d layer(s) {Method} %q removes", len(list), opt.Method))
		}
		return nil
	}
	switch {
	case opt.Method != depth.MethodLoRP && opt.Method != depth.MethodShortGPT:
		return field.New("Method", opt.Method, "lorp, shortgpt or list:L1,L2,... (layer indices)")
	case opt.Layers != 0 && opt.LayerRatio != 0:
		return field.New("Layers", opt.Layers, "exactly one of {Layers} and {LayerRatio}")
	case opt.Layers < 0:
		return field.New("Layers", opt.Layers, "> 0")
	case opt.LayerRatio != 0 && !(opt.LayerRatio > 0 && opt.LayerRatio < 1):
		return field.New("LayerRatio", opt.LayerRatio, "in (0, 1)")
	case opt.Calib == "":
		return field.New("Calib", nil, "a calibration file ({Method} "+opt.Method+" chooses layers from its block similarities)")
	}
	return nil
}

// ValidateModel checks opt against the model d: layer removal leaves the
// first and last layer (a list that ListPlan accepts, a LayerRatio that
// agrees with a list, a budget of at most L−2 layers); width pruning only
// on a dense model, a head budget that leaves every layer a KV head group
// (HeadBudget), an FFNRatio that removes some but not all units of every
// FFN (FFNKeepCount). A Sparsity's budget needs the checkpoint
// (PlanSparsity).
//
// Errors: a *field.Error naming the Go field.
func (opt *Options) ValidateModel(d *arch.Description) error {
	L := len(d.Layers)
	if dp := opt.depthField(); dp != "" {
		if list, err := ParseList(opt.Method); err == nil {
			if _, err := depth.ListPlan(list, L); err != nil {
				return &field.Error{Field: "Method", Value: opt.Method, Want: fmt.Sprintf("layers the %d-layer model can lose (%v)", L, err), Err: err}
			}
			if opt.LayerRatio != 0 {
				if n, err := LayerBudget(0, opt.LayerRatio, L); err != nil || n != len(list) {
					return field.New("LayerRatio", opt.LayerRatio, fmt.Sprintf("none: {Method} %q removes %d layer(s), the ratio of %d layers %d", opt.Method, len(list), L, n))
				}
			}
			return nil
		}
		n, err := LayerBudget(opt.Layers, opt.LayerRatio, L)
		if err != nil {
			return field.New(dp, nil, err.Error())
		}
		if n > L-2 {
			v := any(opt.Layers)
			if dp == "LayerRatio" {
				v = opt.LayerRatio
			}
			return field.New(dp, v, fmt.Sprintf("at most %d of the %d layers removed (the first and last are never removed; this removes %d)", max(L-2, 0), L, n))
		}
		return nil
	}
	w := opt.widthField()
	if w == "" {
		return nil
	}
	total := 0
	for l, ly := range d.Layers {
		if ly.MoE != nil {
			return field.New(w, nil, fmt.Sprintf("a dense model; layer %d is a mixture-of-experts layer (width pruning supports dense models only; {Layers} or {LayerRatio} work on MoE models)", l))
		}
		total += ly.NumKVHeads
	}
	if opt.HeadGroups != 0 || opt.HeadRatio != 0 {
		if _, err := HeadBudget(opt.HeadGroups, opt.HeadRatio, total, L); err != nil {
			f, v := "HeadGroups", any(opt.HeadGroups)
			if opt.HeadRatio != 0 {
				f, v = "HeadRatio", opt.HeadRatio
			}
			n := opt.HeadGroups
			if n == 0 {
				n = max(1, int(math.Round(opt.HeadRatio*float64(total))))
			}
			return &field.Error{Field: f, Value: v, Err: err,
				Want: fmt.Sprintf("at most %d of the %d KV head groups removed (removing %d of %d breaks GQA grouping: each of the %d layers keeps one)", max(total-L, 0), total, n, total, L)}
		}
	}
	if opt.FFNRatio != 0 {
		for l, ly := range d.Layers {
			if ly.MLP == nil {
				continue
			}
			if _, err := FFNKeepCount(ly.MLP.IntermediateSize, opt.FFNRatio); err != nil {
				return field.New("FFNRatio", opt.FFNRatio, fmt.Sprintf("a ratio that keeps some and removes some units of every FFN (layer %d: %s)", l, strings.TrimPrefix(err.Error(), ErrOptions.Error()+": ")))
			}
		}
	}
	return nil
}
