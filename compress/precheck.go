package compress

import (
	"fmt"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
)

// checkModel refuses, before any stage runs, recipe values that the model
// d (the source checkpoint) cannot take and that a stage would otherwise
// refuse after the earlier stages' work: the stages' ValidateModel
// (calibrate.ctx and eval.ctx above max_position_embeddings, KV windows
// that do not fit it, a layer budget or list the model cannot meet). Width
// pruning and the weights (moe_budget, target_bpw) are checked by inputs,
// width pruning on the model as layer removal leaves it. recipe names the recipe
// in errors (ErrRecipe, naming the key).
func (r *Recipe) checkModel(recipe string, d *arch.Description) error {
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
	return nil
}
