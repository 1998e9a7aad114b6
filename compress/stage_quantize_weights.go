package compress

import (
	"context"
	"encoding/json"
	"path/filepath"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/quantize/gemq"
	"github.com/lmpack/lmpack/quantize/wquant"
)

// weightsKeys names wquant.Options' fields as recipe keys (field.Rename
// of its Validate errors).
var weightsKeys = map[string]string{
	"Method": "quantize.weights.method", "Bits": "quantize.weights.bits", "GroupSize": "quantize.weights.group",
	"Symmetric": "quantize.weights.sym", "ActOrder": "quantize.weights.act_order", "TrueSequential": "quantize.weights.true_sequential",
	"TargetBPW": "quantize.weights.target_bpw", "MoEBudget": "quantize.weights.moe_budget", "MoEWeighting": "quantize.weights.moe_weighting",
	"MoERule": "quantize.weights.moe_rule", "MoESolver": "quantize.weights.moe_solver", "MoEGroup": "quantize.weights.moe_group",
	"MoEMinTokens": "quantize.weights.moe_min_tokens", "MSEClip": "quantize.weights.mse_clip",
}

// options is the wquant.Options of the section (Model, Calib, Out,
// Threads, Version and Progress are the pipeline's).
func (w *WeightsStage) options() wquant.Options {
	group := 0
	if w.Group != nil {
		group = *w.Group
	}
	return wquant.Options{Method: w.Method, Bits: w.Bits, GroupSize: group, Symmetric: w.Sym, ActOrder: w.ActOrder,
		TrueSequential: w.TrueSequential, TargetBPW: w.TargetBPW, MSEClip: w.MSEClip,
		MoEBudget: w.MoEBudget, MoEWeighting: gemq.Weighting(w.MoEWeighting), MoERule: w.MoERule,
		MoESolver: gemq.Solver(w.MoESolver), MoEGroup: w.MoEGroup, MoEMinTokens: w.MoEMinTokens}
}

// quantizeWeightsStage is the quantize-weights stage: its cache key is
// the quantize.weights section; its report hook copies the method and
// bits per weight into the Report.
func (p *pipeline) quantizeWeightsStage() stage {
	return stage{name: "quantize-weights", params: section(p.r.Quantize.Weights), run: p.quantizeWeights,
		report: func(rep *Report, res json.RawMessage) error {
			var ws weightsSummary
			if err := json.Unmarshal(res, &ws); err != nil {
				return err
			}
			rep.WeightsMethod, rep.WeightsBitsPerWeight = ws.Method, ws.BitsPerWeight
			rep.ExpertBitsPerWeight = ws.ExpertBitsPerWeight
			return nil
		}}
}

// weightsSummary is the quantize-weights stage's result: wquant's report
// without its per-tensor lists and paths.
type weightsSummary struct {
	Method    string  `json:"method"`
	Bits      int     `json:"bits,omitempty"`
	Group     int     `json:"group,omitempty"`
	Sym       bool    `json:"sym,omitempty"`
	ActOrder  bool    `json:"act_order,omitempty"`
	TargetBPW float64 `json:"target_bpw,omitempty"`
	// MoEBudget echoes the recipe; ExpertBitsPerWeight is the storage bits
	// per routed-expert weight GEMQ reached (≤ MoEBudget).
	MoEBudget           float64 `json:"moe_budget,omitempty"`
	ExpertBitsPerWeight float64 `json:"expert_bits_per_weight,omitempty"`
	// Warnings are wquant's (sparse or never-routed experts and their
	// fallbacks).
	Warnings []string `json:"warnings,omitempty"`
	// Params is the number of quantized weights; BitsPerWeight their
	// storage bits per weight (codes, scales, zero-points, permutations).
	Params        int64   `json:"params"`
	BitsPerWeight float64 `json:"bits_per_weight"`
	// QuantBytesBefore/After: the quantized tensors before and after;
	// BytesBefore/After: all tensor data of the checkpoint.
	QuantBytesBefore int64   `json:"quant_bytes_before"`
	QuantBytesAfter  int64   `json:"quant_bytes_after"`
	BytesBefore      int64   `json:"bytes_before"`
	BytesAfter       int64   `json:"bytes_after"`
	PredictedError   float64 `json:"predicted_error"`
	CalibTokens      int     `json:"calib_tokens"`
	// Recalibrated says the stage calibrated the (pruned) model itself.
	Recalibrated bool               `json:"recalibrated,omitempty"`
	Calibration  *calibrate.Summary `json:"calibration,omitempty"`
}

// quantizeWeights runs quantize/wquant on the current model (calibrating
// it first when an earlier stage changed it). The quantized checkpoint
// replaces the model, and the calibration no longer describes it, so the
// KV stage calibrates the quantized model: its rotations and clip ratios
// are fitted to the keys and values the quantized weights produce.
func (p *pipeline) quantizeWeights(ctx context.Context, dir string) (outputs, any, error) {
	w := p.r.Quantize.Weights
	s := &weightsSummary{Method: w.Method, Bits: w.Bits, Sym: w.Sym, ActOrder: w.ActOrder, TargetBPW: w.TargetBPW, MoEBudget: w.MoEBudget}
	group := 0
	if w.Group != nil {
		group = *w.Group
		s.Group = group
	}
	calib := p.st.calib
	if calib == "" {
		var err error
		if calib, s.Calibration, err = p.recalibrate(ctx, dir, "quantize-weights:calibrate"); err != nil {
			return outputs{}, nil, err
		}
		s.Recalibrated = true
	}
	o := w.options()
	o.Model, o.Calib, o.Out = p.st.model, calib, filepath.Join(dir, "model")
	o.Threads, o.Version, o.Progress = p.opt.Threads, p.opt.Version, p.progress("quantize-weights")
	rep, err := wquant.Run(ctx, o)
	if err != nil {
		return outputs{}, nil, err
	}
	s.Params, s.BitsPerWeight, s.PredictedError, s.CalibTokens = rep.Params, rep.BitsPerWeight, rep.PredictedError, rep.CalibTokens
	s.ExpertBitsPerWeight, s.Warnings = rep.ExpertBitsPerWeight, rep.Warnings
	s.QuantBytesBefore, s.QuantBytesAfter, s.BytesBefore, s.BytesAfter = rep.QuantBytesBefore, rep.QuantBytesAfter, rep.BytesBefore, rep.BytesAfter
	return outputs{Model: "model", ClearCalib: true}, s, nil
}
