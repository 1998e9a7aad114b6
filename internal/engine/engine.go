// Package engine opens a model directory for the CLI: it resolves the
// MODEL argument (a local directory or a Hugging Face hub id), parses
// config.json, opens the safetensors checkpoint and the tokenizer, and
// loads the weights on a runtime backend. It also holds the text
// generation loop and the inspect report, so cmd/lmpack only parses flags.
package engine

import (
	"context"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/internal/hub"
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
	// Artifacts accepts an lmpack artifact (.lmpk, see IsArtifact) as
	// MODEL; the Engine then has Artifact set and Checkpoint nil. Callers
	// that need the checkpoint leave it false and get an error naming the
	// artifact.
	Artifacts bool
}

// Engine is an opened model: its description, checkpoint (or artifact),
// tokenizer and the loaded runtime model. Dir is the checkpoint directory
// or the artifact's path.
type Engine struct {
	Dir        string
	Desc       *arch.Description
	Checkpoint *safetensors.Checkpoint
	// Artifact is set, and Checkpoint nil, when MODEL was an artifact.
	Artifact  Artifact
	Tokenizer *tokenizer.Tokenizer
	// Model is the loaded model. For an artifact with a KV scheme its
	// NewCache returns that scheme's cache (KVCache names it).
	Model runtime.Model
	// KVCache is the runtime/kvcache method of an artifact's KV scheme;
	// empty for the float32 cache.
	KVCache string
}

// Resolve turns a MODEL argument into a local directory, downloading a hub
// id into the Hugging Face cache when it is absent; h nil means
// HubOptions(nil). Errors: those of hub.Resolve.
func Resolve(ctx context.Context, model string, h *hub.Options) (string, error) {
	if st, err := os.Stat(model); err == nil && st.IsDir() {
		return model, nil
	} else if err == nil {
		return "", fileModelError(model)
	}
	// A path whose parent exists locally (./x, /x, dir/x with dir present)
	// is a mistyped directory, not a hub id.
	if filepath.IsAbs(model) || strings.HasPrefix(model, ".") || dirExists(filepath.Dir(model)) && filepath.Dir(model) != "." {
		return "", fmt.Errorf("engine: MODEL %q: no such directory", model)
	}
	if strings.HasSuffix(model, ".lmpk") {
		return "", fmt.Errorf("engine: MODEL %q: no such artifact file", model)
	}
	if h == nil {
		h = HubOptions(nil)
	}
	return hub.Resolve(ctx, model, *h)
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// HubOptions returns hub.OptionsFromEnv with download progress on stderr
// (a bar on a terminal, else log lines) and the hub's log lines sent to
// logger, so they follow --log-format; a nil logger leaves the hub's
// default (text lines on stderr).
func HubOptions(logger *slog.Logger) *hub.Options {
	o := hub.OptionsFromEnv()
	o.Progress = os.Stderr
	o.Terminal = hub.IsTerminal(os.Stderr)
	o.Logger = logger
	return &o
}

// OpenCheckpoint resolves model and opens its description and checkpoint
// without loading weights (for inspect).
func OpenCheckpoint(ctx context.Context, model string, h *hub.Options) (string, *arch.Description, *safetensors.Checkpoint, error) {
	dir, err := Resolve(ctx, model, h)
	if err != nil {
		return "", nil, nil, err
	}
	d, err := arch.Load(dir)
	if err != nil {
		return "", nil, nil, err
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return "", nil, nil, err
	}
	return dir, d, ck, nil
}

// Open resolves model, reads its config, tokenizer and weights, and loads
// it on the CPU backend. Errors name the file and what was wrong.
//
// With opt.Artifacts and an artifact as model, it loads the manifest's
// model, the embedded tokenizer and the tensors (CRC-checked as they are
// read) with the manifest's KV-cache scheme, and fails when that scheme
// does not build or a manifest tensor (a KV rotation included) goes
// unused.
func Open(ctx context.Context, model string, opt Options) (*Engine, error) {
	if opt.Artifacts && IsArtifact(model) {
		return openArtifactEngine(ctx, model, opt)
	}
	h := opt.Hub
	if h == nil {
		h = HubOptions(opt.Logger)
	}
	dir, d, ck, err := OpenCheckpoint(ctx, model, h)
	if err != nil {
		return nil, err
	}
	if err := checkUnused(dir, d, ck); err != nil {
		ck.Close()
		return nil, err
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		ck.Close()
		return nil, fmt.Errorf("engine: %s: %w", dir, err)
	}
	if tok.VocabSize() > d.VocabSize {
		ck.Close()
		return nil, fmt.Errorf("engine: %s: tokenizer has %d tokens but vocab_size is %d", dir, tok.VocabSize(), d.VocabSize)
	}
	t0 := time.Now()
	be, m, err := loadModel(ctx, opt.Device, opt.Logger, d, ck, opt.Threads, "")
	if err != nil {
		ck.Close()
		return nil, err
	}
	if opt.Logger != nil {
		opt.Logger.Info("model loaded", "dir", dir, "architecture", d.Architecture, "layers", len(d.Layers), "device", be.Name(), "seconds", time.Since(t0).Seconds())
	}
	return &Engine{Dir: dir, Desc: d, Checkpoint: ck, Tokenizer: tok, Model: m}, nil
}

// CheckCheckpoint checks, without loading weights, that the checkpoint
// in dir and its description d agree: every tensor d names
// (StorageShapes: quantized weights by their storage tensors) is present
// with that shape, and no tensor is left over (checkUnused). Commands
// that rewrite checkpoints (prune) call it so that they never write a
// checkpoint the runtime cannot load. Errors name dir, the tensor, its
// shape and the expected one; safetensors.ErrMissingTensor is wrapped for
// a missing tensor.
func CheckCheckpoint(dir string, d *arch.Description, ck *safetensors.Checkpoint) error {
	want := d.StorageShapes()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		info, _, err := ck.Info(n)
		if err != nil {
			if n == d.LMHead && d.TieWordEmbeddings {
				continue
			}
			return fmt.Errorf("engine: %s: config.json and the weights disagree: %w", dir, err)
		}
		if !slices.Equal(info.Shape, want[n]) {
			return fmt.Errorf("engine: %s: config.json and the weights disagree: tensor %q has shape %v, config.json implies %v", dir, n, info.Shape, want[n])
		}
	}
	return checkUnused(dir, d, ck)
}

// checkUnused fails when the checkpoint holds tensors config.json does not
// describe (a config that disagrees with the weights, say fewer layers):
// running such a model would silently give wrong results. A tied lm_head
// stored explicitly and RoPE inv_freq buffers are not counted.
func checkUnused(dir string, d *arch.Description, ck *safetensors.Checkpoint) error {
	want := d.StorageShapes() // quantized weights: their qweight/scales/... tensors
	var extra []string
	for _, n := range ck.Names() {
		if _, ok := want[n]; ok || (n == d.LMHead && d.TieWordEmbeddings) || strings.HasSuffix(n, "rotary_emb.inv_freq") {
			continue
		}
		extra = append(extra, n)
	}
	if len(extra) > 0 {
		return fmt.Errorf("engine: %s: the checkpoint has %d tensors config.json does not describe (first %q); config.json and the weights disagree",
			dir, len(extra), extra[0])
	}
	return nil
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
}

// GenerateStats reports a generation: token counts and speeds (tokens/s).
type GenerateStats struct {
	PromptTokens    int     `json:"prompt_tokens"`
	GeneratedTokens int     `json:"generated_tokens"`
	PrefillTPS      float64 `json:"prefill_tokens_per_second"`
	DecodeTPS       float64 `json:"decode_tokens_per_second"`
	IDs             []int   `json:"ids"`
	// ContextLimited says generation stopped at the model's context
	// (prompt + MaxTokens would have exceeded it).
	ContextLimited bool `json:"context_limited,omitempty"`
}

// PromptIDs encodes a prompt with the tokenizer's special tokens (BOS for
// Llama-style tokenizers). The empty prompt is BOS alone. Errors: the
// empty prompt for a model without a BOS token.
func (e *Engine) PromptIDs(prompt string) ([]int, error) {
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

// Generate runs the prompt and samples up to opt.MaxTokens tokens,
// calling emit with each newly completed piece of text (streaming). It
// stops at the model's context (max_position_embeddings, or
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
	dec := e.Tokenizer.NewStreamDecoder(true)
	t1 := time.Now()
	tok := []int{0}
	for i := 0; i < opt.MaxTokens; i++ {
		if j := firstNonFinite(logits); j >= 0 {
			return st, fmt.Errorf("engine: step %d: logit %d is %v: the forward pass overflowed (weights are finite; detected at first use)", i, j, logits[j])
		}
		next := sampler.Sample(logits)
		if opt.StopAtEOS && eos[next] {
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

func firstNonFinite(v []float32) int {
	for i, x := range v {
		if x-x != 0 {
			return i
		}
	}
	return -1
}

// ReadText reads a UTF-8 text file for evaluation. Errors: unreadable,
// empty, or not valid UTF-8 (naming the byte offset).
func ReadText(path string) (string, error) {
	b, err := fsx.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("engine: data file: %w", err)
	}
	if len(b) == 0 {
		return "", fmt.Errorf("engine: data file %s is empty", path)
	}
	if !utf8.Valid(b) {
		off := 0
		for off < len(b) {
			r, n := utf8.DecodeRune(b[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return "", fmt.Errorf("engine: data file %s is not valid UTF-8 (first bad byte at offset %d)", path, off)
	}
	return string(b), nil
}

// EvalOptions configures EvalFile.
type EvalOptions struct {
	Ctx        int
	MaxWindows int
	Progress   func(done, total int)
}

// EvalFile tokenizes the text file as one string with BOS prepended and
// computes perplexity over non-overlapping windows (eval.Perplexity).
func (e *Engine) EvalFile(ctx context.Context, path string, opt EvalOptions) (*eval.PerplexityResult, error) {
	ids, err := e.EvalIDs(path, opt.Ctx)
	if err != nil {
		return nil, err
	}
	res, err := eval.Perplexity(ctx, e.Model, ids, eval.PerplexityOptions{Ctx: opt.Ctx, MaxWindows: opt.MaxWindows, Progress: opt.Progress})
	if err != nil {
		return nil, fmt.Errorf("engine: data file %s: %w", path, err)
	}
	return res, nil
}

// EvalIDs reads the text file and tokenizes it as one string with BOS
// prepended, after checking ctx against the model's context and memory.
func (e *Engine) EvalIDs(path string, ctxLen int) ([]int, error) {
	text, err := ReadText(path)
	if err != nil {
		return nil, err
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
