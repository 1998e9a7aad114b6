package compress

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/quantize/wquant"
)

// checkModel refuses, before any stage runs, recipe values that the model
// d (the source checkpoint) cannot take and that a stage would otherwise
// refuse after the earlier stages' work: the stages' ValidateModel
// (calibrate.ctx and eval.ctx above max_position_embeddings, KV windows
// that do not fit it, a layer budget or list the model cannot meet) and a
// moe_budget below the smallest allocation. Width pruning is checked by
// inputs on the model as layer removal leaves it. recipe names the recipe
// in errors (ErrRecipe, naming the key).
func (r *Recipe) checkModel(recipe string, d *arch.Description) error {
	bad := func(key, format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s: %s", ErrRecipe, recipe, key, fmt.Sprintf(format, a...))
	}
	if c := r.Calibrate; c != nil {
		o := c.options("", "")
		if err := o.ValidateModel(d); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRecipe, recipe, field.Rename(err, calibrateKeys))
		}
	}
	if e := r.Eval; e != nil {
		o := e.options()
		if err := o.ValidateModel(d); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRecipe, recipe, field.Rename(err, evalKeys))
		}
	}
	if q := r.Quantize; q != nil && q.KV != nil {
		if err := q.KV.packOptions("").ValidateModel(d); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRecipe, recipe, field.Rename(err, packKeys))
		}
	}
	if p := r.Prune; p != nil && p.wantsDepth() {
		o := p.depthOptions()
		if err := o.ValidateModel(d); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRecipe, recipe, field.Rename(err, pruneKeys))
		}
	}
	if q := r.Quantize; q != nil && q.Weights != nil && q.Weights.MoEBudget > 0 {
		w := q.Weights
		lo, err := wquant.MinMoEBudget(d, w.MoEGroup, w.MoERule)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRecipe, recipe, err)
		}
		if lo > 0 && w.MoEBudget < lo {
			why := "every expert at 1 bit"
			if w.MoERule {
				why = "moe_rule's one expert at 4 bits and one at 3 in every layer, the rest at 1"
			}
			return bad("quantize.weights.moe_budget", "%g bits per expert weight is below the smallest allocation on this model (%s, fp16 scales and zero-points counted): %.4f", w.MoEBudget, why, math.Ceil(lo*1e4)/1e4)
		}
	}
	return nil
}
