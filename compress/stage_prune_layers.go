package compress

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/prune"
)

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
	// prune.Run words its option errors for the CLI (--layers); check
	// the recipe's keys against the model first.
	if strings.HasPrefix(c.Method, "list:") && c.LayerRatio != 0 {
		d, err := arch.Load(p.st.model)
		if err != nil {
			return outputs{}, nil, err
		}
		list, _ := prune.ParseList(c.Method)
		if n, err := prune.LayerBudget(0, c.LayerRatio, len(d.Layers)); err != nil || n != len(list) {
			return outputs{}, nil, fmt.Errorf("%w: %s: prune.method %q removes %d layer(s), but prune.layer_ratio %v of %d layers is %d; drop prune.layer_ratio",
				ErrRecipe, p.opt.RecipePath, c.Method, len(list), c.LayerRatio, len(d.Layers), n)
		}
	}
	r, err := prune.Run(ctx, prune.Options{Model: p.st.model, Calib: p.st.calib, Out: filepath.Join(dir, "model"),
		Layers: c.Layers, LayerRatio: c.LayerRatio, Method: c.Method})
	if err != nil {
		return outputs{}, nil, err
	}
	r.Model, r.Out = "", "model"
	return outputs{Model: "model", ClearCalib: true}, r, nil
}
