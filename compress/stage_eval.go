package compress

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/eval/kveval"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// evalKeys names eval.PerplexityOptions' fields as recipe keys
// (field.Rename of its Validate errors).
var evalKeys = map[string]string{"Ctx": "eval.ctx", "MaxWindows": "eval.max_windows", "Prompt": "eval.kv_prompt", "Chunk": "eval.kv_chunk"}

// options is the eval section's window options (KVChunk 0: 1, the gate
// feeds the artifact one token per call).
func (e *EvalStage) options() eval.PerplexityOptions {
	chunk := e.KVChunk
	if chunk == 0 {
		chunk = 1
	}
	return eval.PerplexityOptions{Ctx: e.Ctx, MaxWindows: e.MaxWindows, Prompt: e.KVPrompt, Chunk: chunk}
}

// evalStage is the eval stage: its cache key is the eval section (data
// path and gate thresholds excluded) and the eval data's fingerprint;
// its report hook copies the EvalResult into the Report.
func (p *pipeline) evalStage() stage {
	// "protocol decode": results of the former one-shot protocol are
	// not reused.
	// "serving bits": nor those without the serving-context figure.
	return stage{name: "eval", params: append(append(section(p.r.Eval), "protocol decode; serving bits"...), p.evalFP...), run: p.eval,
		report: func(rep *Report, res json.RawMessage) error {
			var ev EvalResult
			if err := json.Unmarshal(res, &ev); err != nil {
				return err
			}
			rep.Eval = &ev
			rep.KVBitsPerElement = ev.KVBitsPerElement
			rep.KVServingCtx, rep.KVBitsPerElementServing = ev.ServingCtx, ev.KVBitsPerElementServing
			return nil
		}}
}

// Gate is the eval gate's outcome: the thresholds (0: no bound) and the
// failures, one sentence each. MaxDeltaPPLPct bounds ΔPPL in percent of
// the source model's perplexity (eval.max_delta_ppl_pct); MaxKL bounds
// KL(source ‖ artifact) in nats per token (eval.max_kl).
type Gate struct {
	MaxDeltaPPLPct float64 `json:"max_delta_ppl_pct"`
	// DeltaPPLPct is the measured ΔPPL in percent of the source model's
	// perplexity: 100 · DeltaPPL / SourcePerplexity.
	DeltaPPLPct float64  `json:"delta_ppl_pct"`
	MaxKL       float64  `json:"max_kl"`
	Passed      bool     `json:"passed"`
	Failures    []string `json:"failures,omitempty"`
}

// gate checks rep.Eval against the recipe's eval thresholds and records
// the outcome in rep.Gate. It returns nil without an eval section or when
// every bound holds, and otherwise ErrGate naming each failure, the
// output path that is not written and where the new artifact stays.
func (p *pipeline) gate(rep *Report) error {
	e := p.r.Eval
	if e == nil {
		return nil
	}
	g := &Gate{MaxDeltaPPLPct: e.MaxDeltaPPLPct, MaxKL: e.MaxKL, DeltaPPLPct: 100 * rep.Eval.DeltaPPL / rep.Eval.SourcePerplexity}
	if e.MaxDeltaPPLPct > 0 && !(g.DeltaPPLPct <= e.MaxDeltaPPLPct) {
		g.Failures = append(g.Failures, fmt.Sprintf("ΔPPL %+.4f (%+.2f%% of the source perplexity %.4f) exceeds max_delta_ppl_pct %g", rep.Eval.DeltaPPL, g.DeltaPPLPct, rep.Eval.SourcePerplexity, e.MaxDeltaPPLPct))
	}
	if e.MaxKL > 0 && !(rep.Eval.KL <= e.MaxKL) {
		g.Failures = append(g.Failures, fmt.Sprintf("KL %.5f exceeds max_kl %g", rep.Eval.KL, e.MaxKL))
	}
	g.Passed = len(g.Failures) == 0
	rep.Gate = g
	if g.Passed {
		return nil
	}
	older := ""
	if _, err := os.Lstat(p.opt.Out); err == nil {
		older = fmt.Sprintf("; an older file at %s is left unchanged", p.opt.Out)
	}
	return fmt.Errorf("%w: %s; %s not written%s (the new artifact stays in %s)", ErrGate, strings.Join(g.Failures, "; "), p.opt.Out, older, p.st.artifact)
}

// eval compares the artifact with the source model.
func (p *pipeline) eval(ctx context.Context, dir string) (outputs, any, error) {
	e := p.r.Eval
	src, err := engine.Open(ctx, p.srcDir, engine.Options{Threads: p.opt.Threads})
	if err != nil {
		return outputs{}, nil, err
	}
	defer src.Close()
	art, err := engine.Open(ctx, p.st.artifact, engine.Options{Threads: p.opt.Threads, Artifacts: true})
	if err != nil {
		return outputs{}, nil, err
	}
	defer art.Close()
	ids, err := src.EvalIDs(p.evalData, e.Ctx)
	if err != nil {
		return outputs{}, nil, err
	}
	r, err := compareModels(ctx, src, art, ids, e.Ctx, e.MaxWindows, e.KVPrompt, e.KVChunk, p.progress("eval"))
	if err != nil {
		return outputs{}, nil, err
	}
	if err := p.servingBits(r, art); err != nil {
		return outputs{}, nil, err
	}
	return outputs{}, r, nil
}

// servingBits sets r's ServingCtx (the recipe's quantize.kv.serving_ctx,
// else kveval.DefaultServingCtx) and KVBitsPerElementServing, the
// artifact's KV scheme (its manifest's cache and options) at that context
// by eval's kveval.ServingBits.
func (p *pipeline) servingBits(r *EvalResult, art *engine.Engine) error {
	r.ServingCtx = kveval.DefaultServingCtx
	if q := p.r.Quantize; q != nil && q.KV != nil && q.KV.ServingCtx > 0 {
		r.ServingCtx = q.KV.ServingCtx
	}
	method, o, err := art.Artifact.KVCache()
	if err != nil {
		return err
	}
	b, err := kveval.ServingBits(cmp.Or(method, "fp32"), kvcache.LayersOf(art.Desc), o, r.ServingCtx)
	if err != nil {
		return fmt.Errorf("compress: eval: kv bits/element at serving context %d: %w", r.ServingCtx, err)
	}
	r.KVBitsPerElementServing = b
	return nil
}
