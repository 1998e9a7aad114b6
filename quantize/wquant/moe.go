package wquant

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/quantize/gemq"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// MoEWidths are the expert widths the GEMQ allocation chooses from: 1, 2,
// 3 and 4 bits (gemq.DefaultBits; 1 bit is weights' two-level grid).
var MoEWidths = gemq.DefaultBits

// MinMoEBudget is the smallest Options.MoEBudget the MoE model d accepts,
// in stored bits per routed-expert weight, with expert group size group (0:
// per channel) and, with rule, Options.MoERule: what Run refuses a smaller
// budget for, computed without reading any weight. It is 0 for a model
// without routed experts. Errors: Targets'.
func MinMoEBudget(d *arch.Description, group int, rule bool) (float64, error) {
	ts, err := Targets(d)
	if err != nil {
		return 0, err
	}
	return minMoEBPW(ts, group, rule), nil
}

// minMoEBPW returns the smallest stored bits per expert weight an
// allocation over targets can reach with expert group size group: every
// expert at MoEWidths[0] bits with an fp16 scale and zero-point per group
// (the costs gemq.Allocate uses with Overhead) or, with rule, in each
// layer the cheapest pair of experts at the top and second widths and the
// others at the lowest.
func minMoEBPW(targets []Target, group int, rule bool) float64 {
	nw := len(MoEWidths)
	// cost[l][e][w]: expert e of layer l at width MoEWidths[w].
	cost := map[int]map[int][]int64{}
	var params int64
	for _, t := range targets {
		if !t.IsExpert() {
			continue
		}
		if cost[t.Layer] == nil {
			cost[t.Layer] = map[int][]int64{}
		}
		if cost[t.Layer][t.Expert] == nil {
			cost[t.Layer][t.Expert] = make([]int64, nw)
		}
		for w, b := range MoEWidths {
			cost[t.Layer][t.Expert][w] += StorageBits(t.Rows, t.Cols, b, group, false, false)
		}
		params += int64(t.Rows * t.Cols)
	}
	var bits int64
	for _, ex := range cost {
		var extra int64 = -1
		for i, ci := range ex {
			bits += ci[0]
			for j, cj := range ex {
				if i != j {
					if x := ci[nw-1] - ci[0] + cj[nw-2] - cj[0]; extra < 0 || x < extra {
						extra = x
					}
				}
			}
		}
		if rule && extra > 0 {
			bits += extra
		}
	}
	if params == 0 {
		return 0
	}
	return float64(bits) / float64(params)
}

// checkMoEGroup checks that opt.MoEGroup divides every expert weight's
// columns (the allocation's costs assume one group size for all experts).
func (p *pipeline) checkMoEGroup() error {
	if p.opt.MoEGroup == 0 {
		return nil
	}
	for _, t := range p.targets {
		if t.IsExpert() && t.Cols%p.opt.MoEGroup != 0 {
			return fmt.Errorf("%w: moe group %d does not divide the %d columns of %s; use a divisor or 0 (per output channel)", ErrOptions, p.opt.MoEGroup, t.Cols, t.Name)
		}
	}
	return nil
}

// allocateMoE computes GEMQ's coefficients c[l,e,b] (gemq.Compute with
// opt.MoEWeighting, experts quantized by RTN at opt.MoEGroup, with
// opt.MSEClip, on the
// full-precision model and the first MeasureTokens calibration tokens) and
// allocates a width in MoEWidths to every expert under opt.MoEBudget
// stored bits per expert weight (gemq.Allocate with Overhead: fp16 scale
// and zero-point per group and row padding counted, exactly as the
// checkpoint stores the experts; Run refused a budget below the cheapest
// allocation already, Options.ValidateModel). Errors: those of
// checkMoEGroup, model loading, gemq.Compute and gemq.Allocate.
func (p *pipeline) allocateMoE(ctx context.Context) (*gemq.Allocation, error) {
	if err := p.checkMoEGroup(); err != nil {
		return nil, err
	}
	m, err := runtime.NewCPU().Load(ctx, p.d, p.ck, runtime.LoadOptions{Threads: p.opt.Threads})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	limit := p.opt.MeasureTokens
	if limit <= 0 {
		limit = DefaultMeasureTokens
	}
	var wins [][]int
	tokens := 0
	for _, w := range p.wins {
		if tokens >= limit {
			break
		}
		wins = append(wins, w)
		tokens += len(w)
	}
	c, err := gemq.Compute(ctx, m, p.ck, wins, gemq.Options{Bits: MoEWidths, Weighting: p.opt.MoEWeighting, Threads: p.opt.Threads,
		Quantizer: gemq.RTNOptions(p.opt.MoEGroup, p.opt.MSEClip), MinTokens: p.opt.MoEMinTokens})
	if err != nil {
		return nil, err
	}
	a, err := gemq.Allocate(c, p.opt.MoEBudget, gemq.AllocOptions{Rule: p.opt.MoERule, Solver: p.opt.MoESolver, Overhead: true, Group: p.opt.MoEGroup})
	if err != nil {
		return nil, fmt.Errorf("wquant: %w", err)
	}
	p.log.Info("experts allocated", "budget", p.opt.MoEBudget, "bits_per_weight", a.BitsPerWeight, "predicted_error", a.PredictedError, "solver", a.Method, "tokens", tokens)
	p.progress()
	return a, nil
}

// moeSpecs sets the spec of every expert target from the allocation.
func (p *pipeline) moeSpecs(a *gemq.Allocation, specs []spec) error {
	for i, t := range p.targets {
		if !t.IsExpert() {
			continue
		}
		li := slices.Index(a.Layers, t.Layer)
		if li < 0 || t.Expert >= len(a.Bits[li]) {
			return fmt.Errorf("wquant: the allocation has no width for layer %d expert %d", t.Layer, t.Expert)
		}
		specs[i] = spec{o: weights.Options{Bits: a.Bits[li][t.Expert], GroupSize: p.opt.MoEGroup, MSEClip: p.opt.MSEClip}}
	}
	return nil
}

// hasExpertTargets reports whether layer l has routed-expert weights to
// quantize.
func (p *pipeline) hasExpertTargets(l int) bool {
	for _, t := range p.targets {
		if t.Layer == l && t.IsExpert() {
			return true
		}
	}
	return false
}

// allExpertSamples reports whether the calibration file's expert
// statistics were collected with every token in every expert
// (calibrate --calibrate-all-experts: some expert has more samples than
// routed tokens); the sequential collection then does the same.
func (p *pipeline) allExpertSamples() bool {
	for _, l := range p.experts {
		for _, e := range l.Experts {
			if e.Samples > e.Routed {
				return true
			}
		}
	}
	return false
}

// expertHessians returns the GPTQ Hessians of expert e of layer l from
// the statistics collected on the quantized prefix's hidden states in this
// layer's pass (p.seqExperts, GPTQ's sequential inputs), else from the
// calibration file's expert statistics of the float model
// (calibrate.ExpertLayer.Hessians
// with opt.MoEMinTokens: the layer's pooled input Hessian and the identity
// for an expert routed fewer tokens, with a warning), scaled by 2 to the
// (2/N)·Σxxᵀ convention of weights.Hessian, so that the reported error of
// an expert weight is the mean of ‖(W − Ŵ)x‖² over the tokens routed to it.
func (p *pipeline) expertHessians(l, e int) (hIn, hDown *weights.Hessian, warn string, err error) {
	var el *calibrate.ExpertLayer
	if p.seqExperts != nil && p.seqExperts.Layer == l {
		el = p.seqExperts
	}
	for i := range p.experts {
		if el == nil && p.experts[i].Layer == l {
			el = &p.experts[i]
		}
	}
	if el == nil || e >= len(el.Experts) {
		return nil, nil, "", fmt.Errorf("%w: %s has no expert statistics for layer %d expert %d (calibrate again with this lmpack)", ErrCalibration, p.opt.Calib, l, e)
	}
	in, down, fb := el.Hessians(e, p.opt.MoEMinTokens)
	if fb {
		min := p.opt.MoEMinTokens
		if min <= 0 {
			min = calibrate.DefaultMinExpertTokens
		}
		warn = fmt.Sprintf("layer %d expert %d: %d calibration samples (< %d): quantized with the layer's pooled input Hessian for gate/up_proj and the identity for down_proj (round-to-nearest)", l, e, el.Experts[e].Samples, min)
	}
	for i := range in {
		in[i] *= 2
	}
	for i := range down {
		down[i] *= 2
	}
	if hIn, err = weights.NewHessianFromMatrix(el.Hidden, in); err != nil {
		return nil, nil, "", fmt.Errorf("wquant: layer %d expert %d input Hessian: %w", l, e, err)
	}
	if hDown, err = weights.NewHessianFromMatrix(el.Experts[e].Inter, down); err != nil {
		return nil, nil, "", fmt.Errorf("wquant: layer %d expert %d down_proj Hessian: %w", l, e, err)
	}
	return hIn, hDown, warn, nil
}

// ceil4 rounds x up to 4 decimals, so that a minimum printed with %.4f is
// itself accepted.
func ceil4(x float64) float64 { return math.Ceil(x*1e4) / 1e4 }
