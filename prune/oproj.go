package prune

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/lmpack/lmpack/prune/width"
	"github.com/lmpack/lmpack/runtime"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// oprojCapture is the AttnOutputObserver collecting layer's o_proj input X
// [n, num_heads·head_dim] (every head, none masked) and output Y = X·Wᵀ
// into st; it cancels the forward pass after that layer.
type oprojCapture struct {
	layer  int
	w      []float32 // o_proj [D, Q]
	d, q   int
	st     *width.FFNStats
	y      []float32
	cancel context.CancelFunc
	err    error
}

// AttnOutput implements runtime.AttnOutputObserver.
func (c *oprojCapture) AttnOutput(layer, pos, n int, att []float32) {
	if layer != c.layer {
		return
	}
	defer c.cancel()
	if len(att) < n*c.q {
		c.err = fmt.Errorf("prune: layer %d: attention output of %d values for %d tokens, want %d per token", layer, len(att), n, c.q)
		return
	}
	if cap(c.y) < n*c.d {
		c.y = make([]float32, n*c.d)
	}
	y := c.y[:n*c.d]
	blas32.Gemm(blas.NoTrans, blas.Trans, 1,
		blas32.General{Rows: n, Cols: c.q, Stride: c.q, Data: att[:n*c.q]},
		blas32.General{Rows: c.d, Cols: c.q, Stride: c.q, Data: c.w},
		0, blas32.General{Rows: n, Cols: c.d, Stride: c.d, Data: y})
	if err := c.st.Add(att[:n*c.q], y, n); err != nil && c.err == nil {
		c.err = fmt.Errorf("prune: o_proj statistics of layer %d: %w", layer, err)
	}
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
func headsRefit(ctx context.Context, w *workState, windows [][]int, removed []RemovedGroup, threads int) (int, error) {
	byLayer := map[int][]RemovedGroup{}
	for _, r := range removed {
		byLayer[r.Layer] = append(byLayer[r.Layer], r)
	}
	layers := make([]int, 0, len(byLayer))
	for l := range byLayer {
		layers = append(layers, l)
	}
	slices.Sort(layers)
	longest, tokens := 0, 0
	for _, win := range windows {
		longest = max(longest, len(win))
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
		m, err := runtime.NewCPU().Load(ctx, w.desc, w, runtime.LoadOptions{Threads: threads})
		if err != nil {
			return 0, fmt.Errorf("prune: loading the partly pruned model: %w", err)
		}
		cache := m.NewCache(longest)
		logits := make([]float32, w.desc.VocabSize)
		for _, win := range windows {
			wctx, cancel := context.WithCancel(ctx)
			capt := &oprojCapture{layer: l, w: o, d: H, q: Q, st: st, cancel: cancel}
			m.SetObserver(capt)
			cache.Truncate(0)
			err := m.Forward(wctx, win, cache, logits, false)
			cancel()
			if err != nil && !(errors.Is(err, context.Canceled) && ctx.Err() == nil) {
				m.Close()
				return 0, fmt.Errorf("prune: o_proj statistics of layer %d: %w", l, err)
			}
			if capt.err != nil {
				m.Close()
				return 0, capt.err
			}
			if st.Tokens() == 0 {
				m.Close()
				return 0, fmt.Errorf("prune: o_proj statistics of layer %d: the runtime reported no attention output", l)
			}
		}
		m.Close()
		nw, err := width.RefitDown(st, kept, RefitDamping)
		if err != nil {
			return 0, fmt.Errorf("prune: layer %d o_proj refit: %w", l, err)
		}
		if err := applyHeads(w, byLayer[l]); err != nil {
			return 0, err
		}
		w.set(spec.Attn.O, []int{H, len(kept)}, nw)
	}
	return len(layers), nil
}
