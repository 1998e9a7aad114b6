package wquant

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/lmpack/lmpack/quantize/alloc"
	"github.com/lmpack/lmpack/quantize/weights"
)

// allocate is the measurement pass of TargetBPW (the exllamav2 idea,
// with GEMQ's block-output error, docs/METHODS.md §4 step 2): block by block
// on the full-precision model's hidden states of the first MeasureTokens
// calibration tokens, every target is quantized alone with every choice
// (GPTQ with the block's Hessians when the method is gptq), the block is
// run with only that weight replaced, and the option's error is the
// relative block-output error Σ‖y − ŷ‖² / Σ‖y‖² over the tokens, y the
// full-precision block output (the residual stream). All errors are then
// in the same units, so q_proj and down_proj compete fairly, and relative
// to the stream's size, which grows with depth while every later block and
// the final norm read it RMS-normalized (an absolute error would starve
// the early blocks). Then one option per tensor is chosen by exact DP
// (alloc.SolveDP; the Lagrangian solver if the DP table would be too
// large) under the budget ⌊TargetBPW·Σ params⌋ bits. Choices whose group
// does not divide a tensor's columns become per-channel; duplicates are
// dropped. Cost: choices × 7 one-block runs per block.
func (p *pipeline) allocate(ctx context.Context) (*alloc.Plan, []spec, error) {
	choices := p.opt.Choices
	if choices == nil {
		choices = DefaultChoices()
	}
	// Infeasible targets fail before the measurement pass.
	var minBits, params0 int64
	for _, t := range p.targets {
		best := int64(-1)
		for _, c := range choices {
			g := effectiveGroup(c.GroupSize, t.Cols)
			perm := p.opt.ActOrder && g > 0 && g < t.Cols
			if b := StorageBits(t.Rows, t.Cols, c.Bits, g, p.opt.Symmetric, perm); best < 0 || b < best {
				best = b
			}
		}
		minBits += best
		params0 += int64(t.Rows * t.Cols)
	}
	if lo := float64(minBits) / float64(params0); p.opt.TargetBPW < lo {
		return nil, nil, fmt.Errorf("%w: target %g bits per weight is below the smallest the choices allow, %.4f (scales and zero-points counted)", ErrOptions, p.opt.TargetBPW, lo)
	}
	all, err := p.hidden()
	if err != nil {
		return nil, nil, err
	}
	limit := p.opt.MeasureTokens
	if limit <= 0 {
		limit = DefaultMeasureTokens
	}
	var xs [][]float32
	tokens := 0
	for _, x := range all {
		if tokens >= limit {
			break
		}
		xs = append(xs, x)
		tokens += len(x) / p.d.HiddenSize
	}
	all = nil
	items := make([]alloc.Item, len(p.targets))
	opts := make([][]spec, len(p.targets))
	params := make([]int64, len(p.targets))
	ti := 0
	for l := range p.d.Layers {
		in := make([][]float32, len(xs))
		for i, x := range xs {
			in[i] = slices.Clone(x)
		}
		hs, err := p.layerHessians(ctx, l, xs, true) // xs: the fp block output
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
			params[ti] = int64(t.Rows * t.Cols)
			items[ti].Name, items[ti].Group = t.Name, -1
			seen := map[weights.Options]bool{}
			for _, c := range choices {
				g := effectiveGroup(c.GroupSize, t.Cols)
				o := weights.Options{Bits: c.Bits, GroupSize: g, Symmetric: p.opt.Symmetric, MSEClip: p.opt.MSEClip}
				if seen[o] {
					continue
				}
				seen[o] = true
				q, dq, err := quantizeOne(w, t, p.opt.Method, o, p.opt.ActOrder, p.opt.Damp, h, p.opt.Threads)
				if err != nil {
					return nil, nil, err
				}
				e, err := p.blockError(ctx, l, t, dq, in, xs)
				if err != nil {
					return nil, nil, err
				}
				items[ti].Options = append(items[ti].Options, alloc.Option{Bits: float64(c.Bits), Group: q.GroupSize,
					Cost: StorageBits(t.Rows, t.Cols, q.Bits, q.GroupSize, q.Symmetric, q.Perm != nil), Error: e})
				opts[ti] = append(opts[ti], spec{o: o, fallback: g != c.GroupSize})
			}
		}
		p.log.Info("layer measured", "layer", l, "options", len(choices), "tokens", tokens)
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

// blockError runs block l with only target t replaced by dq on the
// inputs in and returns Σ‖ŷ − y‖² / Σ‖y‖² over the tokens (y = want).
func (p *pipeline) blockError(ctx context.Context, l int, t Target, dq []float32, in, want [][]float32) (float64, error) {
	m, err := loadLayer(ctx, p.d, l, p.ck, map[string][]float32{t.Name: dq}, map[string][]int{t.Name: {t.Rows, t.Cols}}, p.opt.Threads)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	H := p.d.HiddenSize
	var s, energy float64
	for i, x := range in {
		y := slices.Clone(x)
		if err := pushHidden(ctx, m, [][]float32{y}, H); err != nil {
			return 0, err
		}
		for j, v := range y {
			w := float64(want[i][j])
			d := float64(v) - w
			s += d * d
			energy += w * w
		}
	}
	if energy == 0 {
		return s, nil
	}
	return s / energy, nil
}
