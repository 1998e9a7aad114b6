package compress

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/prune"
)

// widthOptions is the prune-width stage's prune.Options (Model, Calib,
// Out and Threads are the pipeline's). Without layer removal the section's
// method is passed on, so that Validate refuses it.
func (c *PruneStage) widthOptions() prune.Options {
	o := prune.Options{HeadGroups: c.HeadGroups, HeadRatio: c.HeadRatio, HeadMethod: c.HeadMethod, FFNRatio: c.FFNRatio,
		NoRefit: c.Refit != nil && !*c.Refit, HeadStep: c.HeadStep, Sparsity: c.Sparsity, HeadRefit: c.HeadRefit}
	if !c.wantsDepth() {
		o.Method = c.Method
	}
	return o
}

// pruneWidthStage is the prune-width stage: its cache key is the prune
// section's width keys (widthParams).
func (p *pipeline) pruneWidthStage() stage {
	return stage{name: "prune-width", params: p.r.Prune.widthParams(), run: p.pruneWidth}
}

// widthParams is the prune-width stage's part of its cache key.
func (p *PruneStage) widthParams() []byte {
	return section(struct {
		HeadGroups int     `json:"head_groups,omitempty"`
		HeadRatio  float64 `json:"head_ratio,omitempty"`
		HeadMethod string  `json:"head_method,omitempty"`
		FFNRatio   float64 `json:"ffn_ratio,omitempty"`
		Refit      *bool   `json:"refit,omitempty"`
		HeadStep   int     `json:"head_step,omitempty"`
		Sparsity   float64 `json:"sparsity,omitempty"`
		HeadRefit  bool    `json:"head_refit,omitempty"`
	}{p.HeadGroups, p.HeadRatio, p.HeadMethod, p.FFNRatio, p.Refit, p.HeadStep, p.Sparsity, p.HeadRefit})
}

// widthSummary is the prune-width stage's result: prune's report and,
// when an earlier stage changed the model, the calibration the stage
// made of it.
type widthSummary struct {
	*prune.Report
	// Recalibrated says the stage calibrated the (layer-pruned) model
	// itself.
	Recalibrated bool               `json:"recalibrated,omitempty"`
	Calibration  *calibrate.Summary `json:"calibration,omitempty"`
}

// pruneWidth (the prune-width stage) runs prune.Run's head-group and FFN
// pruning (Putri) on the current model, calibrating it first when an
// earlier stage (prune-layers) changed it: Putri's masked perplexity and
// the FFN refit rerun the model on the calibration's token ids. Later
// stages calibrate the width-pruned model again.
func (p *pipeline) pruneWidth(ctx context.Context, dir string) (outputs, any, error) {
	c := p.r.Prune
	d, err := arch.Load(p.st.model)
	if err != nil {
		return outputs{}, nil, err
	}
	o := c.widthOptions()
	if err := o.ValidateModel(d); err != nil {
		return outputs{}, nil, fmt.Errorf("%w: %s: %w", ErrRecipe, cmpOr(p.opt.RecipePath, "the recipe"), field.Rename(err, pruneKeys))
	}
	s := &widthSummary{}
	calib := p.st.calib
	if calib == "" {
		if calib, s.Calibration, err = p.recalibrate(ctx, dir, "prune-width:calibrate"); err != nil {
			return outputs{}, nil, err
		}
		s.Recalibrated = true
	}
	o.Model, o.Calib, o.Out, o.Threads = p.st.model, calib, filepath.Join(dir, "model"), p.opt.Threads
	o.Progress = p.progress("prune-width")
	if s.Report, err = prune.Run(ctx, o); err != nil {
		return outputs{}, nil, err
	}
	s.Report.Model, s.Report.Out = "", "model"
	return outputs{Model: "model", ClearCalib: true}, s, nil
}

// afterDepth returns the model d as the prune section's layer removal
// leaves it, as far as the head budget cares (its layers' KV head
// counts): d itself without layer removal, or when the removed layers
// are not known before the prune-layers stage runs and the layers differ
// in KV heads (the stage then checks the budget on its result).
func afterDepth(c *PruneStage, d *arch.Description) *arch.Description {
	if !c.wantsDepth() {
		return d
	}
	L := len(d.Layers)
	n := 0
	if list, err := prune.ParseList(c.Method); err == nil {
		n = len(list)
	} else if n, err = prune.LayerBudget(c.Layers, c.LayerRatio, L); err != nil {
		return d
	}
	for _, l := range d.Layers {
		if l.NumKVHeads != d.Layers[0].NumKVHeads {
			return d
		}
	}
	if n <= 0 || n >= L {
		return d
	}
	return &arch.Description{Layers: d.Layers[:L-n]}
}
