package compress

import (
	"context"
	"fmt"
	"math"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// EvalResult is the eval stage's comparison of the artifact against the
// source model on the same token windows, the artifact fed
// decode-faithful (KVPrompt tokens in one call, then KVChunk tokens per
// call, as generation feeds it). Perplexities are exp(mean NLL) over the
// scored positions (KVPrompt..Ctx-2 of each window, as eval.Perplexity);
// DeltaPPL = Perplexity − SourcePerplexity; KL is the mean of
// KL(p_source ‖ p_artifact) of the next-token distributions in nats per
// position; Top1Agreement the fraction of positions with the same argmax.
// KVBitsPerElement is the artifact's KV cache storage in bits per cached
// K/V element for one full window (kvcache.Sizer; 32 for float32);
// KVBitsPerElementServing the same once ServingCtx tokens are cached
// (kveval.ServingBits, eval --kv's serving-context column: the fp16
// windows amortised over ServingCtx), ServingCtx the recipe's
// quantize.kv.serving_ctx or else kveval.DefaultServingCtx (32768).
type EvalResult struct {
	Ctx                     int     `json:"ctx"`
	KVPrompt                int     `json:"kv_prompt"`
	KVChunk                 int     `json:"kv_chunk"`
	Windows                 int     `json:"windows"`
	TokensScored            int     `json:"tokens_scored"`
	SourcePerplexity        float64 `json:"source_perplexity"`
	Perplexity              float64 `json:"perplexity"`
	DeltaPPL                float64 `json:"delta_ppl"`
	KL                      float64 `json:"kl"`
	Top1Agreement           float64 `json:"top1_agreement"`
	KVCache                 string  `json:"kv_cache"`
	KVBitsPerElement        float64 `json:"kv_bits_per_element"`
	ServingCtx              int     `json:"serving_ctx"`
	KVBitsPerElementServing float64 `json:"kv_bits_per_element_serving"`
}

// compareModels runs ids in non-overlapping windows of ctxLen tokens (at
// most maxWindows, 0: all) through the source (float32 cache, each window
// in one call) and the artifact (its own KV cache, Model.NewCache,
// decode-faithful: eval.TeacherForce with the first prompt tokens in one
// call, then chunk tokens per call, chunk 0 meaning 1, as generation
// reads the cache) and scores both over positions prompt..ctxLen−2.
// Statistics accumulate in float64.
//
// Errors: different vocabularies, a text shorter than one window
// (eval.ErrTooShort), a prompt outside [0, ctxLen−2], forward errors,
// non-finite logits, ctx cancelled.
func compareModels(ctx context.Context, src, art *engine.Engine, ids []int, ctxLen, maxWindows, prompt, chunk int, progress func(done, total int)) (*EvalResult, error) {
	V := src.Desc.VocabSize
	if art.Desc.VocabSize != V {
		return nil, fmt.Errorf("compress: eval: the artifact's vocabulary has %d tokens, the source's %d", art.Desc.VocabSize, V)
	}
	if ctxLen < 2 {
		return nil, fmt.Errorf("compress: eval: ctx %d: want >= 2 (the recipe's eval.ctx, or the model's default)", ctxLen)
	}
	n := len(ids) / ctxLen
	if maxWindows > 0 && n > maxWindows {
		n = maxWindows
	}
	if n == 0 {
		return nil, fmt.Errorf("compress: eval: %d tokens, want at least one window of %d: %w", len(ids), ctxLen, eval.ErrTooShort)
	}
	if prompt < 0 || prompt > ctxLen-2 {
		return nil, fmt.Errorf("compress: eval: kv_prompt %d: want 0 <= kv_prompt <= ctx-2 = %d", prompt, ctxLen-2)
	}
	chunk = max(chunk, 1)
	ref := make([]float32, ctxLen*V)
	got := make([]float32, ctxLen*V)
	// The artifact is fed as generation feeds it, so that every position
	// reads the earlier calls' tokens as its cache stores them.
	srcM, artM := src.Model, art.Model
	refCache, artCache := srcM.NewCache(ctxLen), artM.NewCache(ctxLen)
	logP := make([]float64, V)
	logQ := make([]float64, V)
	var srcNLL, artNLL, kl float64
	top1 := 0
	for w := 0; w < n; w++ {
		win := ids[w*ctxLen : (w+1)*ctxLen]
		refCache.Truncate(0)
		artCache.Truncate(0)
		if err := srcM.Forward(ctx, win, refCache, ref, true); err != nil {
			return nil, fmt.Errorf("compress: eval window %d (source): %w", w, err)
		}
		if err := eval.TeacherForce(ctx, artM, [][]int{win}, []runtime.KVCache{artCache}, [][]float32{got}, prompt, chunk); err != nil {
			return nil, fmt.Errorf("compress: eval window %d (artifact): %w", w, err)
		}
		for t := prompt; t+1 < ctxLen; t++ {
			p, q := ref[t*V:(t+1)*V], got[t*V:(t+1)*V]
			eval.LogSoftmax(p, logP)
			eval.LogSoftmax(q, logQ)
			next := win[t+1]
			if math.IsInf(logP[next], 0) || math.IsNaN(logP[next]) || math.IsInf(logQ[next], 0) || math.IsNaN(logQ[next]) {
				return nil, fmt.Errorf("compress: eval window %d position %d: %w", w, t, eval.ErrNonFinite)
			}
			srcNLL -= logP[next]
			artNLL -= logQ[next]
			var d float64
			for i, lp := range logP {
				if lp > math.Inf(-1) {
					d += math.Exp(lp) * (lp - logQ[i])
				}
			}
			kl += d
			if runtime.Argmax(p) == runtime.Argmax(q) {
				top1++
			}
		}
		if progress != nil {
			progress(w+1, n)
		}
	}
	scored := n * (ctxLen - 1 - prompt)
	r := &EvalResult{Ctx: ctxLen, KVPrompt: prompt, KVChunk: chunk, Windows: n, TokensScored: scored,
		SourcePerplexity: math.Exp(srcNLL / float64(scored)), Perplexity: math.Exp(artNLL / float64(scored)),
		KL: kl / float64(scored), Top1Agreement: float64(top1) / float64(scored), KVCache: art.KVCache, KVBitsPerElement: 32}
	r.DeltaPPL = r.Perplexity - r.SourcePerplexity
	if r.KVCache == "" {
		r.KVCache = "fp32"
	}
	if s, ok := artCache.(kvcache.Sizer); ok {
		r.KVBitsPerElement = s.BitsPerElement()
	}
	return r, nil
}
