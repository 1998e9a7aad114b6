package compress

import (
	"context"
	"fmt"
	"math"
	"path/filepath"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/prune"
)

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
	if err := c.checkHeadBudget(cmpOr(p.opt.RecipePath, "the recipe"), d); err != nil {
		return outputs{}, nil, err
	}
	s := &widthSummary{}
	calib := p.st.calib
	if calib == "" {
		if calib, s.Calibration, err = p.recalibrate(ctx, dir, "prune-width:calibrate"); err != nil {
			return outputs{}, nil, err
		}
		s.Recalibrated = true
	}
	noRefit := c.Refit != nil && !*c.Refit
	if s.Report, err = prune.Run(ctx, prune.Options{Model: p.st.model, Calib: calib, Out: filepath.Join(dir, "model"),
		HeadGroups: c.HeadGroups, HeadRatio: c.HeadRatio, HeadMethod: c.HeadMethod, FFNRatio: c.FFNRatio, NoRefit: noRefit,
		HeadStep: max(c.HeadStep, 1), Sparsity: c.Sparsity, HeadRefit: c.HeadRefit, Threads: p.opt.Threads}); err != nil {
		return outputs{}, nil, err
	}
	s.Report.Model, s.Report.Out = "", "model"
	return outputs{Model: "model", ClearCalib: true}, s, nil
}

// widthKey names the recipe key that asks for width pruning (the first
// of head_groups, head_ratio and ffn_ratio given).
func (c *PruneStage) widthKey() string {
	switch {
	case c.HeadGroups != 0:
		return "head_groups"
	case c.HeadRatio != 0:
		return "head_ratio"
	case c.Sparsity != 0:
		return "sparsity"
	}
	return "ffn_ratio"
}

// checkHeadBudget refuses, in the recipe's words, a head_groups or
// head_ratio that leaves some layer of the model d without a KV head
// group (prune.HeadBudget). recipe names the recipe file.
func (c *PruneStage) checkHeadBudget(recipe string, d *arch.Description) error {
	if c.HeadGroups == 0 && c.HeadRatio == 0 {
		return nil // sparsity: prune checks its budget against the model
	}
	total := 0
	for _, l := range d.Layers {
		total += l.NumKVHeads
	}
	n, err := prune.HeadBudget(c.HeadGroups, c.HeadRatio, total, len(d.Layers))
	if err != nil {
		n = c.HeadGroups
		if n == 0 {
			n = max(1, int(math.Round(c.HeadRatio*float64(total))))
		}
		return fmt.Errorf("%w: %s: prune.%s: removing %d of the %d KV head groups of the %d-layer model leaves a layer without one; at most %d can go",
			ErrRecipe, recipe, c.widthKey(), n, total, len(d.Layers), total-len(d.Layers))
	}
	return nil
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
