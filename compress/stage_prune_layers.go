package compress

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/prune"
)

// pruneKeys names prune.Options' fields as recipe keys (field.Rename of
// its Validate errors).
var pruneKeys = map[string]string{
	"Layers": "prune.layers", "LayerRatio": "prune.layer_ratio", "Method": "prune.method",
	"HeadGroups": "prune.head_groups", "HeadRatio": "prune.head_ratio", "HeadMethod": "prune.head_method", "HeadStep": "prune.head_step",
	"FFNRatio": "prune.ffn_ratio", "NoRefit": "prune.refit", "HeadRefit": "prune.head_refit", "Sparsity": "prune.sparsity",
}

// depthOptions is the prune-layers stage's prune.Options (Model, Calib and
// Out are the pipeline's).
func (c *PruneStage) depthOptions() prune.Options {
	return prune.Options{Layers: c.Layers, LayerRatio: c.LayerRatio, Method: c.Method}
}

// pruneLayersStage is the prune-layers stage: its cache key is the prune
// section's layer-removal keys (depthParams).
func (p *pipeline) pruneLayersStage() stage {
	return stage{name: "prune-layers", params: p.r.Prune.depthParams(), run: p.prune}
}

// depthParams is the prune-layers stage's part of its cache key.
func (p *PruneStage) depthParams() []byte {
	return section(struct {
		Layers     int     `json:"layers,omitempty"`
		LayerRatio float64 `json:"layer_ratio,omitempty"`
		Method     string  `json:"method"`
	}{p.Layers, p.LayerRatio, p.Method})
}

// prune (the prune-layers stage) runs prune.Run's layer removal on the
// current model; the calibration no longer describes the pruned model, so
// later stages calibrate again.
func (p *pipeline) prune(ctx context.Context, dir string) (outputs, any, error) {
	c := p.r.Prune
	// The recipe's keys checked against the current model, before prune.Run
	// words the same problem in its field names.
	d, err := arch.Load(p.st.model)
	if err != nil {
		return outputs{}, nil, err
	}
	o := c.depthOptions()
	if err := o.ValidateModel(d); err != nil {
		return outputs{}, nil, fmt.Errorf("%w: %s: %w", ErrRecipe, cmpOr(p.opt.RecipePath, "the recipe"), field.Rename(err, pruneKeys))
	}
	o.Model, o.Calib, o.Out = p.st.model, p.st.calib, filepath.Join(dir, "model")
	r, err := prune.Run(ctx, o)
	if err != nil {
		return outputs{}, nil, err
	}
	r.Model, r.Out = "", "model"
	return outputs{Model: "model", ClearCalib: true}, r, nil
}
