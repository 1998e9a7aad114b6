package prune

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/lmpack/lmpack/prune/width"
	"github.com/lmpack/lmpack/runtime"
	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas32"
)

// RefitDamping is the damping of the least-squares down_proj refit,
// relative to the mean diagonal of the kept nodes' H (width.RefitDown):
// small, so that a refit keeping every node reproduces down_proj (within
// 1e-6 on stories260K, see the tests), yet enough to keep the kept-node
// system positive definite. Node scores use width.DefaultDamping.
const RefitDamping = 1e-8

// FFNLayer is one layer's FFN size in a Report.
type FFNLayer struct {
	Layer  int `json:"layer"`
	Before int `json:"before"`
	After  int `json:"after"`
}

// FFNKeepCount is the number of FFN nodes kept of F at ratio r in (0, 1):
// F − round(r·F). Errors: ErrOptions for r outside (0, 1), for a ratio
// that removes no node of F (too small) or every node (too large; at
// least one must stay).
func FFNKeepCount(F int, r float64) (int, error) {
	if !(r > 0 && r < 1) {
		return 0, fmt.Errorf("%w: FFN ratio %v: want in (0, 1)", ErrOptions, r)
	}
	n := int(math.Round(r * float64(F)))
	switch {
	case n == 0:
		return 0, fmt.Errorf("%w: FFN ratio %v removes round(%v·%d) = 0 of the %d intermediate units; use a ratio of at least %.4g", ErrOptions, r, r, F, F, 0.5/float64(F))
	case n >= F:
		return 0, fmt.Errorf("%w: FFN ratio %v removes all %d intermediate units; at most %d can go (ratio below %.4g)", ErrOptions, r, F, F-1, (float64(F)-0.5)/float64(F))
	}
	return F - n, nil
}

// RefitTokensPerUnit is the least number of calibration tokens per FFN
// intermediate unit that the least-squares down_proj refit needs: the
// refit solves for F unknowns per output channel from the calibration
// tokens, and with fewer than about 3·F tokens it overfits them and can
// raise perplexity above plain slicing.
const RefitTokensPerUnit = 3

// linearCapture accumulates one Linear's input X [n, f] and output
// Y = X·Wᵀ (W [d, f], float32 GEMM as the runtime) of one layer into st,
// cancelling the forward pass after that layer (later layers do not matter
// for its statistics). what names the Linear in errors.
type linearCapture struct {
	layer  int
	what   string
	w      []float32
	d, f   int
	st     *width.FFNStats
	y      []float32
	cancel context.CancelFunc
	err    error
}

// add accumulates n rows of x; x holds at least n·f values.
func (c *linearCapture) add(n int, x []float32) {
	if len(x) < n*c.f {
		c.err = fmt.Errorf("prune: layer %d: %s input of %d values for %d tokens, want %d per token", c.layer, c.what, len(x), n, c.f)
		return
	}
	if cap(c.y) < n*c.d {
		c.y = make([]float32, n*c.d)
	}
	y := c.y[:n*c.d]
	blas32.Gemm(blas.NoTrans, blas.Trans, 1,
		blas32.General{Rows: n, Cols: c.f, Stride: c.f, Data: x[:n*c.f]},
		blas32.General{Rows: c.d, Cols: c.f, Stride: c.f, Data: c.w},
		0, blas32.General{Rows: n, Cols: c.d, Stride: c.d, Data: y})
	if err := c.st.Add(x[:n*c.f], y, n); err != nil && c.err == nil {
		c.err = fmt.Errorf("prune: %s statistics of layer %d: %w", c.what, c.layer, err)
	}
}

// ffnCapture is the FFNObserver collecting layer's down_proj input and
// output (linearCapture).
type ffnCapture struct{ linearCapture }

// FFNInput implements runtime.FFNObserver.
func (c *ffnCapture) FFNInput(layer, pos, n int, x, h []float32) {
	if layer != c.layer {
		return
	}
	defer c.cancel()
	if h == nil {
		c.err = fmt.Errorf("prune: layer %d has no dense FFN", layer)
		return
	}
	c.add(n, h)
}

// collectLayer loads w's current state on the CPU runtime and runs every
// calibration window from position 0 with the observer obs (a
// linearCapture wrapper for layer, whose cancel it sets per window), which
// stops each pass after that layer. Errors: model load and forward errors,
// the capture's error, and a layer the observer never saw.
func collectLayer(ctx context.Context, w *workState, windows [][]int, threads int, obs any, c *linearCapture) error {
	longest := 0
	for _, win := range windows {
		longest = max(longest, len(win))
	}
	m, err := runtime.NewCPU().Load(ctx, w.desc, w, runtime.LoadOptions{Threads: threads})
	if err != nil {
		return fmt.Errorf("prune: loading the partly pruned model: %w", err)
	}
	defer m.Close()
	cache := m.NewCache(longest)
	logits := make([]float32, w.desc.VocabSize)
	m.SetObserver(obs)
	for _, win := range windows {
		wctx, cancel := context.WithCancel(ctx)
		c.cancel = cancel
		cache.Truncate(0)
		err := m.Forward(wctx, win, cache, logits, false)
		cancel()
		if err != nil && !(errors.Is(err, context.Canceled) && ctx.Err() == nil) {
			return fmt.Errorf("prune: %s statistics of layer %d: %w", c.what, c.layer, err)
		}
		if c.err != nil {
			return c.err
		}
	}
	if c.st.Tokens() == 0 {
		return fmt.Errorf("prune: %s statistics of layer %d: the runtime reported no input", c.what, c.layer)
	}
	return nil
}

// pruneFFN is Putri's sequential FFN stage (docs/METHODS.md §6): for each
// layer l in order it loads the current state (heads and the FFNs of
// layers < l already pruned) on the CPU runtime, runs the calibration
// windows collecting H = XᵀX, XᵀY and the output energy at layer l's
// down_proj input (width.FFNStats; the pass stops after layer l), keeps the
// top-scoring nodes (width.SelectFFN), slices gate/up rows and replaces
// down_proj by the least-squares refit on the kept nodes
// (width.RefitDown, damping RefitDamping) or, with noRefit, by its kept
// columns. keepOf gives the nodes kept of an F-node FFN (FFNKeepCount for
// a ratio, F − removed for a sparsity, F to refit only in tests). It
// returns each layer's sizes.
//
// prog, when not nil, counts each layer as a step of its FFN phase.
func pruneFFN(ctx context.Context, w *workState, windows [][]int, keepOf func(F int) (int, error), noRefit bool, threads int, prog *widthProgress) ([]FFNLayer, error) {
	var out []FFNLayer
	H := w.desc.HiddenSize
	tokens := 0
	for _, win := range windows {
		tokens += len(win)
	}
	for l := range w.desc.Layers {
		spec := w.desc.Layers[l].MLP
		F := spec.IntermediateSize
		keep, err := keepOf(F)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		if !noRefit && tokens < RefitTokensPerUnit*F {
			return nil, fmt.Errorf("%w: the calibration file holds %d tokens; the least-squares down_proj refit of layer %d's %d intermediate units needs at least %d (%d per unit): calibrate with more --tokens, or pass --no-refit",
				ErrOptions, tokens, l, F, RefitTokensPerUnit*F, RefitTokensPerUnit)
		}
		down, shape, err := w.f32(spec.Down)
		if err != nil {
			return nil, err
		}
		if len(shape) != 2 || shape[0] != H || shape[1] != F {
			return nil, fmt.Errorf("%w: tensor %q: shape %v, want [%d %d]", ErrConfig, spec.Down, shape, H, F)
		}
		st, err := width.NewFFNStats(F, H)
		if err != nil {
			return nil, err
		}
		capt := &ffnCapture{linearCapture{layer: l, what: "FFN", w: down, d: H, f: F, st: st}}
		if err := collectLayer(ctx, w, windows, threads, capt, &capt.linearCapture); err != nil {
			return nil, err
		}
		kept, _, err := width.SelectFFN(st, down, keep)
		if err != nil {
			return nil, fmt.Errorf("prune: layer %d FFN: %w", l, err)
		}
		var nd []float32
		if noRefit {
			nd, err = width.SliceColumns(down, H, F, kept)
		} else {
			nd, err = width.RefitDown(st, kept, RefitDamping)
		}
		if err != nil {
			return nil, fmt.Errorf("prune: layer %d down_proj: %w", l, err)
		}
		w.set(spec.Down, []int{H, keep}, nd)
		for _, name := range []string{spec.Gate, spec.Up} {
			v, sh, err := w.f32(name)
			if err != nil {
				return nil, err
			}
			if len(sh) != 2 || sh[0] != F || sh[1] != H {
				return nil, fmt.Errorf("%w: tensor %q: shape %v, want [%d %d]", ErrConfig, name, sh, F, H)
			}
			s, err := width.SliceRows(v, F, H, kept)
			if err != nil {
				return nil, err
			}
			w.set(name, []int{keep, H}, s)
		}
		spec.IntermediateSize = keep
		out = append(out, FFNLayer{Layer: l, Before: F, After: keep})
		if prog != nil {
			prog.step(&prog.ffnLayers)
		}
	}
	return out, nil
}
