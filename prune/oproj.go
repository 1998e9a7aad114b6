package prune

import (
	"context"
	"fmt"
	"slices"

	"github.com/lmpack/lmpack/prune/width"
)

// oprojCapture is the AttnOutputObserver collecting layer's o_proj input
// X [n, num_heads·head_dim] (every head, none masked) and output
// Y = X·Wᵀ (linearCapture).
type oprojCapture struct{ linearCapture }

// AttnOutput implements runtime.AttnOutputObserver.
func (c *oprojCapture) AttnOutput(layer, pos, n int, att []float32) {
	if layer != c.layer {
		return
	}
	defer c.cancel()
	c.add(n, att)
}

// headsRefit removes the head groups in removed from w layer by layer and,
// for each layer that loses groups, replaces o_proj by the least-squares
// refit on the kept channels (Putri's optional o_proj update, docs/METHODS.md
// §6; the same solve as the down_proj refit, width.RefitDown with damping
// RefitDamping):
//
//	W_o' = ((X_pᵀX_p + λI)⁻¹ X_pᵀ Y)ᵀ,  Y = X·W_oᵀ
//
// where X [tokens, num_heads·head_dim] is the layer's o_proj input with
// every head present, collected on the calibration windows with the earlier
// layers already pruned and refit (sequential, as the FFN stage), and X_p
// its kept heads' columns. The kept heads' outputs do not depend on the
// removed heads of the same layer, so the refit lets the kept channels
// absorb the part of the removed heads' contribution they correlate with.
// The o_proj bias, if any, is unchanged. It returns the number of layers
// refit. Errors: fewer calibration tokens than RefitTokensPerUnit per kept
// o_proj input channel (ErrOptions), model load and forward errors, and
// width.RefitDown's.
//
// prog, when not nil, counts each refit layer as a step of its refit phase.
func headsRefit(ctx context.Context, w *workState, windows [][]int, removed []RemovedGroup, threads int, prog *widthProgress) (int, error) {
	byLayer := map[int][]RemovedGroup{}
	for _, r := range removed {
		byLayer[r.Layer] = append(byLayer[r.Layer], r)
	}
	layers := make([]int, 0, len(byLayer))
	for l := range byLayer {
		layers = append(layers, l)
	}
	slices.Sort(layers)
	if prog != nil {
		prog.refit = len(layers)
		prog.report()
	}
	tokens := 0
	for _, win := range windows {
		tokens += len(win)
	}
	H := w.desc.HiddenSize
	for _, l := range layers {
		spec := w.desc.Layers[l]
		nh, nkv, hd := spec.NumHeads, spec.NumKVHeads, spec.HeadDim
		Q := nh * hd
		gone := map[int]bool{}
		for _, r := range byLayer[l] {
			gone[r.Group] = true
		}
		g := nh / max(nkv, 1)
		var kept []int
		for kv := 0; kv < nkv; kv++ {
			if !gone[kv] {
				for c := kv * g * hd; c < (kv+1)*g*hd; c++ {
					kept = append(kept, c)
				}
			}
		}
		if tokens < RefitTokensPerUnit*len(kept) {
			return 0, fmt.Errorf("%w: the calibration file holds %d tokens; the least-squares o_proj refit of layer %d's %d kept input channels needs at least %d (%d per channel): calibrate with more --tokens, or leave out --head-refit",
				ErrOptions, tokens, l, len(kept), RefitTokensPerUnit*len(kept), RefitTokensPerUnit)
		}
		o, shape, err := w.f32(spec.Attn.O)
		if err != nil {
			return 0, err
		}
		if len(shape) != 2 || shape[0] != H || shape[1] != Q {
			return 0, fmt.Errorf("%w: tensor %q: shape %v, want [%d %d]", ErrConfig, spec.Attn.O, shape, H, Q)
		}
		st, err := width.NewFFNStats(Q, H)
		if err != nil {
			return 0, err
		}
		capt := &oprojCapture{linearCapture{layer: l, what: "o_proj", w: o, d: H, f: Q, st: st}}
		if err := collectLayer(ctx, w, windows, threads, capt, &capt.linearCapture); err != nil {
			return 0, err
		}
		nw, err := width.RefitDown(st, kept, RefitDamping)
		if err != nil {
			return 0, fmt.Errorf("prune: layer %d o_proj refit: %w", l, err)
		}
		if err := applyHeads(w, byLayer[l]); err != nil {
			return 0, err
		}
		w.set(spec.Attn.O, []int{H, len(kept)}, nw)
		if prog != nil {
			prog.step(&prog.refit)
		}
	}
	return len(layers), nil
}
