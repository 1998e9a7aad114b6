package compress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/lmpack/lmpack/formats/arch"
)

// Options configures Run.
type Options struct {
	// Model is the source checkpoint: a directory or a Hugging Face hub id
	// (model.Resolve). It is only read.
	Model string
	// Recipe is the validated recipe (LoadRecipe, ParseRecipe).
	Recipe *Recipe
	// RecipePath labels the recipe in the report.
	RecipePath string
	// Out is the artifact to write (.lmpk), atomically, when every stage
	// and the eval gate passed.
	Out string
	// WorkDir holds the stage cache; empty means Out + ".work". It is
	// created when missing; an existing directory must be empty or an
	// lmpack work directory (see the package doc).
	WorkDir string
	// Data and EvalData override the recipe's calibrate.data and
	// eval.data paths when set.
	Data, EvalData string
	// Threads is the CPU worker count; <= 0 means all cores.
	Threads int
	// Version is the lmpack version: recorded in outputs and part of
	// every cache key.
	Version string
	// Logger receives one line per stage (started, cached, finished); nil
	// discards them.
	Logger *slog.Logger
	// Progress, when set, is called with the stage name and its progress
	// (calibrate, quantize-kv, prune-width:calibrate and
	// quantize-weights:calibrate: tokens forwarded; quantize-weights: decoder blocks; eval: windows).
	Progress func(stage string, done, total int)
}

// StageReport is one stage of a Report. Key is the stage's cache key (hex
// sha256); Cached says the stage was reused from the work directory;
// Seconds is the time it took in this run and ComputeSeconds the time it
// took when computed; Result is the stage's own summary (calibrate.Summary,
// prune.Report, the KV stage's summary, pack.Stats without the section
// list, EvalResult).
type StageReport struct {
	Name           string          `json:"name"`
	Key            string          `json:"key"`
	Cached         bool            `json:"cached"`
	Seconds        float64         `json:"seconds"`
	ComputeSeconds float64         `json:"compute_seconds"`
	Result         json.RawMessage `json:"result"`
}

// Sizes compares the artifact with the source checkpoint. Bytes are file
// or tensor bytes; Params count model weights as lmpack inspect does (KV
// rotations, a tied lm_head copy and RoPE buffers excluded; a quantized
// weight counts its logical rows × cols). BitsPerWeight = 8 ·
// (raw bytes of the artifact's model tensors, a quantized weight's codes,
// scales, zero-points and permutation included) / Params; FileBitsPerSourceWeight = 8 · ArtifactBytes / SourceParams;
// Ratio = SourceTensorBytes / ArtifactBytes. LZ4SavedBytes is raw minus
// stored bytes over all sections (what lz4 saved).
type Sizes struct {
	SourceTensorBytes       int64   `json:"source_tensor_bytes"`
	SourceParams            int64   `json:"source_params"`
	ArtifactBytes           int64   `json:"artifact_bytes"`
	Params                  int64   `json:"params"`
	BitsPerWeight           float64 `json:"bits_per_weight"`
	FileBitsPerSourceWeight float64 `json:"file_bits_per_source_weight"`
	Ratio                   float64 `json:"ratio"`
	LZ4SavedBytes           int64   `json:"lz4_saved_bytes"`
}

// Report is Run's final JSON report.
type Report struct {
	Model            string `json:"model"`
	Recipe           string `json:"recipe"`
	RecipeName       string `json:"recipe_name,omitempty"`
	Out              string `json:"out"`
	Written          bool   `json:"written"`
	WorkDir          string `json:"work_dir"`
	ModelFingerprint string `json:"model_fingerprint"`
	DataFingerprint  string `json:"data_fingerprint,omitempty"`
	EvalFingerprint  string `json:"eval_data_fingerprint,omitempty"`
	// SHA256 is the artifact file's sha256 (what sha256sum prints);
	// ContentSHA256 the hash its header stores (docs/FORMAT.md).
	SHA256        string        `json:"sha256"`
	ContentSHA256 string        `json:"content_sha256"`
	Stages        []StageReport `json:"stages"`
	Sizes         Sizes         `json:"sizes"`
	// KVCache is the artifact's KV cache method ("fp32" when none) and
	// KVBitsPerElement its storage at the eval context,
	// KVBitsPerElementServing at KVServingCtx tokens (from the eval stage,
	// EvalResult; 0 without one).
	KVCache                 string  `json:"kv_cache"`
	KVBitsPerElement        float64 `json:"kv_bits_per_element,omitempty"`
	KVServingCtx            int     `json:"kv_serving_ctx,omitempty"`
	KVBitsPerElementServing float64 `json:"kv_bits_per_element_serving,omitempty"`
	// WeightsMethod and WeightsBitsPerWeight describe the quantize-weights
	// stage ("" and 0 without one): the method and the storage bits per
	// quantized weight (codes, scales, zero-points, permutations).
	WeightsMethod        string  `json:"weights_method,omitempty"`
	WeightsBitsPerWeight float64 `json:"weights_bits_per_weight,omitempty"`
	// ExpertBitsPerWeight is the storage bits per routed-expert weight
	// under a moe_budget (GEMQ); 0 otherwise.
	ExpertBitsPerWeight float64     `json:"expert_bits_per_weight,omitempty"`
	Eval                *EvalResult `json:"eval,omitempty"`
	Gate                *Gate       `json:"gate,omitempty"`
	Seconds             float64     `json:"seconds"`
}

// stage is one step of the pipeline: params is the recipe's contribution
// to its cache key; run writes its files into dir; report, when set,
// copies the stage's result (its done.json record, fresh or cached) into
// the final report. Each stage's file (stage_*.go) builds its stage.
type stage struct {
	name   string
	params []byte
	run    func(ctx context.Context, dir string) (outputs, any, error)
	report func(rep *Report, result json.RawMessage) error
}

// pipeline is one Run.
type pipeline struct {
	opt              Options
	r                *Recipe
	data, evalData   string
	srcDir           string
	desc             *arch.Description // the source model's
	srcFP            string
	dataFP, evalFP   string
	st               state
	work             string
	packedRecipeJSON []byte
	// invalidated is set once a cached stage failed validation and was
	// recomputed: every later stage is recomputed too.
	invalidated bool
}

// keyVersion changes when a stage's outputs change meaning.
const keyVersion = "lmpack-compress/1"

// Run is `lmpack compress`: it runs the recipe's stages over opt.Model
// with the work directory as cache (see the package doc), writes the
// artifact to opt.Out atomically when the eval gate passes, and returns
// the report. The source model and data files are never modified.
//
// Errors: ErrRecipe for data files the recipe needs and lacks; the work
// directory in use by another compress (it is locked), or a non-empty
// directory that is not a work directory (naming it and an entry); stage errors
// (wrapped with the stage name); ErrGate (with the report) when ΔPPL or
// KL exceeds the recipe's bounds; ctx cancelled (the stage in progress
// is recomputed by the next run).
func Run(ctx context.Context, opt Options) (*Report, error) {
	t0 := time.Now()
	if opt.Recipe == nil {
		return nil, fmt.Errorf("%w: no recipe", ErrRecipe)
	}
	if opt.Out == "" {
		return nil, fmt.Errorf("compress: no output path")
	}
	p := &pipeline{opt: opt, r: opt.Recipe}
	if p.opt.WorkDir == "" {
		p.opt.WorkDir = opt.Out + ".work"
	}
	if err := p.inputs(ctx); err != nil {
		return nil, err
	}
	if err := p.checkPaths(); err != nil {
		return nil, err
	}
	if err := prepareWorkDir(p.opt.WorkDir); err != nil {
		return nil, err
	}
	p.work = p.opt.WorkDir
	unlock, err := lockDir(p.work)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := markWorkDir(p.work); err != nil {
		return nil, err
	}
	if err := removeStale(p.work); err != nil {
		return nil, err
	}
	rep := &Report{Model: opt.Model, Recipe: opt.RecipePath, RecipeName: p.r.Name, Out: opt.Out, WorkDir: p.work,
		ModelFingerprint: p.srcFP, DataFingerprint: p.dataFP, EvalFingerprint: p.evalFP, KVCache: "fp32"}
	key := chain(keyVersion, opt.Version, p.srcFP, p.dataFP)
	for _, s := range p.stages() {
		key = chain(key, s.name, string(s.params))
		sr, err := p.runStage(ctx, s, key)
		if err != nil {
			return nil, err
		}
		rep.Stages = append(rep.Stages, *sr)
		if s.report != nil {
			if err := s.report(rep, sr.Result); err != nil {
				return nil, fmt.Errorf("compress: %s stage record: %w", s.name, err)
			}
		}
	}
	if p.st.kvName != "" {
		rep.KVCache = p.st.kvName
	}
	if err := p.sizes(rep); err != nil {
		return nil, err
	}
	gateErr := p.gate(rep)
	if gateErr == nil {
		if err := copyAtomic(p.st.artifact, opt.Out); err != nil {
			return nil, err
		}
		rep.Written = true
	}
	rep.Seconds = time.Since(t0).Seconds()
	return rep, gateErr
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// chain is the hex sha256 of the NUL-separated parts.
func chain(parts ...string) string {
	h := sha256.New()
	for _, s := range parts {
		io.WriteString(h, s)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// stages lists the enabled stages in order; each stage's cache-key
// params, run and report hook are in its stage_*.go file.
func (p *pipeline) stages() []stage {
	r := p.r
	var out []stage
	if r.Calibrate != nil {
		out = append(out, p.calibrateStage())
	}
	if r.Prune != nil && r.Prune.wantsDepth() {
		out = append(out, p.pruneLayersStage())
	}
	if r.Prune != nil && r.Prune.wantsWidth() {
		out = append(out, p.pruneWidthStage())
	}
	if r.Quantize != nil && r.Quantize.Weights != nil {
		out = append(out, p.quantizeWeightsStage())
	}
	if r.Quantize != nil && r.Quantize.KV != nil {
		out = append(out, p.quantizeKVStage())
	}
	out = append(out, p.packStage())
	if r.Eval != nil {
		out = append(out, p.evalStage())
	}
	return out
}

// progress returns the Options.Progress callback bound to a stage.
func (p *pipeline) progress(name string) func(done, total int) {
	if p.opt.Progress == nil {
		return nil
	}
	return func(done, total int) { p.opt.Progress(name, done, total) }
}

// section returns the canonical JSON of v (a recipe section, data paths
// and gate thresholds excluded by their json:"-" tags): the part of a
// stage's cache key the recipe contributes.
func section(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("compress: recipe section %T does not marshal: %v", v, err))
	}
	return b
}
