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
	// Chunk 0 runs each window in one Forward call. Chunk >= 1 runs it as
	// generation does (TeacherForce, the decode-faithful protocol): the
	// first Prompt tokens in one call, unscored, then Chunk tokens per
	// call; a model whose cache quantises K/V (an artifact's) is then
	// measured as served, where one call would attend the window's
	// tokens through their fresh float32 K/V. Prompt needs Chunk >= 1.
	Prompt, Chunk int
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
// cache, and scores positions Prompt..Ctx-2 of each window: the NLL of
// token t+1 under the logits at t, from a float64 log-softmax (Chunk
// says how the window is fed: in one call, or as generation does). Statistics
// accumulate in float64. This is the protocol of llama.cpp's perplexity
// tool without its second-half-only scoring.
//
// Errors: Ctx < 2, a bad Prompt or Chunk, ErrTooShort, a forward
// error, ctx cancelled.
func Perplexity(ctx context.Context, m runtime.Model, ids []int, opt PerplexityOptions) (*PerplexityResult, error) {
	n, err := windowCount(len(ids), opt.Ctx, opt.MaxWindows)
	if err != nil {
		return nil, err
	}
	T, P := opt.Ctx, opt.Prompt
	if P < 0 || P > T-2 || opt.Chunk < 0 || (P > 0 && opt.Chunk == 0) {
		return nil, fmt.Errorf("eval: prompt %d, chunk %d: want chunk >= 0, and 0 <= prompt <= ctx-2 = %d with chunk >= 1 when prompt > 0", P, opt.Chunk, T-2)
	}
	V := m.Description().VocabSize
	// Windows per batched step of TeacherForce (one call per window when
	// Chunk is 0).
	B := 1
	if opt.Chunk > 0 {
		B = max(1, min(64, n, (128<<20)/(4*T*V)))
	}
	logits := make([][]float32, B)
	caches := make([]runtime.KVCache, B)
	for b := range B {
		logits[b] = make([]float32, T*V)
		caches[b] = m.NewCache(T)
	}
	res := &PerplexityResult{Ctx: T, Windows: n}
	var total float64
	start := time.Now()
	for w0 := 0; w0 < n; w0 += B {
		nb := min(B, n-w0)
		wins := make([][]int, nb)
		for b := range nb {
			wins[b] = ids[(w0+b)*T : (w0+b+1)*T]
			caches[b].Truncate(0)
		}
		if opt.Chunk == 0 {
			if err := m.Forward(ctx, wins[0], caches[0], logits[0], true); err != nil {
				return nil, fmt.Errorf("eval: window %d: %w", w0, err)
			}
		} else if err := TeacherForce(ctx, m, wins, caches[:nb], logits[:nb], P, opt.Chunk); err != nil {
			return nil, fmt.Errorf("eval: windows %d..%d: %w", w0, w0+nb-1, err)
		}
		for b, win := range wins {
			var wsum float64
			for t := P; t+1 < T; t++ {
				nll := NLL(logits[b][t*V:(t+1)*V], win[t+1])
				if math.IsNaN(nll) || math.IsInf(nll, 0) {
					return nil, fmt.Errorf("eval: window %d position %d: %w (NLL %v)", w0+b, t, ErrNonFinite, nll)
				}
				wsum += nll
			}
			total += wsum
			res.WindowNLL = append(res.WindowNLL, wsum/float64(T-1-P))
			res.TokensScored += T - 1 - P
		}
		if opt.Progress != nil {
			opt.Progress(w0+nb, n)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	res.NLL = total / float64(res.TokensScored)
	res.Perplexity = math.Exp(res.NLL)
	if res.Seconds > 0 {
		res.TokensPerSecond = float64(n*T) / res.Seconds
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
