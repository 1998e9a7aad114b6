package export_test

// The real-consumer tests of the GGUF export (issue 15's acceptance): every
// exported file is loaded by llama.cpp (node-llama-cpp 3.21.1's prebuilt
// CPU build, through internal/llamacpp) and what llama.cpp computes is
// compared with lmpack's runtime on the checkpoint that was exported.
//
// What is compared (each bound is stated, with its reason, beside the
// constant that holds it):
//   - greedy decoding: prompt token ids (llama.cpp tokenizes from the
//     GGUF's tokenizer metadata, lmpack from tokenizer.json), 32 generated
//     ids and their text, which must be identical;
//   - next-token distributions at every decoding step: llama.cpp's
//     log-probabilities (node-llama-cpp exposes the float32 softmax of the
//     raw logits, so log p = logit − logsumexp) against lmpack's float64
//     log-softmax of its float32 logits, as max |Δ| over the vocabulary
//     divided by the range (max − min) of lmpack's logits at that step;
//   - perplexity over the same windows: each window is BOS followed by
//     the next ctx−1 tokens of held-out TinyStories text (tokenized once
//     by lmpack, the ids given to both), every position 1..ctx−1 scored as
//     eval.Perplexity scores it.

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/export"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/llamacpp"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/internal/synthmoe"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/quantize/wquant"
)

// Bounds, decided before any measurement.
const (
	// f32LogitBound bounds max|Δ log p| / (logit range) for an F32 export.
	// Both sides compute in float32 from the same float32 weights (the KV
	// cache is F32 in llama.cpp too); they differ only in summation order
	// (ggml's SIMD dot products, its RMSNorm and softmax) and in RoPE's
	// sin/cos, each a relative error of a few float32 ulps (~1e-6) per
	// operation, compounded over 4–5 blocks to at most ~1e-4 of the logits'
	// magnitude. 1e-3 of the range leaves a margin of ten; a wrong q/k
	// permutation, RoPE mode, norm epsilon or tensor orientation moves the
	// log-probabilities by a sizeable fraction of the range.
	f32LogitBound = 1e-3
	// q4LogitBound bounds the same ratio for a 4-bit group-32 export (Q4_0
	// or Q4_1 written from lmpack's codes without requantising) against
	// lmpack's runtime on the same packed weights. llama.cpp's CPU kernels
	// for Q4_0/Q4_1 quantise the activations to Q8_0/Q8_1 (blocks of 32,
	// scale = max|x|/127) before the dot product; so does lmpack for its
	// packed 4-bit weights (runtime/qlinear.go), with its own rounding
	// order. That rounding is up to 1/254 of a block's largest activation
	// per element on each side, a relative error of a matmul's output of
	// about 0.3–0.5 % (random rounding over 32-element blocks), through 4 blocks
	// of 7 matmuls each; the logits can move by ~1 % of their range. 3 %
	// leaves a margin of three and still catches a wrong zero-point sign or
	// nibble order (errors of the order of the range).
	q4LogitBound = 3e-2
	// f32PPLBound bounds |ppl_llama.cpp − ppl_lmpack| / ppl_lmpack for an F32
	// export: from per-token log-probability differences of ~1e-4·range
	// (see f32LogitBound) the mean NLL moves by ~1e-4 nats, a relative
	// perplexity change of ~1e-4; 0.5 % is the suggested bound and
	// a margin of fifty.
	f32PPLBound = 5e-3
	// q8PPLBound bounds the same for a Q8_0 export of lmpack's symmetric
	// 8-bit group-32 checkpoint: llama.cpp rounds the activations to Q8_0
	// as well (1/254 of a block's maximum, a ~0.3 % relative error per
	// matmul output), which adds noise of that order to the logits; its
	// effect on the mean NLL is second order (the noise is unbiased), well
	// under 1 %.
	q8PPLBound = 1e-2
)

// ggufFile exports the model dir with export.GGUF (typ is the --gguf-type,
// "" for auto) into a temporary directory and returns the file's path;
// the report's rows are logged.
func ggufFile(t *testing.T, dir, typ string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(dir)+".gguf")
	rep, err := export.GGUF(context.Background(), dir, export.GGUFOptions{Out: out, Type: typ})
	if err != nil {
		t.Fatalf("export %s as GGUF (type %q): %v", dir, typ, err)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("export %s (type %q):\n%s", filepath.Base(dir), typ, b.String())
	return out
}

// openLM opens dir on lmpack's CPU runtime with one thread.
func openLM(t *testing.T, dir string) *engine.Engine {
	t.Helper()
	return openLMOpts(t, dir, engine.Options{Threads: 1, Device: "cpu"})
}

// openLMDequant is openLM with the weights dequantized to float32 at load
// (engine.Options.DequantizeWeights): float activations, as llama.cpp
// runs an F32 GGUF.
func openLMDequant(t *testing.T, dir string) *engine.Engine {
	t.Helper()
	return openLMOpts(t, dir, engine.Options{Threads: 1, Device: "cpu", DequantizeWeights: true})
}

func openLMOpts(t *testing.T, dir string, o engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.Open(context.Background(), dir, o)
	if err != nil {
		t.Fatalf("lmpack: open %s: %v", dir, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// allLogits runs ids from position 0 and returns [len(ids)][vocab] logits.
func allLogits(t *testing.T, e *engine.Engine, ids []int) [][]float32 {
	t.Helper()
	V := e.Desc.VocabSize
	buf := make([]float32, len(ids)*V)
	if err := e.Model.Forward(context.Background(), ids, e.Model.NewCache(len(ids)), buf, true); err != nil {
		t.Fatalf("lmpack: forward %d tokens: %v", len(ids), err)
	}
	rows := make([][]float32, len(ids))
	for i := range rows {
		rows[i] = buf[i*V : (i+1)*V]
	}
	return rows
}

// logitDiff returns max_i |log p_i − logsoftmax(logits)_i| / (max − min of
// logits): the deviation of llama.cpp's probabilities p from lmpack's
// logits relative to their range. A probability of 0 (log −Inf) is an
// infinite deviation.
func logitDiff(logits []float32, p []float64) float64 {
	mx, mn := math.Inf(-1), math.Inf(1)
	for _, l := range logits {
		mx, mn = math.Max(mx, float64(l)), math.Min(mn, float64(l))
	}
	var s float64
	for _, l := range logits {
		s += math.Exp(float64(l) - mx)
	}
	lse := mx + math.Log(s)
	var worst float64
	for i, l := range logits {
		d := math.Abs(math.Log(p[i]) - (float64(l) - lse))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		worst = math.Max(worst, d)
	}
	return worst / (mx - mn)
}

var prompts = []string{
	"Once upon a time",
	"The little dog saw a big red ball.",
	"Lily and Tom went to the park. They",
}

// checks says what one llama.cpp run of an export compares with lmpack.
type checks struct {
	// gen > 0: decode gen greedy tokens of each prompt; sameIDs: the
	// generated ids and text must equal lmpack's (else only the prompt
	// ids must, and the distributions are compared along llama.cpp's own
	// sequence).
	gen     int
	sameIDs bool
	// bytesText: random weights generate byte-fallback tokens that
	// form invalid UTF-8, which llama.cpp's detokenizer and lmpack's
	// stream decoder replace differently; compare the ids only.
	bytesText bool
	// windows > 0: perplexity over that many windows of pplCtx tokens.
	windows int
}

// pplCtx is the perplexity window (BOS + 127 tokens).
const pplCtx = 128

// measured is what a run measured: the worst logitDiff over all decoding
// steps, lmpack's and llama.cpp's perplexity, and the largest per-token
// NLL difference.
type measured struct {
	logit, pplLM, pplLL, tokNLL float64
}

// compare runs gguf once in llama.cpp with the requests c asks for and
// compares with lmpack's e: prompt ids, greedy ids and text (Errorf on a
// difference) and the measurements.
func compare(t *testing.T, r *llamacpp.Runner, e *engine.Engine, gguf string, c checks) measured {
	t.Helper()
	reqs, wins := c.requests(t, e)
	out, err := r.Run(context.Background(), gguf, 256, reqs)
	if err != nil {
		t.Fatal(err)
	}
	return c.measure(t, e, wins, out, nil)
}

// run is one export to compare: lmpack's model e, the exported file and
// the checks.
type run struct {
	e    *engine.Engine
	gguf string
	c    checks
}

// runAll runs every export in one node process (llama.cpp's binary is
// loaded once; the machines are small) and returns what each measured.
func runAll(t *testing.T, r *llamacpp.Runner, runs []run) []measured {
	t.Helper()
	jobs := make([]llamacpp.Job, len(runs))
	wins := make([][][]int, len(runs))
	for i, x := range runs {
		var reqs []llamacpp.Request
		reqs, wins[i] = x.c.requests(t, x.e)
		jobs[i] = llamacpp.Job{Model: x.gguf, ContextSize: 256, Requests: reqs}
	}
	outs, err := r.RunJobs(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	ms := make([]measured, len(runs))
	for i, x := range runs {
		ms[i] = x.c.measure(t, x.e, wins[i], outs[i], nil)
	}
	return ms
}

// requests returns the llama.cpp requests of c (greedy prompts first,
// then one scoring request per perplexity window) and the windows.
func (c checks) requests(t *testing.T, e *engine.Engine) ([]llamacpp.Request, [][]int) {
	t.Helper()
	var reqs []llamacpp.Request
	if c.gen > 0 {
		for _, p := range prompts {
			reqs = append(reqs, llamacpp.Request{Prompt: p, Generate: c.gen, Probs: true})
		}
	}
	var wins [][]int
	if c.windows > 0 {
		wins = pplWindows(t, e, c.windows, pplCtx)
		for _, win := range wins {
			reqs = append(reqs, llamacpp.Request{Tokens: win, Score: true})
		}
	}
	return reqs, wins
}

// measure compares llama.cpp's answers out to c.requests with lmpack's e;
// lm, when not nil, is lmpack's side of the perplexity windows already
// computed (lmScores).
func (c checks) measure(t *testing.T, e *engine.Engine, wins [][]int, out *llamacpp.Output, lm *lmScores) measured {
	t.Helper()
	var m measured
	if c.gen > 0 {
		for i, p := range prompts {
			m.logit = math.Max(m.logit, greedyPrompt(t, e, p, out.Results[i], c))
		}
	}
	if c.windows > 0 {
		if lm == nil {
			lm = lmPerplexity(t, e, wins)
		}
		m.pplLM, m.pplLL, m.tokNLL = lm.against(t, wins, out.Results[len(out.Results)-len(wins):])
	}
	return m
}

// greedyPrompt compares llama.cpp's greedy decode res of prompt p with
// lmpack's (Generate at temperature 0) and returns the worst logitDiff of
// the c.gen next-token distributions along llama.cpp's sequence.
func greedyPrompt(t *testing.T, e *engine.Engine, p string, res llamacpp.Result, c checks) float64 {
	t.Helper()
	var text strings.Builder
	st, err := e.Generate(context.Background(), p, engine.GenerateOptions{MaxTokens: c.gen}, func(s string) error {
		text.WriteString(s)
		return nil
	})
	if err != nil {
		t.Fatalf("lmpack: generate %q: %v", p, err)
	}
	want, _ := e.PromptIDs(p)
	if fmt.Sprint(res.PromptIDs) != fmt.Sprint(want) {
		t.Errorf("prompt %q: llama.cpp tokenized it as %v, lmpack as %v", p, res.PromptIDs, want)
	}
	if c.sameIDs && fmt.Sprint(res.IDs) != fmt.Sprint(st.IDs) {
		t.Errorf("prompt %q: greedy ids differ\n llama.cpp %v\n lmpack    %v", p, res.IDs, st.IDs)
	}
	if c.sameIDs && !c.bytesText && res.Text != text.String() {
		t.Errorf("prompt %q: greedy text differs\n llama.cpp %q\n lmpack    %q", p, res.Text, text.String())
	}
	// lmpack's logits along llama.cpp's sequence: row len(prompt)-1+k is
	// the distribution generated token k was chosen from.
	seq := append(append([]int{}, res.PromptIDs...), res.IDs[:c.gen-1]...)
	rows := allLogits(t, e, seq)
	var worst float64
	for k := 0; k < c.gen; k++ {
		row := rows[len(res.PromptIDs)-1+k]
		if len(res.Probs[k]) != len(row) {
			t.Fatalf("prompt %q step %d: llama.cpp gave %d probabilities, lmpack %d logits", p, k, len(res.Probs[k]), len(row))
		}
		worst = math.Max(worst, logitDiff(row, res.Probs[k]))
	}
	return worst
}

// pplWindows returns w windows of ctx tokens: BOS then the next ctx−1 ids
// of the held-out TinyStories text as lmpack tokenizes it.
func pplWindows(t *testing.T, e *engine.Engine, w, ctx int) [][]int {
	t.Helper()
	b, err := os.ReadFile(shared.Path(t, "tinystories-valid", "heldout.txt"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	if len(text) > 16000 { // enough for w·ctx tokens; cut at a line end
		text = text[:strings.LastIndexByte(text[:16000], '\n')+1]
	}
	ids := e.Tokenizer.Encode(text, false)
	bos, ok := e.Tokenizer.BOS()
	if !ok {
		t.Fatalf("%s: no BOS token", e.Dir)
	}
	if len(ids) < w*(ctx-1) {
		t.Fatalf("held-out text gives %d tokens, need %d", len(ids), w*(ctx-1))
	}
	out := make([][]int, w)
	for i := range out {
		out[i] = append([]int{bos}, ids[i*(ctx-1):(i+1)*(ctx-1)]...)
	}
	return out
}

// lmScores is lmpack's side of a perplexity comparison: eval.Perplexity's
// result and the per-token NLL of every scored position.
type lmScores struct {
	ppl    float64
	scored int
	nll    [][]float64 // [window][position 0..ctx-2]
}

// lmPerplexity runs eval.Perplexity on the windows laid end to end (one
// window each) and the per-token NLL of each window's positions.
func lmPerplexity(t *testing.T, e *engine.Engine, wins [][]int) *lmScores {
	t.Helper()
	var flat []int
	for _, win := range wins {
		flat = append(flat, win...)
	}
	pr, err := eval.Perplexity(context.Background(), e.Model, flat, eval.PerplexityOptions{Ctx: len(wins[0])})
	if err != nil {
		t.Fatal(err)
	}
	s := &lmScores{ppl: pr.Perplexity, scored: pr.TokensScored}
	for _, win := range wins {
		rows := allLogits(t, e, win)
		nll := make([]float64, len(win)-1)
		for j := range nll {
			nll[j] = eval.NLL(rows[j], win[j+1])
		}
		s.nll = append(s.nll, nll)
	}
	return s
}

// against returns lmpack's perplexity, llama.cpp's from its target
// probabilities res (one Result per window), and the largest per-token
// NLL difference.
func (s *lmScores) against(t *testing.T, wins [][]int, res []llamacpp.Result) (lm, ll, maxTok float64) {
	t.Helper()
	var sum float64
	var n int
	for i := range wins {
		for j, p := range res[i].TargetProbs {
			nll := -math.Log(p)
			sum += nll
			n++
			maxTok = math.Max(maxTok, math.Abs(nll-s.nll[i][j]))
		}
	}
	if n != s.scored {
		t.Fatalf("llama.cpp scored %d tokens, lmpack %d", n, s.scored)
	}
	return s.ppl, math.Exp(sum / float64(n)), maxTok
}

// checkLogits fails t when the worst logitDiff m.logit exceeds bound.
func checkLogits(t *testing.T, label string, m measured, bound float64) {
	t.Helper()
	t.Logf("%s: worst max|Δ log p|/(logit range) over all decoding steps = %.3g (bound %g)", label, m.logit, bound)
	if !(m.logit <= bound) {
		t.Errorf("%s: next-token log-probabilities differ by %.3g of the logit range, bound %g", label, m.logit, bound)
	}
}

// checkPPL fails t when the perplexities differ by more than bound
// relative to lmpack's.
func checkPPL(t *testing.T, label string, m measured, bound float64) {
	t.Helper()
	rel := math.Abs(m.pplLL-m.pplLM) / m.pplLM
	t.Logf("%s: perplexity lmpack %.6f llama.cpp %.6f, relative %.3g (bound %g); worst token |ΔNLL| %.3g nats",
		label, m.pplLM, m.pplLL, rel, bound, m.tokNLL)
	if !(rel <= bound) {
		t.Errorf("%s: perplexity lmpack %.6f llama.cpp %.6f: relative difference %.3g > %g", label, m.pplLM, m.pplLL, rel, bound)
	}
}

// TestGGUFLlamaCppF32 exports stories260K and tiny1m as F32 and compares
// greedy text (32 tokens of each prompt), next-token distributions and
// perplexity (4 windows of 128) with lmpack's runtime on the checkpoint.
func TestGGUFLlamaCppF32(t *testing.T) {
	r := llamacpp.Require(t)
	names := []string{"stories260K-hf", "tiny1m-hf"}
	var runs []run
	for _, name := range names {
		dir := shared.Path(t, name)
		runs = append(runs, run{openLM(t, dir), ggufFile(t, dir, "f32"), checks{gen: 32, sameIDs: true, windows: 4}})
	}
	for i, m := range runAll(t, r, runs) {
		checkLogits(t, names[i]+" F32", m, f32LogitBound)
		checkPPL(t, names[i]+" F32", m, f32PPLBound)
	}
}

// calibrateFile runs lmpack calibrate on dir over the first 1024 tokens of
// the TinyStories calibration text (windows of 128) and returns the file.
func calibrateFile(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "calib.safetensors")
	if _, err := calibrate.Run(context.Background(), calibrate.Options{
		Model: dir, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 128, Out: out, Threads: 1,
	}); err != nil {
		t.Fatalf("calibrate %s: %v", dir, err)
	}
	return out
}

// quantized writes lmpack's quantized checkpoint of dir (lmpack quantize
// weights with the calibration file calib) and returns its directory.
func quantized(t *testing.T, dir, calib, method string, bits, group int, sym bool) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), fmt.Sprintf("%s-%s-w%dg%d-sym%v", filepath.Base(dir), method, bits, group, sym))
	if _, err := wquant.Run(context.Background(), wquant.Options{
		Model: dir, Calib: calib, Out: out,
		Method: method, Bits: bits, GroupSize: group, Symmetric: sym, Threads: 1,
	}); err != nil {
		t.Fatalf("quantize %s: %v", dir, err)
	}
	return out
}

// TestGGUFLlamaCppGPTQ4 exports GPTQ 4-bit group-32 checkpoints of tiny1m
// (rows of 128 and 352 columns: groups of 32 divide every block weight),
// asymmetric (→ Q4_1) and symmetric (→ Q4_0), and compares llama.cpp's
// next-token distributions with lmpack's runtime on the same checkpoint,
// whose weights are the dequantised codes the export carries; then the
// same checkpoint exported as F32.
func TestGGUFLlamaCppGPTQ4(t *testing.T) {
	r := llamacpp.Require(t)
	dir := shared.Path(t, "tiny1m-hf")
	calib := calibrateFile(t, dir)
	names := []string{"asym", "sym"}
	var runs []run
	for _, name := range names {
		q := quantized(t, dir, calib, "gptq", 4, 32, name == "sym")
		e := openLM(t, q)
		// Both sides round activations to int8 per block of 32 in their
		// Q4 kernels (lmpack's packed weights: runtime/qlinear.go), in
		// different orders, which can flip a near-tied argmax, so only
		// the prompt ids must agree and the distributions are compared
		// along llama.cpp's own sequence. The same checkpoint exported as
		// F32 (the dequantised weights) against lmpack with the weights
		// dequantized at load (float activations on both sides): the F32
		// bound and identical greedy text apply, which separates the
		// export's weights from the activation rounding.
		runs = append(runs,
			run{e, ggufFile(t, q, ""), checks{gen: 32}},
			run{openLMDequant(t, q), ggufFile(t, q, "f32"), checks{gen: 32, sameIDs: true}})
	}
	ms := runAll(t, r, runs)
	for i, name := range names {
		checkLogits(t, "tiny1m GPTQ w4 g32 "+name+" as Q4", ms[2*i], q4LogitBound)
		checkLogits(t, "tiny1m GPTQ w4 g32 "+name+" dequantised to F32", ms[2*i+1], f32LogitBound)
	}
}

// TestGGUFLlamaCppQ8Perplexity exports lmpack's symmetric 8-bit group-32
// checkpoints (→ Q8_0 where 32 divides the columns) of stories260K,
// tiny1m and qwen3moe-2m (its routed experts quantized too: stacked Q8_0
// ffn_*_exps) and compares perplexity through llama.cpp and through
// lmpack on the same windows.
func TestGGUFLlamaCppQ8Perplexity(t *testing.T) {
	r := llamacpp.Require(t)
	names := []string{"stories260K-hf", "tiny1m-hf", "qwen3moe-2m-hf"}
	var runs []run
	for _, name := range names {
		dir := shared.Path(t, name)
		q := quantized(t, dir, calibrateFile(t, dir), "rtn", 8, 32, true)
		runs = append(runs, run{openLM(t, q), ggufFile(t, q, ""), checks{windows: 4}})
	}
	for i, m := range runAll(t, r, runs) {
		checkPPL(t, names[i]+" Q8_0", m, q8PPLBound)
	}
}

// TestGGUFLlamaCppMoE exports the two MoE checkpoints as F32 (Mixtral as
// llama with ffn_*_exps; Qwen3-MoE with q/k norm and norm_topk_prob), and
// a synthetic Qwen2-MoE with a shared expert, and
// checks that llama.cpp loads them and decodes the same greedy tokens as
// lmpack with next-token distributions within the F32 bound: the experts'
// weights are the same float32 values (qwen3moe's bf16 widened exactly)
// and both route by softmax then top-k, renormalised.
func TestGGUFLlamaCppMoE(t *testing.T) {
	r := llamacpp.Require(t)
	names := []string{"stories260K-moe-hf", "qwen3moe-2m-hf"}
	var runs []run
	for _, name := range names {
		dir := shared.Path(t, name)
		runs = append(runs, run{openLM(t, dir), ggufFile(t, dir, "f32"), checks{gen: 16, sameIDs: true}})
	}
	// Qwen2-MoE (shared expert with its sigmoid gate, no top-k
	// renormalisation): internal/synthmoe's seeded random checkpoint.
	syn := filepath.Join(t.TempDir(), "synth-qwen2moe")
	if _, err := synthmoe.Write(syn, 1, shared.Path(t, "stories260K-hf")); err != nil {
		t.Fatal(err)
	}
	names = append(names, "synthmoe qwen2moe")
	runs = append(runs, run{openLM(t, syn), ggufFile(t, syn, "f32"), checks{gen: 16, sameIDs: true, bytesText: true}})
	for i, m := range runAll(t, r, runs) {
		checkLogits(t, names[i]+" F32", m, f32LogitBound)
	}
}

// TestGGUFLlamaCppDepthPruned removes one block of stories260K (lmpack
// prune, list:2) and checks that the export loads and decodes like
// lmpack's runtime on the pruned checkpoint.
func TestGGUFLlamaCppDepthPruned(t *testing.T) {
	r := llamacpp.Require(t)
	out := filepath.Join(t.TempDir(), "stories260K-pruned")
	if _, err := prune.Run(context.Background(), prune.Options{
		Model: shared.Path(t, "stories260K-hf"), Out: out, Layers: 1, Method: "list:2", Threads: 1,
	}); err != nil {
		t.Fatal(err)
	}
	e := openLM(t, out)
	if len(e.Desc.Layers) != 4 {
		t.Fatalf("pruned checkpoint has %d layers, want 4", len(e.Desc.Layers))
	}
	m := compare(t, r, e, ggufFile(t, out, "f32"), checks{gen: 16, sameIDs: true})
	checkLogits(t, "stories260K without block 2, F32", m, f32LogitBound)
}

// TestGGUFLlamaCppEveryType exports qwen3moe-2m (bf16; its o_proj rows of
// 256 take the k-quants, the other tensors fall back as the report says)
// with every --gguf-type and checks that llama.cpp loads each file and
// that its perplexity over the same 4 windows stays within a per-type
// bound of lmpack's on the source checkpoint. These are requantisations,
// so the bounds are the quantisation's expected cost plus llama.cpp's
// activation rounding, not an equality; a file llama.cpp misreads (wrong
// block layout, scales, names) gives perplexities in the hundreds (a
// uniform guess over the 512 tokens is 512).
func TestGGUFLlamaCppEveryType(t *testing.T) {
	r := llamacpp.Require(t)
	dir := shared.Path(t, "qwen3moe-2m-hf")
	e := openLM(t, dir)
	types := []struct {
		typ   string
		bound float64
	}{
		// bf16: the source's own values; llama.cpp rounds activations to
		// bf16 (2^-9 relative) in its BF16 dot products: well under 1 %.
		{"bf16", 1e-2},
		// f16: bf16 values fit f16's 11-bit mantissa (below 6e-5 they
		// lose bits as subnormals); activations rounded to f16 (2^-12).
		{"f16", 1e-2},
		// q8_0: 8-bit blocks of 32 (≈0.2 % weight error) and Q8_0
		// activations, as q8PPLBound.
		{"q8_0", 1e-2},
		// q6_k (and its fallback for rows that are not multiples of
		// 256): ≈1 % weight error, a perplexity cost of a few tenths of
		// a percent on trained weights; 3 %.
		{"q6_k", 3e-2},
		// 4-bit round-to-nearest on a 2M-parameter model: ≈6–8 % weight
		// error, a perplexity cost of several percent, up to ~15 %; 30 %.
		{"q4_0", 0.3}, {"q4_1", 0.3}, {"q4_k", 0.3},
	}
	// One node process for all files (llama.cpp's binary loaded once),
	// and lmpack's side computed once.
	c := checks{windows: 4}
	reqs, wins := c.requests(t, e)
	lm := lmPerplexity(t, e, wins)
	var jobs []llamacpp.Job
	for _, ty := range types {
		jobs = append(jobs, llamacpp.Job{Model: ggufFile(t, dir, ty.typ), ContextSize: 256, Requests: reqs})
	}
	outs, err := r.RunJobs(context.Background(), jobs)
	if err != nil {
		t.Fatal(err)
	}
	for i, ty := range types {
		checkPPL(t, "qwen3moe-2m "+ty.typ, c.measure(t, e, wins, outs[i], lm), ty.bound)
	}
}

// TestGGUFLlamaCppWidthPruned width-prunes tiny1m (lmpack prune: one GQA
// head group of one layer removed by Putri's scores, and a quarter of
// every FFN's nodes), which the export writes as llama.cpp's deci
// architecture with per-layer head_count / head_count_kv /
// feed_forward_length arrays, and checks it decodes like lmpack's runtime
// on the pruned checkpoint: the same float32 weights, so the F32 bound.
func TestGGUFLlamaCppWidthPruned(t *testing.T) {
	r := llamacpp.Require(t)
	dir := shared.Path(t, "tiny1m-hf")
	out := filepath.Join(t.TempDir(), "tiny1m-width")
	if _, err := prune.Run(context.Background(), prune.Options{
		Model: dir, Calib: calibrateFile(t, dir), Out: out, HeadGroups: 1, FFNRatio: 0.25, NoRefit: true, Threads: 1,
	}); err != nil {
		t.Fatal(err)
	}
	e := openLM(t, out)
	heads := map[int]bool{}
	for _, l := range e.Desc.Layers {
		heads[l.NumKVHeads] = true
	}
	if len(heads) < 2 {
		t.Fatalf("pruned checkpoint has uniform KV head counts %v: the per-layer case is not exercised", heads)
	}
	m := runAll(t, r, []run{{e, ggufFile(t, out, "f32"), checks{gen: 16, sameIDs: true, windows: 2}}})[0]
	checkLogits(t, "tiny1m width-pruned (deci), F32", m, f32LogitBound)
	checkPPL(t, "tiny1m width-pruned (deci), F32", m, f32PPLBound)
}

// writeQwen3Synth writes a one-block Qwen3 checkpoint (hidden 16, two
// query heads and one KV head of head_dim 8 with q/k norm, tied
// embeddings) with seeded random float32 weights and the real Qwen3
// tokenizer (byte-level BPE, 151,643 tokens and the added ones in a
// vocabulary of 151,936), and returns its directory.
func writeQwen3Synth(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "synth-qwen3")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const vocab, hidden, heads, kv, hd, inter = 151936, 16, 2, 1, 8, 32
	cfg := map[string]any{
		"architectures": []string{"Qwen3ForCausalLM"}, "model_type": "qwen3",
		"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 1,
		"num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
		"vocab_size": vocab, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
		"rope_theta": 1000000.0, "tie_word_embeddings": true, "torch_dtype": "float32",
		"bos_token_id": 151643, "eos_token_id": 151645,
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(15, 1))
	mat := func(name string, scale float64, shape ...int) safetensors.WriteTensor {
		n := 1
		for _, s := range shape {
			n *= s
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
		}
		return safetensors.FromFloat32(name, shape, v)
	}
	norm := func(name string, n int) safetensors.WriteTensor {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(1 + 0.1*rng.NormFloat64())
		}
		return safetensors.FromFloat32(name, []int{n}, v)
	}
	p := "model.layers.0."
	ts := []safetensors.WriteTensor{
		mat("model.embed_tokens.weight", 1, vocab, hidden),
		norm(p+"input_layernorm.weight", hidden),
		mat(p+"self_attn.q_proj.weight", 0.25, heads*hd, hidden),
		mat(p+"self_attn.k_proj.weight", 0.25, kv*hd, hidden),
		mat(p+"self_attn.v_proj.weight", 0.25, kv*hd, hidden),
		mat(p+"self_attn.o_proj.weight", 0.25, hidden, heads*hd),
		norm(p+"self_attn.q_norm.weight", hd),
		norm(p+"self_attn.k_norm.weight", hd),
		norm(p+"post_attention_layernorm.weight", hidden),
		mat(p+"mlp.gate_proj.weight", 0.25, inter, hidden),
		mat(p+"mlp.up_proj.weight", 0.25, inter, hidden),
		mat(p+"mlp.down_proj.weight", 0.18, hidden, inter),
		norm("model.norm.weight", hidden),
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	zf, err := os.Open(shared.Path(t, "qwen3-tokenizer", "tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer zf.Close()
	zr, err := gzip.NewReader(zf)
	if err != nil {
		t.Fatal(err)
	}
	tj, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		t.Fatal(err)
	}
	tc, err := os.ReadFile(shared.Path(t, "qwen3-tokenizer", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), tc, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestGGUFLlamaCppQwen3ByteLevelBPE exports a synthetic Qwen3 checkpoint
// with the real Qwen3 tokenizer and checks, in llama.cpp: the
// tokenization of every reference text of qwen3-tokenizer (from the
// GGUF's gpt2 tokens, merges and qwen2 pre-tokenizer; special-token text
// parsed as Hugging Face does) equals the reference ids (tokenizers-js)
// and lmpack's; and the qwen3 graph (q/k norm, NEOX RoPE, tied
// embeddings) decodes the same greedy ids as lmpack with next-token
// distributions within the F32 bound (the same float32 weights).
func TestGGUFLlamaCppQwen3ByteLevelBPE(t *testing.T) {
	r := llamacpp.Require(t)
	var ref struct {
		Cases []struct {
			Text string `json:"text"`
			IDs  []int  `json:"ids"`
		} `json:"cases"`
	}
	b, err := os.ReadFile(shared.Path(t, "qwen3-tokenizer", "reference_encodings.tokenizers-js.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	dir := writeQwen3Synth(t)
	e := openLM(t, dir)
	gguf := ggufFile(t, dir, "f32")
	var reqs []llamacpp.Request
	var texts []string
	var want [][]int
	for _, c := range ref.Cases {
		if c.Text == "" { // llama.cpp has nothing to evaluate
			continue
		}
		texts, want = append(texts, c.Text), append(want, c.IDs)
		reqs = append(reqs, llamacpp.Request{Prompt: c.Text, Special: true, Generate: 1})
	}
	const prompt = "Once upon a time, there was a little girl named Lily."
	c := checks{gen: 4, sameIDs: true, bytesText: true}
	reqs = append(reqs, llamacpp.Request{Prompt: prompt, Generate: c.gen, Probs: true})
	out, err := r.Run(context.Background(), gguf, 256, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if out.Model.AddBOS {
		t.Errorf("llama.cpp prepends BOS for the Qwen3 tokenizer (tokenizer_config.json has add_bos_token false)")
	}
	for i, text := range texts {
		got := out.Results[i].PromptIDs
		if fmt.Sprint(got) != fmt.Sprint(want[i]) {
			t.Errorf("%q: llama.cpp tokenizes to %v, reference %v", text, got, want[i])
		}
		if lm := e.Tokenizer.Encode(text, true); fmt.Sprint(got) != fmt.Sprint(lm) {
			t.Errorf("%q: llama.cpp tokenizes to %v, lmpack %v", text, got, lm)
		}
	}
	d := greedyPrompt(t, e, prompt, out.Results[len(texts)], c)
	checkLogits(t, "synthetic Qwen3, F32", measured{logit: d}, f32LogitBound)
}

// writeSynth writes a checkpoint for cfg (merged over a small decoder:
// hidden 64, 2 layers, 4 heads and 2 KV heads of head_dim 16, FFN 96,
// stories260K's tokenizer and vocabulary of 512) with seeded random
// float32 weights: the embedding N(0, 1), matrices N(0, 1/in_features),
// biases N(0, 0.1²), norms 1 + N(0, 0.1²). Weights of that size give
// logits with a range of several nats, so greedy decoding has clear
// margins.
func writeSynth(t *testing.T, cfg map[string]any) string {
	t.Helper()
	base := map[string]any{
		"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
		"rope_theta": 10000.0, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2,
		"hidden_act": "silu", "torch_dtype": "float32",
	}
	for k, v := range cfg {
		base[k] = v
	}
	raw, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	d, err := arch.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "synth")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(shared.Path(t, "stories260K-hf", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sh := d.TensorShapes()
	names := make([]string, 0, len(sh))
	for n := range sh {
		names = append(names, n)
	}
	slices.Sort(names)
	rng := rand.New(rand.NewPCG(15, 2))
	var ts []safetensors.WriteTensor
	for _, n := range names {
		s := sh[n]
		size := 1
		for _, x := range s {
			size *= x
		}
		v := make([]float32, size)
		for i := range v {
			switch {
			case strings.HasSuffix(n, "norm.weight"):
				v[i] = float32(1 + 0.1*rng.NormFloat64())
			case len(s) == 1:
				v[i] = float32(0.1 * rng.NormFloat64())
			case n == d.Embedding:
				v[i] = float32(rng.NormFloat64())
			default:
				v[i] = float32(rng.NormFloat64() / math.Sqrt(float64(s[len(s)-1])))
			}
		}
		ts = append(ts, safetensors.FromFloat32(n, s, v))
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestGGUFLlamaCppArchitectures runs synthetic checkpoints of the dense
// families the export writes besides Llama: Qwen2 (q/k/v biases, NEOX
// RoPE, no permutation), Mistral (as llama, permuted q/k, with a sliding
// window of 4096 that the 256-token context never reaches) and Llama 3.1
// RoPE scaling (rope_freqs factors; original context 64 so that the
// scaling changes every frequency band). Same float32 weights: identical
// greedy ids (16 tokens) and the F32 bound on the distributions.
func TestGGUFLlamaCppArchitectures(t *testing.T) {
	r := llamacpp.Require(t)
	cases := []struct {
		name string
		cfg  map[string]any
	}{
		{"qwen2", map[string]any{"architectures": []string{"Qwen2ForCausalLM"}, "model_type": "qwen2", "rope_theta": 1e6}},
		{"mistral", map[string]any{"architectures": []string{"MistralForCausalLM"}, "model_type": "mistral", "sliding_window": 4096}},
		{"llama3.1-rope", map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "rope_theta": 500000.0,
			"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}},
	}
	var runs []run
	for _, c := range cases {
		dir := writeSynth(t, c.cfg)
		runs = append(runs, run{openLM(t, dir), ggufFile(t, dir, "f32"), checks{gen: 16, sameIDs: true, bytesText: true}})
	}
	for i, m := range runAll(t, r, runs) {
		checkLogits(t, "synthetic "+cases[i].name+", F32", m, f32LogitBound)
	}
}
