package eval

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/lmpack/lmpack/runtime"
)

// PerplexityOptions configures Perplexity.
type PerplexityOptions struct {
	// Ctx is the window length in tokens (>= 2).
	Ctx int
	// MaxWindows stops after this many windows; 0 means all.
	MaxWindows int
	// Progress, when set, is called after each window with the number of
	// windows done and the total.
	Progress func(done, total int)
}

// PerplexityResult is the outcome of Perplexity. NLL is the mean natural-log
// negative log-likelihood per scored token (nats); Perplexity = exp(NLL).
type PerplexityResult struct {
	Perplexity      float64 `json:"perplexity"`
	NLL             float64 `json:"nll"`
	TokensScored    int     `json:"tokens_scored"`
	Windows         int     `json:"windows"`
	Ctx             int     `json:"ctx"`
	Seconds         float64 `json:"seconds"`
	TokensPerSecond float64 `json:"tokens_per_second"` // tokens run through the model per second
	// WindowNLL is the mean NLL of each window (nats), in order.
	WindowNLL []float64 `json:"window_nll"`
}

// ErrNonFinite is returned when the model's logits hold NaN or Inf: the
// forward pass overflowed although the weights loaded as finite.
var ErrNonFinite = errors.New("non-finite logits (NaN/Inf) from the forward pass, detected at first use")

// ErrTooShort is returned when the text has fewer tokens than one window.
var ErrTooShort = errors.New("text shorter than one window")

// Perplexity splits ids into non-overlapping windows of opt.Ctx tokens
// (dropping the tail), runs each window from position 0 with a fresh KV
// cache, and scores positions 1..Ctx-1 of each window: the NLL of token
// t+1 under the logits at t, from a float64 log-softmax. Statistics
// accumulate in float64. This is the protocol of llama.cpp's perplexity
// tool without its second-half-only scoring.
//
// Errors: Ctx < 2, ErrTooShort, a forward error, ctx cancelled.
func Perplexity(ctx context.Context, m runtime.Model, ids []int, opt PerplexityOptions) (*PerplexityResult, error) {
	n, err := windowCount(len(ids), opt.Ctx, opt.MaxWindows)
	if err != nil {
		return nil, err
	}
	V := m.Description().VocabSize
	logits := make([]float32, opt.Ctx*V)
	cache := m.NewCache(opt.Ctx)
	res := &PerplexityResult{Ctx: opt.Ctx, Windows: n}
	var total float64
	start := time.Now()
	for w := 0; w < n; w++ {
		win := ids[w*opt.Ctx : (w+1)*opt.Ctx]
		cache.Truncate(0)
		if err := m.Forward(ctx, win, cache, logits, true); err != nil {
			return nil, fmt.Errorf("eval: window %d: %w", w, err)
		}
		var wsum float64
		for t := 0; t+1 < opt.Ctx; t++ {
			nll := NLL(logits[t*V:(t+1)*V], win[t+1])
			if math.IsNaN(nll) || math.IsInf(nll, 0) {
				return nil, fmt.Errorf("eval: window %d position %d: %w (NLL %v)", w, t, ErrNonFinite, nll)
			}
			wsum += nll
		}
		total += wsum
		res.WindowNLL = append(res.WindowNLL, wsum/float64(opt.Ctx-1))
		res.TokensScored += opt.Ctx - 1
		if opt.Progress != nil {
			opt.Progress(w+1, n)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	res.NLL = total / float64(res.TokensScored)
	res.Perplexity = math.Exp(res.NLL)
	if res.Seconds > 0 {
		res.TokensPerSecond = float64(n*opt.Ctx) / res.Seconds
	}
	return res, nil
}

// windowCount returns how many non-overlapping windows of ctx tokens fit
// in n tokens (the tail dropped), at most maxWindows when > 0. Errors:
// ctx < 2, ErrTooShort.
func windowCount(n, ctx, maxWindows int) (int, error) {
	if ctx < 2 {
		return 0, fmt.Errorf("eval: ctx %d: want >= 2", ctx)
	}
	w := n / ctx
	if w == 0 {
		return 0, fmt.Errorf("eval: %w: %d tokens, window %d", ErrTooShort, n, ctx)
	}
	if maxWindows > 0 && maxWindows < w {
		w = maxWindows
	}
	return w, nil
}

// NLL returns −log softmax(logits)[target] in nats, computed in float64.
// logits: [vocab] float32.
func NLL(logits []float32, target int) float64 {
	mx := math.Inf(-1)
	for _, l := range logits {
		mx = math.Max(mx, float64(l))
	}
	var s float64
	for _, l := range logits {
		s += math.Exp(float64(l) - mx)
	}
	return mx + math.Log(s) - float64(logits[target])
}
