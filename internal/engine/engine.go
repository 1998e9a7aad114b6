// Package engine is the facade of cmd/lmpack, compress and eval: it opens
// a MODEL (a checkpoint directory or hub id through package model, or an
// lmpack artifact through package pack) with its tokenizer, picks the
// device and loads the weights on that runtime backend. It also holds the
// text generation loop and the inspect report, so cmd/lmpack only parses
// flags. The compression stages do not use it: they open models through
// package model and run them through runtime.
package engine

import (
	"context"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/internal/hub"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/runtime"
)

// Options configures Open.
type Options struct {
	// Threads is the CPU worker count; <= 0 means all cores.
	Threads int
	// Device selects the backend: "auto", "cpu" (also "") or "cuda" (see
	// PickBackend).
	Device string
	// Hub configures resolution of hub ids; nil: HubOptions(Logger).
	Hub *hub.Options
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
	// Artifacts accepts an lmpack artifact (.lmpk, see model.IsArtifact) as
	// MODEL; the Engine then has Artifact set and Checkpoint nil. Callers
	// that need the checkpoint leave it false and get an error naming the
	// artifact.
	Artifacts bool
	// ConvertPerBlock loads a checkpoint's decoder-block weights with
	// runtime.LoadOptions.ConvertPerBlock (CPU backend): memory holds the
	// mapped checkpoint and one block's float32 weights, and every Forward
	// converts the blocks' weights again (for prefill-only work such as
	// calibration).
	ConvertPerBlock bool
	// DequantizeWeights loads with runtime.LoadOptions.DequantizeWeights
	// (CPU backend; --dequantize): every weight as a float32 copy, packed
	// quantized and BF16/F16 weights included, instead of used in place.
	DequantizeWeights bool
}

// Engine is an opened model: its description, checkpoint (or artifact),
// tokenizer and the loaded runtime model. Dir is the checkpoint directory
// or the artifact's path.
type Engine struct {
	Dir        string
	Desc       *arch.Description
	Checkpoint *safetensors.Checkpoint
	// Artifact is set, and Checkpoint nil, when MODEL was an artifact.
	Artifact  *pack.Reader
	Tokenizer *tokenizer.Tokenizer
	// Model is the loaded model. For an artifact with a KV scheme its
	// NewCache returns that scheme's cache (KVCache names it).
	Model runtime.Model
	// KVCache is the runtime/kvcache method of an artifact's KV scheme;
	// empty for the float32 cache.
	KVCache string
}

// Open resolves and opens the checkpoint name (model.Open, checked by
// model.CheckUnused), loads its tokenizer (model.LoadTokenizer) and loads
// its weights on the backend opt.Device selects (PickBackend). Errors name
// the file and what was wrong.
//
// With opt.Artifacts and an artifact as name (model.IsArtifact), it loads the manifest's
// model, the embedded tokenizer and the tensors (CRC-checked as they are
// read) with the manifest's KV-cache scheme, and fails when that scheme
// does not build or a manifest tensor (a KV rotation included) goes
// unused.
func Open(ctx context.Context, name string, opt Options) (*Engine, error) {
	if opt.Artifacts && model.IsArtifact(name) {
		return openArtifactEngine(ctx, name, opt)
	}
	h := opt.Hub
	if h == nil {
		h = model.HubOptions(opt.Logger)
	}
	dir, d, ck, err := model.Open(ctx, name, h)
	if err != nil {
		return nil, err
	}
	if err := model.CheckUnused(dir, d, ck); err != nil {
		ck.Close()
		return nil, err
	}
	tok, err := model.LoadTokenizer(dir, d)
	if err != nil {
		ck.Close()
		return nil, err
	}
	t0 := time.Now()
	be, m, err := loadModelOpts(ctx, opt.Device, opt.Logger, d, ck, runtime.LoadOptions{Threads: opt.Threads, ConvertPerBlock: opt.ConvertPerBlock, DequantizeWeights: opt.DequantizeWeights}, "")
	if err != nil {
		ck.Close()
		return nil, err
	}
	if opt.Logger != nil {
		opt.Logger.Info("model loaded", "dir", dir, "architecture", d.Architecture, "layers", len(d.Layers), "device", be.Name(), "seconds", time.Since(t0).Seconds())
	}
	return &Engine{Dir: dir, Desc: d, Checkpoint: ck, Tokenizer: tok, Model: m}, nil
}

// Close releases the model and unmaps the checkpoint or the artifact.
func (e *Engine) Close() error {
	e.Model.Close()
	if e.Artifact != nil {
		return e.Artifact.Close()
	}
	return e.Checkpoint.Close()
}

// GenerateOptions configures Generate.
type GenerateOptions struct {
	MaxTokens   int     // tokens to generate (> 0)
	Temperature float64 // 0: greedy
	TopP        float64 // nucleus threshold; 0 or 1: off
	Seed        uint64
	// StopAtEOS ends generation at an end-of-sequence token (not emitted).
	StopAtEOS bool
	// Echo emits the prompt's text first: Decode of the prompt ids
	// (special tokens skipped), what the model reads, so that everything
	// emitted is Decode of prompt and generated ids together.
	Echo bool
}

// GenerateStats reports a generation: token counts and speeds (tokens/s).
type GenerateStats struct {
	PromptTokens    int     `json:"prompt_tokens"`
	GeneratedTokens int     `json:"generated_tokens"`
	PrefillTPS      float64 `json:"prefill_tokens_per_second"`
	DecodeTPS       float64 `json:"decode_tokens_per_second"`
	IDs             []int   `json:"ids"`
	// ContextLimited says generation stopped at the model's context
	// (prompt + MaxTokens would have exceeded it, and no EOS came first).
	ContextLimited bool `json:"context_limited,omitempty"`
}

// PromptIDs encodes a prompt with the tokenizer's special tokens (BOS for
// Llama-style tokenizers). The empty prompt is BOS alone. Errors: a prompt
// that is not valid UTF-8 (naming the first bad byte's offset, as
// ReadText does for data files); the empty prompt for a model without a
// BOS token.
func (e *Engine) PromptIDs(prompt string) ([]int, error) {
	if err := CheckPromptUTF8(prompt); err != nil {
		return nil, err
	}
	ids := e.Tokenizer.Encode(prompt, true)
	if prompt == "" {
		bos, ok := e.Tokenizer.BOS()
		if !ok && e.Desc.BOSTokenID >= 0 {
			bos, ok = e.Desc.BOSTokenID, true
		}
		if !ok {
			return nil, fmt.Errorf("engine: empty prompt and the model has no BOS token")
		}
		ids = []int{bos}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("engine: prompt encodes to no tokens")
	}
	return ids, nil
}

// CheckPromptUTF8 refuses a prompt that is not valid UTF-8, naming the
// byte offset of the first invalid byte (as ReadText does for data files).
func CheckPromptUTF8(prompt string) error {
	if off := fsx.FirstInvalidUTF8([]byte(prompt)); off >= 0 {
		return fmt.Errorf("engine: prompt is not valid UTF-8 (first bad byte at offset %d)", off)
	}
	return nil
}

// Generate runs the prompt and samples up to opt.MaxTokens tokens,
// calling emit with each newly completed piece of text (streaming). The
// generated text continues the prompt's: it is what Decode of prompt and
// generated ids adds after Decode of the prompt
// (tokenizer.NewStreamDecoderAfter), so a first generated " park" after
// "the" keeps its space, and only a generation that starts the text (an
// empty prompt, BOS alone) loses the leading space a SentencePiece
// decoder strips. With opt.Echo the prompt's decoded text is emitted
// first.
// It stops at the model's context (max_position_embeddings, or
// DefaultContextLimit when config.json gives none): at most context −
// prompt tokens are generated, and GenerateStats.ContextLimited says so.
// Errors: a prompt that fills the context.
func (e *Engine) Generate(ctx context.Context, prompt string, opt GenerateOptions, emit func(string) error) (*GenerateStats, error) {
	ids, err := e.PromptIDs(prompt)
	if err != nil {
		return nil, err
	}
	if opt.MaxTokens <= 0 {
		return nil, fmt.Errorf("engine: max tokens %d: want > 0", opt.MaxTokens)
	}
	limit := e.Desc.MaxPositionEmbeddings
	if limit <= 0 {
		limit = DefaultContextLimit
	}
	limited := false
	if len(ids) >= limit {
		return nil, fmt.Errorf("engine: prompt (%d tokens) fills the context limit %d (max_position_embeddings, or %d when config.json gives none); nothing can be generated",
			len(ids), limit, DefaultContextLimit)
	}
	if opt.MaxTokens > limit-len(ids) { // not len(ids)+MaxTokens: that can overflow
		opt.MaxTokens, limited = limit-len(ids), true
	}
	capacity := len(ids) + opt.MaxTokens
	if err := checkMemory(e.Desc, capacity, "prompt + --max-tokens"); err != nil {
		return nil, err
	}
	cache := e.Model.NewCache(capacity)
	logits := make([]float32, e.Desc.VocabSize)
	st := &GenerateStats{PromptTokens: len(ids), ContextLimited: limited}
	t0 := time.Now()
	if err := e.Model.Forward(ctx, ids, cache, logits, false); err != nil {
		return nil, err
	}
	st.PrefillTPS = float64(len(ids)) / time.Since(t0).Seconds()
	eos := map[int]bool{}
	for _, id := range e.Desc.EOSTokenIDs {
		eos[id] = true
	}
	if id, ok := e.Tokenizer.EOS(); ok {
		eos[id] = true
	}
	sampler := runtime.NewSampler(opt.Temperature, opt.TopP, opt.Seed)
	dec := e.Tokenizer.NewStreamDecoderAfter(ids, true)
	if opt.Echo && emit != nil {
		if s := e.Tokenizer.Decode(ids, true); s != "" {
			if err := emit(s); err != nil {
				return st, err
			}
		}
	}
	t1 := time.Now()
	tok := []int{0}
	for i := 0; i < opt.MaxTokens; i++ {
		if j := runtime.FirstNonFinite(logits); j >= 0 {
			return st, fmt.Errorf("engine: step %d: logit %d is %v: the forward pass overflowed (weights are finite; detected at first use)", i, j, logits[j])
		}
		next := sampler.Sample(logits)
		if opt.StopAtEOS && eos[next] {
			st.ContextLimited = false // it ended before the context did
			break
		}
		st.IDs = append(st.IDs, next)
		st.GeneratedTokens++
		if s := dec.Next(next); s != "" && emit != nil {
			if err := emit(s); err != nil {
				return st, err
			}
		}
		if i+1 == opt.MaxTokens {
			break
		}
		tok[0] = next
		if err := e.Model.Forward(ctx, tok, cache, logits, false); err != nil {
			return st, err
		}
	}
	if s := dec.Flush(); s != "" && emit != nil {
		if err := emit(s); err != nil {
			return st, err
		}
	}
	if st.GeneratedTokens > 1 {
		st.DecodeTPS = float64(st.GeneratedTokens-1) / time.Since(t1).Seconds()
	}
	return st, nil
}

// checkMemory refuses a KV cache of capacity tokens that would not fit in
// the memory the system reports available (MemAvailable in /proc/meminfo;
// no check where that is unknown), instead of dying in the allocator.
func checkMemory(d *arch.Description, capacity int, what string) error {
	need := runtime.F32CacheBytes(d, capacity)
	avail := memAvailable()
	if avail > 0 && need > avail {
		return fmt.Errorf("engine: %s of %d tokens needs a %.1f GiB KV cache, more than the %.1f GiB of memory available",
			what, capacity, float64(need)/(1<<30), float64(avail)/(1<<30))
	}
	return nil
}

// memAvailable returns MemAvailable from /proc/meminfo in bytes, or 0.
func memAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		var kb int64
		if n, _ := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	return 0
}

// DefaultContextLimit bounds prompt + generated tokens when config.json
// gives no max_position_embeddings.
const DefaultContextLimit = 32768

// EvalOptions configures EvalFile. Prompt and Chunk are
// eval.PerplexityOptions': Chunk 0 runs each window in one call, except
// for an artifact with a KV-cache scheme, which then runs decode-faithful
// with Chunk 1 (the window fed as generation feeds it).
type EvalOptions struct {
	Ctx           int
	MaxWindows    int
	Prompt, Chunk int
	Progress      func(done, total int)
}

// EvalModel returns the model for KVQuant's fake-quantisation protocol
// (whole windows in one Forward call): e.Model, except for an artifact
// with a KV-cache scheme on the CPU, whose caches then read every token —
// a call's own included — as stored (kvcache.NewFakeQuant), as eval --kv
// --kv-protocol fake-quant measures a cache; the runtime alone would
// attend a window's tokens through their fresh float32 K/V and report the
// float32-KV logits. EvalFile and compress's gate measure decode-faithful
// through e.Model instead.
func (e *Engine) EvalModel() runtime.Model {
	if km, ok := e.Model.(*kvModel); ok {
		fq := *km
		fq.fakeQuant = true
		return &fq
	}
	return e.Model
}

// EvalFile tokenizes the text file as one string with BOS prepended and
// computes perplexity over non-overlapping windows (eval.Perplexity). An
// artifact with a KV-cache scheme is measured decode-faithful
// (eval.TeacherForce through its own caches: opt.Prompt tokens in one
// call, then opt.Chunk tokens per call, Chunk 0 meaning 1), so that
// every position reads earlier tokens as the cache stores them, as in
// generation; a checkpoint's float32 cache runs each window in one call
// unless opt.Chunk is set.
func (e *Engine) EvalFile(ctx context.Context, path string, opt EvalOptions) (*eval.PerplexityResult, error) {
	ids, err := e.EvalIDs(path, opt.Ctx)
	if err != nil {
		return nil, err
	}
	po := eval.PerplexityOptions{Ctx: opt.Ctx, MaxWindows: opt.MaxWindows, Prompt: opt.Prompt, Chunk: opt.Chunk, Progress: opt.Progress}
	if _, ok := e.Model.(*kvModel); ok && po.Chunk == 0 {
		po.Chunk = 1
	}
	res, err := eval.Perplexity(ctx, e.Model, ids, po)
	if err != nil {
		return nil, fmt.Errorf("engine: data file %s: %w", path, err)
	}
	return res, nil
}

// EvalIDs reads the text file and tokenizes it as one string with BOS
// prepended, after checking ctx against the model's context and memory.
func (e *Engine) EvalIDs(path string, ctxLen int) ([]int, error) {
	text, err := fsx.ReadText(path)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if mp := e.Desc.MaxPositionEmbeddings; mp > 0 && ctxLen > mp {
		return nil, fmt.Errorf("engine: --ctx %d exceeds the model's max_position_embeddings %d", ctxLen, mp)
	}
	if err := checkMemory(e.Desc, ctxLen, "--ctx"); err != nil {
		return nil, err
	}
	ids := e.Tokenizer.Encode(text, true)
	bos, ok := e.Tokenizer.BOS()
	if !ok && e.Desc.BOSTokenID >= 0 {
		bos, ok = e.Desc.BOSTokenID, true
	}
	if ok && (len(ids) == 0 || ids[0] != bos) {
		ids = append([]int{bos}, ids...)
	}
	return ids, nil
}

var _ io.Closer = (*Engine)(nil)
