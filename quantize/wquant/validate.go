package wquant

import (
	"fmt"
	"slices"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/quantize/gemq"
)

// MaxTargetBPW bounds Options.TargetBPW: more bits per weight than a
// float32 weight takes is no target.
const MaxTargetBPW = 32

// Validate checks opt's values without opening anything: Model, Calib
// and Out given; Method rtn or gptq (ActOrder and TrueSequential need
// gptq); exactly one of Bits (2, 3, 4, 8) and TargetBPW (in (0,
// MaxTargetBPW]), Bits with MoEBudget; GroupSize 32, 64, 128 or 0, and 0 with TargetBPW (the
// allocator chooses groups); MoEBudget >= 0 and finite, not with
// TargetBPW; MoEGroup, MoEWeighting, MoESolver, MoEMinTokens and MoERule
// only with MoEBudget, each valid; Damp >= 0 and finite; Choices valid;
// MeasureTokens >= 0. Model-dependent checks are ValidateModel's.
//
// Errors: a *field.Error naming the Go field (Run wraps it in
// ErrOptions; cmd/lmpack and compress rename it to their flag or key).
func (opt *Options) Validate() error {
	groups := []int{0, 32, 64, 128}
	switch {
	case opt.Model == "":
		return field.New("Model", nil, "a model directory or hub id")
	case opt.Calib == "":
		return field.New("Calib", nil, "a calibration file with token ids (lmpack calibrate)")
	case opt.Out == "":
		return field.New("Out", nil, "the directory to create")
	case opt.Method != MethodRTN && opt.Method != MethodGPTQ:
		return field.New("Method", opt.Method, "rtn or gptq")
	case opt.ActOrder && opt.Method != MethodGPTQ:
		return field.New("ActOrder", opt.ActOrder, "{Method} gptq")
	case opt.TrueSequential && opt.Method != MethodGPTQ:
		return field.New("TrueSequential", opt.TrueSequential, "{Method} gptq (it orders GPTQ's Hessian passes)")
	case opt.MoEBudget > 0 && opt.Bits == 0 && opt.TargetBPW == 0:
		return field.New("Bits", opt.Bits, "2, 3, 4 or 8 with {MoEBudget}: the width of the non-expert weights (attention, shared experts; the CLI's default is 4)")
	case (opt.Bits != 0) == (opt.TargetBPW != 0):
		return field.New("Bits", opt.Bits, "exactly one of {Bits} and {TargetBPW}")
	case opt.Bits != 0 && !slices.Contains([]int{2, 3, 4, 8}, opt.Bits):
		return field.New("Bits", opt.Bits, "2, 3, 4 or 8")
	case opt.TargetBPW != 0 && !(opt.TargetBPW > 0 && opt.TargetBPW <= MaxTargetBPW):
		return field.New("TargetBPW", opt.TargetBPW, "bits per weight in (0, 32]")
	case !slices.Contains(groups, opt.GroupSize):
		return field.New("GroupSize", opt.GroupSize, "32, 64, 128 or 0 (per-channel)")
	case opt.TargetBPW != 0 && opt.GroupSize != 0:
		return field.New("GroupSize", opt.GroupSize, "none with {TargetBPW} (the allocator chooses the group per tensor)")
	case opt.MoEBudget < 0 || !finite(opt.MoEBudget):
		return field.New("MoEBudget", opt.MoEBudget, "> 0 bits per expert weight")
	case opt.MoEBudget > 0 && opt.TargetBPW != 0:
		return field.New("MoEBudget", opt.MoEBudget, "{Bits} for the non-expert weights, not {TargetBPW}")
	}
	if opt.MoEBudget == 0 {
		for _, f := range []struct {
			name string
			set  bool
			v    any
		}{{"MoEWeighting", opt.MoEWeighting != "", string(opt.MoEWeighting)}, {"MoERule", opt.MoERule, opt.MoERule},
			{"MoESolver", opt.MoESolver != "", string(opt.MoESolver)}, {"MoEGroup", opt.MoEGroup != 0, opt.MoEGroup},
			{"MoEMinTokens", opt.MoEMinTokens != 0, opt.MoEMinTokens}} {
			if f.set {
				return field.New(f.name, f.v, "{MoEBudget} (it configures GEMQ's expert widths)")
			}
		}
	}
	switch {
	case !slices.Contains(groups, opt.MoEGroup):
		return field.New("MoEGroup", opt.MoEGroup, "32, 64, 128 or 0 (per-channel)")
	case !slices.Contains([]gemq.Weighting{"", gemq.WeightRouted, gemq.WeightSoft, gemq.WeightKL}, opt.MoEWeighting):
		return field.New("MoEWeighting", string(opt.MoEWeighting), "routed, soft or kl")
	case !slices.Contains([]gemq.Solver{"", gemq.SolverDP, gemq.SolverLagrangian}, opt.MoESolver):
		return field.New("MoESolver", string(opt.MoESolver), "dp or lagrangian")
	case opt.MoEMinTokens < 0:
		return field.New("MoEMinTokens", opt.MoEMinTokens, fmt.Sprintf(">= 0 tokens (0: the default, %d)", calibrate.DefaultMinExpertTokens))
	case opt.Damp < 0 || !finite(opt.Damp):
		return field.New("Damp", opt.Damp, ">= 0 (0: 0.01)")
	case opt.MeasureTokens < 0:
		return field.New("MeasureTokens", opt.MeasureTokens, fmt.Sprintf(">= 0 tokens (0: the default, %d)", DefaultMeasureTokens))
	}
	for _, c := range opt.Choices {
		if !slices.Contains([]int{2, 3, 4, 8}, c.Bits) || !slices.Contains(groups, c.GroupSize) {
			return field.New("Choices", fmt.Sprintf("%d bits group %d", c.Bits, c.GroupSize), "bits 2, 3, 4 or 8 with group 32, 64, 128 or 0")
		}
	}
	return nil
}

// ValidateModel checks opt against the model d: MoEBudget only on a model
// with routed experts and at least MinMoEBudget (every expert at 1 bit,
// or with MoERule the rule's cheapest allocation, at group MoEGroup);
// TargetBPW only on a dense model (an MoE model's experts take
// MoEBudget).
//
// Errors: a *field.Error naming the Go field; Targets' errors.
func (opt *Options) ValidateModel(d *arch.Description) error {
	moe := isMoE(d)
	switch {
	case opt.MoEBudget > 0 && !moe:
		return field.New("MoEBudget", opt.MoEBudget, "a mixture-of-experts model; this is a dense model (use {Bits} or {TargetBPW})")
	case opt.TargetBPW > 0 && moe:
		return field.New("TargetBPW", opt.TargetBPW, "a dense model; this is a mixture-of-experts model (use {Bits} with {MoEBudget} for the experts)")
	case opt.MoEBudget == 0:
		return nil
	}
	for _, rule := range []bool{false, true} {
		if rule && !opt.MoERule {
			break
		}
		lo, err := MinMoEBudget(d, opt.MoEGroup, rule)
		if err != nil {
			return err
		}
		if opt.MoEBudget < lo {
			why := fmt.Sprintf("every expert at %d bit", MoEWidths[0])
			if rule {
				why = fmt.Sprintf("under the per-layer rule ({MoERule}: one expert at %d bits and another at %d in every layer, the rest at %d)", MoEWidths[len(MoEWidths)-1], MoEWidths[len(MoEWidths)-2], MoEWidths[0])
			}
			return field.New("MoEBudget", opt.MoEBudget, fmt.Sprintf("at least the smallest allocation on this model, %s: %.4f (fp16 scales and zero-points counted)", why, ceil4(lo)))
		}
	}
	return nil
}
