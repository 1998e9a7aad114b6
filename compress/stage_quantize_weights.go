package compress

import (
	"context"
	"encoding/json"
	"path/filepath"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/quantize/gemq"
	"github.com/lmpack/lmpack/quantize/wquant"
)

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
	rep, err := wquant.Run(ctx, wquant.Options{Model: p.st.model, Calib: calib, Out: filepath.Join(dir, "model"),
		Method: w.Method, Bits: w.Bits, GroupSize: group, Symmetric: w.Sym, ActOrder: w.ActOrder, TargetBPW: w.TargetBPW,
		MoEBudget: w.MoEBudget, MoEWeighting: gemq.Weighting(w.MoEWeighting), MoERule: w.MoERule, MSEClip: w.MSEClip,
		Threads: p.opt.Threads, Version: p.opt.Version, Progress: p.progress("quantize-weights")})
	if err != nil {
		return outputs{}, nil, err
	}
	s.Params, s.BitsPerWeight, s.PredictedError, s.CalibTokens = rep.Params, rep.BitsPerWeight, rep.PredictedError, rep.CalibTokens
	s.ExpertBitsPerWeight, s.Warnings = rep.ExpertBitsPerWeight, rep.Warnings
	s.QuantBytesBefore, s.QuantBytesAfter, s.BytesBefore, s.BytesAfter = rep.QuantBytesBefore, rep.QuantBytesAfter, rep.BytesBefore, rep.BytesAfter
	return outputs{Model: "model", ClearCalib: true}, s, nil
}
