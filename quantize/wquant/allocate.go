package wquant

import (
	"context"
	"errors"
	"fmt"

	"github.com/lmpack/lmpack/quantize/alloc"
	"github.com/lmpack/lmpack/quantize/weights"
)

// allocate is the measurement pass of TargetBPW: block by block on the
// full-precision model's hidden states, every target is quantized with
// every choice and its output error measured; then one option per tensor
// is chosen by exact DP (alloc.SolveDP; the Lagrangian solver if the DP
// table would be too large) under the budget ⌊TargetBPW·Σ params⌋ bits.
// Choices whose group does not divide a tensor's columns become
// per-channel; duplicates are dropped.
func (p *pipeline) allocate(ctx context.Context) (*alloc.Plan, []spec, error) {
	choices := p.opt.Choices
	if choices == nil {
		choices = DefaultChoices()
	}
	xs, err := p.hidden()
	if err != nil {
		return nil, nil, err
	}
	items := make([]alloc.Item, len(p.targets))
	opts := make([][]spec, len(p.targets))
	params := make([]int64, len(p.targets))
	ti := 0
	for l := range p.d.Layers {
		hs, err := p.layerHessians(ctx, l, xs, true)
		if err != nil {
			return nil, nil, err
		}
		for ; ti < len(p.targets) && p.targets[ti].Layer == l; ti++ {
			t := p.targets[ti]
			w, err := p.weight(t)
			if err != nil {
				return nil, nil, err
			}
			h := hs.h[t.input]
			H := h.Matrix()
			params[ti] = int64(t.Rows * t.Cols)
			items[ti].Name, items[ti].Group = t.Name, -1
			seen := map[weights.Options]bool{}
			for _, c := range choices {
				g := effectiveGroup(c.GroupSize, t.Cols)
				o := weights.Options{Bits: c.Bits, GroupSize: g, Symmetric: p.opt.Symmetric}
				if seen[o] {
					continue
				}
				seen[o] = true
				q, dq, err := quantizeOne(w, t, p.opt.Method, o, p.opt.ActOrder, p.opt.Damp, h)
				if err != nil {
					return nil, nil, err
				}
				e, _ := outputError(w, dq, t.Rows, t.Cols, H)
				items[ti].Options = append(items[ti].Options, alloc.Option{Bits: float64(c.Bits), Group: q.GroupSize,
					Cost: StorageBits(t.Rows, t.Cols, q.Bits, q.GroupSize, q.Symmetric, q.Perm != nil), Error: e})
				opts[ti] = append(opts[ti], spec{o: o, fallback: g != c.GroupSize})
			}
		}
		p.log.Info("layer measured", "layer", l, "options", len(choices))
		p.progress()
	}
	budget := alloc.BudgetForBPW(params, p.opt.TargetBPW)
	plan, err := alloc.SolveDP(items, budget, alloc.DPOptions{})
	if errors.Is(err, alloc.ErrTooLarge) {
		plan, err = alloc.SolveLagrangian(items, budget, alloc.LagrangianOptions{})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("wquant: target %g bits per weight: %w", p.opt.TargetBPW, err)
	}
	specs := make([]spec, len(p.targets))
	for i, c := range plan.Choice {
		specs[i] = opts[i][c]
	}
	return plan, specs, nil
}
