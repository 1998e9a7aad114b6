package compress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/quantize/gemq"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/quantize/wquant"
)

// Options configures Run.
type Options struct {
	// Model is the source checkpoint: a directory or a Hugging Face hub id
	// (engine.Resolve). It is only read.
	Model string
	// Recipe is the validated recipe (LoadRecipe, ParseRecipe).
	Recipe *Recipe
	// RecipePath labels the recipe in the report.
	RecipePath string
	// Out is the artifact to write (.lmpk), atomically, when every stage
	// and the eval gate passed.
	Out string
	// WorkDir holds the stage cache; empty means Out + ".work".
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

// Gate is the eval gate's outcome: the thresholds (0: no bound) and the
// failures, one sentence each.
type Gate struct {
	MaxDeltaPPL float64  `json:"max_delta_ppl"`
	MaxKL       float64  `json:"max_kl"`
	Passed      bool     `json:"passed"`
	Failures    []string `json:"failures,omitempty"`
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
	// KVBitsPerElement its storage (from the eval stage; 0 without one).
	KVCache          string  `json:"kv_cache"`
	KVBitsPerElement float64 `json:"kv_bits_per_element,omitempty"`
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

// outputs are the files a stage produced (paths relative to its
// directory in done.json) and what it changes in the pipeline state.
type outputs struct {
	Model       string `json:"model,omitempty"`
	Calib       string `json:"calib,omitempty"`
	ClearCalib  bool   `json:"clear_calib,omitempty"`
	KVRotations string `json:"kv_rotations,omitempty"`
	KVCache     string `json:"kv_cache,omitempty"`
	KVSink      int    `json:"kv_sink,omitempty"`
	KVRecent    int    `json:"kv_recent,omitempty"`
	Artifact    string `json:"artifact,omitempty"`
}

// present reports whether every output file or directory exists in dir
// (a finished stage whose files were deleted is recomputed).
func (o outputs) present(dir string) bool {
	for _, p := range []string{o.Model, o.Calib, o.KVRotations, o.Artifact} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			return false
		}
	}
	return true
}

// validate checks that a cached stage's outputs in dir are usable: an
// artifact passes pack.Verify (every CRC-32C and the whole-file sha256);
// a model directory's config.json parses and agrees with its tensors
// (engine.CheckCheckpoint, which also catches a deleted or truncated
// shard); calibration and rotation files open as safetensors. The error
// names the file and what is wrong.
func (o outputs) validate(dir string) error {
	if o.Artifact != "" {
		if _, err := pack.Verify(filepath.Join(dir, o.Artifact)); err != nil {
			return err
		}
	}
	if o.Model != "" {
		m := filepath.Join(dir, o.Model)
		d, err := arch.Load(m)
		if err != nil {
			return err
		}
		ck, err := safetensors.OpenDir(m)
		if err != nil {
			return err
		}
		err = engine.CheckCheckpoint(m, d, ck)
		ck.Close()
		if err != nil {
			return err
		}
	}
	for _, f := range []string{o.Calib, o.KVRotations} {
		if f == "" {
			continue
		}
		ck, err := safetensors.OpenPath(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		ck.Close()
	}
	return nil
}

// record is a stage's completion marker, done.json, written last.
type record struct {
	Stage   string          `json:"stage"`
	Key     string          `json:"key"`
	Seconds float64         `json:"seconds"`
	Outputs outputs         `json:"outputs"`
	Result  json.RawMessage `json:"result"`
}

// state is what the stages hand on: absolute paths.
type state struct {
	model, calib  string
	kvRot, kvName string
	kvSink        int
	kvRecent      int
	artifact      string
}

func (s *state) apply(dir string, o outputs) {
	abs := func(p string) string { return filepath.Join(dir, p) }
	if o.ClearCalib {
		s.calib = ""
	}
	if o.Model != "" {
		s.model = abs(o.Model)
	}
	if o.Calib != "" {
		s.calib = abs(o.Calib)
	}
	if o.KVCache != "" {
		s.kvName, s.kvSink, s.kvRecent, s.kvRot = o.KVCache, o.KVSink, o.KVRecent, ""
		if o.KVRotations != "" {
			s.kvRot = abs(o.KVRotations)
		}
	}
	if o.Artifact != "" {
		s.artifact = abs(o.Artifact)
	}
}

// stage is one step of the pipeline: params is the recipe's contribution
// to its cache key; run writes its files into dir.
type stage struct {
	name   string
	params []byte
	run    func(ctx context.Context, dir string) (outputs, any, error)
}

// pipeline is one Run.
type pipeline struct {
	opt              Options
	r                *Recipe
	data, evalData   string
	srcDir           string
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
// directory in use by another compress (it is locked); stage errors
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
	if err := os.MkdirAll(p.opt.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("compress: work dir: %w", err)
	}
	p.work = p.opt.WorkDir
	unlock, err := lockDir(p.work)
	if err != nil {
		return nil, err
	}
	defer unlock()
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
		if s.name == "quantize-weights" {
			var ws weightsSummary
			if err := json.Unmarshal(sr.Result, &ws); err != nil {
				return nil, fmt.Errorf("compress: quantize-weights stage record: %w", err)
			}
			rep.WeightsMethod, rep.WeightsBitsPerWeight = ws.Method, ws.BitsPerWeight
			rep.ExpertBitsPerWeight = ws.ExpertBitsPerWeight
		}
		if s.name == "eval" {
			var ev EvalResult
			if err := json.Unmarshal(sr.Result, &ev); err != nil {
				return nil, fmt.Errorf("compress: eval stage record: %w", err)
			}
			rep.Eval = &ev
			rep.KVBitsPerElement = ev.KVBitsPerElement
		}
	}
	if p.st.kvName != "" {
		rep.KVCache = p.st.kvName
	}
	if err := p.sizes(rep); err != nil {
		return nil, err
	}
	var gateErr error
	if e := p.r.Eval; e != nil {
		g := &Gate{MaxDeltaPPL: e.MaxDeltaPPL, MaxKL: e.MaxKL}
		if e.MaxDeltaPPL > 0 && !(rep.Eval.DeltaPPL <= e.MaxDeltaPPL) {
			g.Failures = append(g.Failures, fmt.Sprintf("ΔPPL %.4f exceeds max_delta_ppl %g", rep.Eval.DeltaPPL, e.MaxDeltaPPL))
		}
		if e.MaxKL > 0 && !(rep.Eval.KL <= e.MaxKL) {
			g.Failures = append(g.Failures, fmt.Sprintf("KL %.5f exceeds max_kl %g", rep.Eval.KL, e.MaxKL))
		}
		g.Passed = len(g.Failures) == 0
		rep.Gate = g
		if !g.Passed {
			older := ""
			if _, err := os.Lstat(opt.Out); err == nil {
				older = fmt.Sprintf("; an older file at %s is left unchanged", opt.Out)
			}
			gateErr = fmt.Errorf("%w: %s; %s not written%s (the new artifact stays in %s)", ErrGate, strings.Join(g.Failures, "; "), opt.Out, older, p.st.artifact)
		}
	}
	if gateErr == nil {
		if err := copyAtomic(p.st.artifact, opt.Out); err != nil {
			return nil, err
		}
		rep.Written = true
	}
	rep.Seconds = time.Since(t0).Seconds()
	return rep, gateErr
}

// inputs resolves the model and data files and fingerprints them.
func (p *pipeline) inputs(ctx context.Context) error {
	dir, err := engine.Resolve(ctx, p.opt.Model, nil)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer ck.Close()
	if p.srcFP, err = calibrate.ModelFingerprint(dir, ck); err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	p.srcDir = dir
	p.st.model = dir
	recipe := cmpOr(p.opt.RecipePath, "the recipe")
	// Settings that only fit some models are checked before any stage
	// runs, so a mistake costs no calibration.
	wantsWidth := p.r.Prune != nil && p.r.Prune.wantsWidth()
	{
		d, err := arch.Load(dir)
		if err != nil {
			return fmt.Errorf("compress: %w", err)
		}
		if err := p.r.checkModel(recipe, d); err != nil {
			return err
		}
		q := p.r.Quantize
		moe := false
		for _, l := range d.Layers {
			moe = moe || l.MoE != nil
		}
		if wantsWidth {
			if moe {
				return fmt.Errorf("%w: %s: prune.%s: %s is a mixture-of-experts model; width pruning (head_groups, head_ratio, ffn_ratio) supports dense models only (layers or layer_ratio work on MoE models)",
					ErrRecipe, recipe, p.r.Prune.widthKey(), dir)
			}
			if err := p.r.Prune.checkHeadBudget(recipe, afterDepth(p.r.Prune, d)); err != nil {
				return err
			}
			// A sparsity on the model as it is (no layer removal first):
			// its budget, and whether it removes any head for head_refit.
			if c := p.r.Prune; c.Sparsity != 0 && !c.wantsDepth() {
				plan, err := prune.PlanSparsity(dir, c.Sparsity)
				if err != nil {
					return fmt.Errorf("%w: %s: prune.sparsity: %w", ErrRecipe, recipe, err)
				}
				if c.HeadRefit && plan.HeadGroups == 0 {
					return fmt.Errorf("%w: %s: prune.head_refit: prune.sparsity %v removes no KV head group of %s (only FFN nodes), so there is no o_proj to refit: remove head_refit or raise the sparsity", ErrRecipe, recipe, c.Sparsity, dir)
				}
			}
		}
		var w WeightsStage
		if q != nil && q.Weights != nil {
			w = *q.Weights
		}
		switch {
		case w.MoEBudget > 0 && !moe:
			return fmt.Errorf("%w: %s: quantize.weights.moe_budget: %s is a dense model (no mixture-of-experts layer); remove moe_budget or use bits/target_bpw", ErrRecipe, recipe, dir)
		case w.TargetBPW > 0 && moe:
			return fmt.Errorf("%w: %s: quantize.weights.target_bpw: %s is a mixture-of-experts model; use bits with moe_budget for the experts", ErrRecipe, recipe, dir)
		}
	}
	// dataErr names where a data path came from: the override option or
	// the recipe's key.
	dataErr := func(override, key, path string, err error) error {
		if override != "" {
			return fmt.Errorf("compress: data file %s: %w", path, err)
		}
		return fmt.Errorf("%w: %s: %s %s: %v", ErrRecipe, recipe, key, path, err)
	}
	if c := p.r.Calibrate; c != nil {
		p.data = cmpOr(p.opt.Data, c.Data)
		if p.data == "" {
			return fmt.Errorf("%w: %s: the calibrate stage needs a data file (set calibrate.data in %s, or pass --data)", ErrRecipe, recipe, recipe)
		}
		if p.dataFP, err = fileFingerprint(p.data); err != nil {
			return dataErr(p.opt.Data, "calibrate.data", p.data, err)
		}
	}
	if e := p.r.Eval; e != nil {
		p.evalData = cmpOr(p.opt.EvalData, e.Data)
		if p.evalData == "" {
			return fmt.Errorf("%w: %s: the eval stage needs a data file (set eval.data in %s, or pass --eval-data)", ErrRecipe, recipe, recipe)
		}
		if p.evalFP, err = fileFingerprint(p.evalData); err != nil {
			return dataErr(p.opt.EvalData, "eval.data", p.evalData, err)
		}
	}
	return nil
}

// checkPaths refuses an output that is an input file and a work
// directory or output inside the source model directory (inputs are never
// modified).
func (p *pipeline) checkPaths() error {
	outSt, err := os.Stat(p.opt.Out)
	for _, in := range []string{p.data, p.evalData} {
		if in == "" || err != nil {
			continue
		}
		if inSt, ierr := os.Stat(in); ierr == nil && os.SameFile(inSt, outSt) {
			return fmt.Errorf("compress: output %s is the input %s; refusing to overwrite an input", p.opt.Out, in)
		}
	}
	model, err := fsx.RealAbs(p.srcDir)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	for _, x := range []struct{ what, path string }{{"work dir", p.opt.WorkDir}, {"output", filepath.Dir(p.opt.Out)}} {
		a, err := fsx.RealAbs(x.path)
		if err != nil {
			return fmt.Errorf("compress: %s: %w", x.what, err)
		}
		if a == model || strings.HasPrefix(a, model+string(filepath.Separator)) {
			return fmt.Errorf("compress: %s %s is inside the model directory %s; write elsewhere (inputs are never modified)", x.what, x.path, p.srcDir)
		}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// fileFingerprint is the hex sha256 of a regular file's bytes.
func fileFingerprint(path string) (string, error) {
	b, err := fsx.ReadFile(path)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
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

// stages lists the enabled stages in order. The pack stage's params are
// the recipe up to and including pack, which the artifact records as its
// provenance.
func (p *pipeline) stages() []stage {
	r := p.r
	var out []stage
	if r.Calibrate != nil {
		out = append(out, stage{"calibrate", section(r.Calibrate), p.calibrate})
	}
	if r.Prune != nil && r.Prune.wantsDepth() {
		out = append(out, stage{"prune-layers", r.Prune.depthParams(), p.prune})
	}
	if r.Prune != nil && r.Prune.wantsWidth() {
		out = append(out, stage{"prune-width", r.Prune.widthParams(), p.pruneWidth})
	}
	if r.Quantize != nil && r.Quantize.Weights != nil {
		out = append(out, stage{"quantize-weights", section(r.Quantize.Weights), p.quantizeWeights})
	}
	if r.Quantize != nil && r.Quantize.KV != nil {
		out = append(out, stage{"quantize-kv", section(r.Quantize.KV), p.quantizeKV})
	}
	packed := *r
	packed.Eval = nil
	p.packedRecipeJSON = section(&packed)
	out = append(out, stage{"pack", p.packedRecipeJSON, p.pack})
	if r.Eval != nil {
		out = append(out, stage{"eval", append(section(r.Eval), p.evalFP...), p.eval})
	}
	return out
}

// runStage reuses the stage's directory when its completion marker holds
// the key, and otherwise runs it in a temporary directory that is renamed
// into place after done.json is written.
func (p *pipeline) runStage(ctx context.Context, s stage, key string) (*StageReport, error) {
	t0 := time.Now()
	final := filepath.Join(p.work, s.name+"-"+key[:24])
	log := p.opt.Logger
	rec, err := readRecord(final)
	cached := err == nil && rec.Key == key && rec.Stage == s.name && rec.Outputs.present(final)
	if cached && p.invalidated {
		cached = false // an earlier stage was recomputed after a failed check
	}
	if cached {
		if verr := rec.Outputs.validate(final); verr != nil {
			cached, p.invalidated = false, true
			if log != nil {
				log.Warn("stage cache invalid; recomputing", "stage", s.name, "dir", final, "error", verr.Error())
			}
		}
	}
	if cached {
		p.st.apply(final, rec.Outputs)
		if log != nil {
			log.Info("stage cached", "stage", s.name, "key", key[:12], "dir", final)
		}
		return &StageReport{Name: s.name, Key: key, Cached: true, Seconds: time.Since(t0).Seconds(), ComputeSeconds: rec.Seconds, Result: rec.Result}, nil
	}
	if err := os.RemoveAll(final); err != nil {
		return nil, fmt.Errorf("compress: stage %s: %w", s.name, err)
	}
	if log != nil {
		log.Info("stage started", "stage", s.name, "key", key[:12])
	}
	// A failed or interrupted stage leaves nothing behind (after a kill
	// the next run removes the temporary directory: removeStale).
	var out outputs
	var rb []byte
	err = fsx.WriteDir(final, func(tmp string) error {
		o, res, err := s.run(ctx, tmp)
		if err != nil {
			return err
		}
		if rb, err = json.Marshal(res); err != nil {
			return fmt.Errorf("result: %w", err)
		}
		out = o
		rec = &record{Stage: s.name, Key: key, Seconds: time.Since(t0).Seconds(), Outputs: out, Result: rb}
		return writeRecord(tmp, rec)
	})
	if err != nil {
		return nil, fmt.Errorf("compress: stage %s: %w", s.name, err)
	}
	p.st.apply(final, out)
	if log != nil {
		log.Info("stage finished", "stage", s.name, "seconds", rec.Seconds)
	}
	return &StageReport{Name: s.name, Key: key, Seconds: rec.Seconds, ComputeSeconds: rec.Seconds, Result: rb}, nil
}

const doneFile = "done.json"

func readRecord(dir string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(dir, doneFile))
	if err != nil {
		return nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// writeRecord writes dir/done.json (fsx.WriteDir syncs it).
func writeRecord(dir string, r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, doneFile), append(b, '\n'), 0o644)
}

// lockDir takes an exclusive flock on dir/lock, so that two compress runs
// cannot share a work directory. Errors: the lock is held (naming dir).
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("compress: work dir: %w", err)
	}
	if err := fsx.TryLock(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("compress: work dir %s is in use by another lmpack compress (%v)", dir, err)
	}
	return func() {
		fsx.Unlock(f)
		f.Close()
	}, nil
}

// removeStale deletes temporary stage directories (fsx.WriteDir's) left
// by killed runs.
func removeStale(dir string) error {
	es, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("compress: work dir: %w", err)
	}
	for _, e := range es {
		if fsx.IsTemp(e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("compress: work dir: %w", err)
			}
		}
	}
	return nil
}

// copyAtomic copies src to dst atomically (fsx.WriteAtomic, mode 0644).
func copyAtomic(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer in.Close()
	if err := fsx.WriteAtomic(dst, 0o644, func(f *os.File) error {
		_, err := io.Copy(f, in)
		return err
	}); err != nil {
		return fmt.Errorf("compress: output %s: %w", dst, err)
	}
	return nil
}

// progress returns the Options.Progress callback bound to a stage.
func (p *pipeline) progress(name string) func(done, total int) {
	if p.opt.Progress == nil {
		return nil
	}
	return func(done, total int) { p.opt.Progress(name, done, total) }
}

// calibrate runs calibrate.Run on the current model.
func (p *pipeline) calibrate(ctx context.Context, dir string) (outputs, any, error) {
	c := p.r.Calibrate
	s, err := calibrate.Run(ctx, calibrate.Options{Model: p.st.model, Data: p.data, Tokens: c.Tokens, Ctx: c.Ctx,
		Out: filepath.Join(dir, "calib.safetensors"), Threads: p.opt.Threads, MaxExpertBytes: c.maxExpertBytes(), Version: p.opt.Version, Progress: p.progress("calibrate")})
	if err != nil {
		return outputs{}, nil, err
	}
	s.Path = "calib.safetensors"
	return outputs{Calib: "calib.safetensors"}, s, nil
}

// prune (the prune-layers stage) runs prune.Run's layer removal on the
// current model; the calibration no longer describes the pruned model, so
// later stages calibrate again.
func (p *pipeline) prune(ctx context.Context, dir string) (outputs, any, error) {
	c := p.r.Prune
	// prune.Run words its option errors for the CLI (--layers); check
	// the recipe's keys against the model first.
	if strings.HasPrefix(c.Method, "list:") && c.LayerRatio != 0 {
		d, err := arch.Load(p.st.model)
		if err != nil {
			return outputs{}, nil, err
		}
		list, _ := prune.ParseList(c.Method)
		if n, err := prune.LayerBudget(0, c.LayerRatio, len(d.Layers)); err != nil || n != len(list) {
			return outputs{}, nil, fmt.Errorf("%w: %s: prune.method %q removes %d layer(s), but prune.layer_ratio %v of %d layers is %d; drop prune.layer_ratio",
				ErrRecipe, p.opt.RecipePath, c.Method, len(list), c.LayerRatio, len(d.Layers), n)
		}
	}
	r, err := prune.Run(ctx, prune.Options{Model: p.st.model, Calib: p.st.calib, Out: filepath.Join(dir, "model"),
		Layers: c.Layers, LayerRatio: c.LayerRatio, Method: c.Method})
	if err != nil {
		return outputs{}, nil, err
	}
	r.Model, r.Out = "", "model"
	return outputs{Model: "model", ClearCalib: true}, r, nil
}

// widthKey names the recipe key that asks for width pruning (the first
// of head_groups, head_ratio and ffn_ratio given).
func (c *PruneStage) widthKey() string {
	switch {
	case c.HeadGroups != 0:
		return "head_groups"
	case c.HeadRatio != 0:
		return "head_ratio"
	case c.Sparsity != 0:
		return "sparsity"
	}
	return "ffn_ratio"
}

// checkHeadBudget refuses, in the recipe's words, a head_groups or
// head_ratio that leaves some layer of the model d without a KV head
// group (prune.HeadBudget). recipe names the recipe file.
func (c *PruneStage) checkHeadBudget(recipe string, d *arch.Description) error {
	if c.HeadGroups == 0 && c.HeadRatio == 0 {
		return nil // sparsity: prune checks its budget against the model
	}
	total := 0
	for _, l := range d.Layers {
		total += l.NumKVHeads
	}
	n, err := prune.HeadBudget(c.HeadGroups, c.HeadRatio, total, len(d.Layers))
	if err != nil {
		n = c.HeadGroups
		if n == 0 {
			n = max(1, int(math.Round(c.HeadRatio*float64(total))))
		}
		return fmt.Errorf("%w: %s: prune.%s: removing %d of the %d KV head groups of the %d-layer model leaves a layer without one; at most %d can go",
			ErrRecipe, recipe, c.widthKey(), n, total, len(d.Layers), total-len(d.Layers))
	}
	return nil
}

// afterDepth returns the model d as the prune section's layer removal
// leaves it, as far as the head budget cares (its layers' KV head
// counts): d itself without layer removal, or when the removed layers
// are not known before the prune-layers stage runs and the layers differ
// in KV heads (the stage then checks the budget on its result).
func afterDepth(c *PruneStage, d *arch.Description) *arch.Description {
	if !c.wantsDepth() {
		return d
	}
	L := len(d.Layers)
	n := 0
	if list, err := prune.ParseList(c.Method); err == nil {
		n = len(list)
	} else if n, err = prune.LayerBudget(c.Layers, c.LayerRatio, L); err != nil {
		return d
	}
	for _, l := range d.Layers {
		if l.NumKVHeads != d.Layers[0].NumKVHeads {
			return d
		}
	}
	if n <= 0 || n >= L {
		return d
	}
	return &arch.Description{Layers: d.Layers[:L-n]}
}

// widthSummary is the prune-width stage's result: prune's report and,
// when an earlier stage changed the model, the calibration the stage
// made of it.
type widthSummary struct {
	*prune.Report
	// Recalibrated says the stage calibrated the (layer-pruned) model
	// itself.
	Recalibrated bool               `json:"recalibrated,omitempty"`
	Calibration  *calibrate.Summary `json:"calibration,omitempty"`
}

// pruneWidth (the prune-width stage) runs prune.Run's head-group and FFN
// pruning (Putri) on the current model, calibrating it first when an
// earlier stage (prune-layers) changed it: Putri's masked perplexity and
// the FFN refit rerun the model on the calibration's token ids. Later
// stages calibrate the width-pruned model again.
func (p *pipeline) pruneWidth(ctx context.Context, dir string) (outputs, any, error) {
	c := p.r.Prune
	d, err := arch.Load(p.st.model)
	if err != nil {
		return outputs{}, nil, err
	}
	if err := c.checkHeadBudget(cmpOr(p.opt.RecipePath, "the recipe"), d); err != nil {
		return outputs{}, nil, err
	}
	s := &widthSummary{}
	calib := p.st.calib
	if calib == "" {
		if calib, s.Calibration, err = p.recalibrate(ctx, dir, "prune-width:calibrate"); err != nil {
			return outputs{}, nil, err
		}
		s.Recalibrated = true
	}
	noRefit := c.Refit != nil && !*c.Refit
	if s.Report, err = prune.Run(ctx, prune.Options{Model: p.st.model, Calib: calib, Out: filepath.Join(dir, "model"),
		HeadGroups: c.HeadGroups, HeadRatio: c.HeadRatio, HeadMethod: c.HeadMethod, FFNRatio: c.FFNRatio, NoRefit: noRefit,
		HeadStep: max(c.HeadStep, 1), Sparsity: c.Sparsity, HeadRefit: c.HeadRefit, Threads: p.opt.Threads}); err != nil {
		return outputs{}, nil, err
	}
	s.Report.Model, s.Report.Out = "", "model"
	return outputs{Model: "model", ClearCalib: true}, s, nil
}

// recalibrate calibrates the current model with the recipe's calibrate
// settings into dir/calib.safetensors (a stage that needs statistics of
// a model an earlier stage changed) and returns the file's path and
// summary; progress is reported under the stage label name.
func (p *pipeline) recalibrate(ctx context.Context, dir, name string) (string, *calibrate.Summary, error) {
	c := p.r.Calibrate
	calib := filepath.Join(dir, "calib.safetensors")
	cs, err := calibrate.Run(ctx, calibrate.Options{Model: p.st.model, Data: p.data, Tokens: c.Tokens, Ctx: c.Ctx,
		Out: calib, Threads: p.opt.Threads, MaxExpertBytes: c.maxExpertBytes(), Version: p.opt.Version, Progress: p.progress(name)})
	if err != nil {
		return "", nil, err
	}
	cs.Path = "calib.safetensors"
	return calib, cs, nil
}

// weightsSummary is the quantize-weights stage's result: wquant's report
// without its per-tensor lists and paths.
type weightsSummary struct {
	Method    string  `json:"method"`
	Bits      int     `json:"bits,omitempty"`
	Group     int     `json:"group,omitempty"`
	Sym       bool    `json:"sym,omitempty"`
	ActOrder  bool    `json:"act_order,omitempty"`
	TargetBPW float64 `json:"target_bpw,omitempty"`
	// MoEBudget echoes the recipe; ExpertBitsPerWeight is the storage bits
	// per routed-expert weight GEMQ reached (≤ MoEBudget).
	MoEBudget           float64 `json:"moe_budget,omitempty"`
	ExpertBitsPerWeight float64 `json:"expert_bits_per_weight,omitempty"`
	// Warnings are wquant's (sparse or never-routed experts and their
	// fallbacks).
	Warnings []string `json:"warnings,omitempty"`
	// Params is the number of quantized weights; BitsPerWeight their
	// storage bits per weight (codes, scales, zero-points, permutations).
	Params        int64   `json:"params"`
	BitsPerWeight float64 `json:"bits_per_weight"`
	// QuantBytesBefore/After: the quantized tensors before and after;
	// BytesBefore/After: all tensor data of the checkpoint.
	QuantBytesBefore int64   `json:"quant_bytes_before"`
	QuantBytesAfter  int64   `json:"quant_bytes_after"`
	BytesBefore      int64   `json:"bytes_before"`
	BytesAfter       int64   `json:"bytes_after"`
	PredictedError   float64 `json:"predicted_error"`
	CalibTokens      int     `json:"calib_tokens"`
	// Recalibrated says the stage calibrated the (pruned) model itself.
	Recalibrated bool               `json:"recalibrated,omitempty"`
	Calibration  *calibrate.Summary `json:"calibration,omitempty"`
}

// quantizeWeights runs quantize/wquant on the current model (calibrating
// it first when an earlier stage changed it). The quantized checkpoint
// replaces the model, and the calibration no longer describes it, so the
// KV stage calibrates the quantized model: its rotations and clip ratios
// are fitted to the keys and values the quantized weights produce.
func (p *pipeline) quantizeWeights(ctx context.Context, dir string) (outputs, any, error) {
	w := p.r.Quantize.Weights
	s := &weightsSummary{Method: w.Method, Bits: w.Bits, Sym: w.Sym, ActOrder: w.ActOrder, TargetBPW: w.TargetBPW, MoEBudget: w.MoEBudget}
	group := 0
	if w.Group != nil {
		group = *w.Group
		s.Group = group
	}
	calib := p.st.calib
	if calib == "" {
		var err error
		if calib, s.Calibration, err = p.recalibrate(ctx, dir, "quantize-weights:calibrate"); err != nil {
			return outputs{}, nil, err
		}
		s.Recalibrated = true
	}
	rep, err := wquant.Run(ctx, wquant.Options{Model: p.st.model, Calib: calib, Out: filepath.Join(dir, "model"),
		Method: w.Method, Bits: w.Bits, GroupSize: group, Symmetric: w.Sym, ActOrder: w.ActOrder, TargetBPW: w.TargetBPW,
		MoEBudget: w.MoEBudget, MoEWeighting: gemq.Weighting(w.MoEWeighting), MoERule: w.MoERule, MSEClip: w.MSEClip,
		Threads: p.opt.Threads, Version: p.opt.Version, Progress: p.progress("quantize-weights")})
	if err != nil {
		return outputs{}, nil, err
	}
	s.Params, s.BitsPerWeight, s.PredictedError, s.CalibTokens = rep.Params, rep.BitsPerWeight, rep.PredictedError, rep.CalibTokens
	s.ExpertBitsPerWeight, s.Warnings = rep.ExpertBitsPerWeight, rep.Warnings
	s.QuantBytesBefore, s.QuantBytesAfter, s.BytesBefore, s.BytesAfter = rep.QuantBytesBefore, rep.QuantBytesAfter, rep.BytesBefore, rep.BytesAfter
	return outputs{Model: "model", ClearCalib: true}, s, nil
}

// kvSummary is the quantize-kv stage's result.
type kvSummary struct {
	Cache  string `json:"cache"`
	Sink   int    `json:"sink,omitempty"`
	Recent int    `json:"recent,omitempty"`
	// Recalibrated says the stage calibrated the (pruned) model itself.
	Recalibrated bool               `json:"recalibrated,omitempty"`
	Rotations    *oscar.KVSummary   `json:"rotations,omitempty"`
	Calibration  *calibrate.Summary `json:"calibration,omitempty"`
}

// quantizeKV records the KV cache scheme and, for oscar caches, computes
// the rotations (calibrating the current model first when an earlier
// stage changed it).
func (p *pipeline) quantizeKV(ctx context.Context, dir string) (outputs, any, error) {
	kv := p.r.Quantize.KV
	o := outputs{KVCache: kv.Cache, KVSink: kv.Sink, KVRecent: kv.Recent}
	s := &kvSummary{Cache: kv.Cache, Sink: kv.Sink, Recent: kv.Recent}
	if !rotates(kv.Cache) {
		return o, s, nil
	}
	calib := p.st.calib
	if calib == "" {
		var err error
		if calib, s.Calibration, err = p.recalibrate(ctx, dir, "quantize-kv"); err != nil {
			return outputs{}, nil, err
		}
		s.Recalibrated = true
	}
	rs, err := oscar.QuantizeKV(ctx, oscar.KVOptions{Model: p.st.model, Calib: calib, Method: oscar.Method,
		ClipK: kv.ClipK, ClipV: kv.ClipV, Out: filepath.Join(dir, "rot.safetensors"), Version: p.opt.Version})
	if err != nil {
		return outputs{}, nil, err
	}
	rs.Path = "rot.safetensors"
	s.Rotations = rs
	o.KVRotations = "rot.safetensors"
	return o, s, nil
}

// pack writes the current model with the KV scheme as an artifact.
func (p *pipeline) pack(ctx context.Context, dir string) (outputs, any, error) {
	a, err := pack.FromCheckpoint(p.st.model, pack.FromOptions{KVRotations: p.st.kvRot, KVCache: p.st.kvName,
		KVSink: p.st.kvSink, KVRecent: p.st.kvRecent, Recipe: p.packedRecipeJSON, LmpackVersion: p.opt.Version,
		SourceModelFingerprint: p.srcFP})
	if err != nil {
		return outputs{}, nil, err
	}
	defer a.Close()
	if err := ctx.Err(); err != nil {
		return outputs{}, nil, err
	}
	st, err := pack.Write(filepath.Join(dir, "model.lmpk"), a, pack.WriteOptions{NoCompress: !*p.r.Pack.LZ4})
	if err != nil {
		return outputs{}, nil, err
	}
	if _, err := pack.Verify(filepath.Join(dir, "model.lmpk")); err != nil {
		return outputs{}, nil, err
	}
	st.Path, st.Sections = "model.lmpk", nil
	return outputs{Artifact: "model.lmpk"}, st, nil
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
	r, err := compareModels(ctx, src, art, ids, e.Ctx, e.MaxWindows, p.progress("eval"))
	if err != nil {
		return outputs{}, nil, err
	}
	return outputs{}, r, nil
}

// sizes fills rep.Sizes, rep.SHA256 and rep.ContentSHA256 from the source checkpoint and the
// artifact's manifest and section table.
func (p *pipeline) sizes(rep *Report) error {
	ck, err := safetensors.OpenDir(p.srcDir)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	defer ck.Close()
	s := &rep.Sizes
	for _, n := range ck.Names() {
		t, err := ck.Tensor(n)
		if err != nil {
			return fmt.Errorf("compress: %w", err)
		}
		s.SourceTensorBytes += int64(len(t.Data))
	}
	// Parameters as lmpack inspect counts them: no tied lm_head copy, no
	// RoPE buffers.
	srcDesc, err := arch.Load(p.srcDir)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	ins, err := engine.Inspect(p.srcDir, srcDesc, ck)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	s.SourceParams = ins.Params
	r, err := pack.Open(p.st.artifact)
	if err != nil {
		return err
	}
	defer r.Close()
	var tensorRaw int64
	mm := &r.Manifest().Model
	for _, t := range r.Manifest().Tensors {
		if r.IsKVRotation(t.Name) || (mm.TieWordEmbeddings && t.Name == cmpOr(mm.LMHead, "lm_head.weight")) || strings.HasSuffix(t.Name, "rotary_emb.inv_freq") {
			continue
		}
		secs := []string{t.Section}
		if q := t.Quant; q != nil {
			secs = append(secs, q.ScaleSection, q.ZeroSection, q.PermSection)
		}
		for _, sec := range secs {
			if sec == "" {
				continue
			}
			_, raw, _, err := r.SectionInfo(sec)
			if err != nil {
				return err
			}
			tensorRaw += raw
		}
		s.Params += numel(t.Shape)
	}
	for _, n := range r.Names() {
		_, raw, stored, err := r.SectionInfo(n)
		if err != nil {
			return err
		}
		s.LZ4SavedBytes += raw - stored
	}
	st, err := os.Stat(p.st.artifact)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	s.ArtifactBytes = st.Size()
	if s.Params > 0 {
		s.BitsPerWeight = 8 * float64(tensorRaw) / float64(s.Params)
	}
	if s.SourceParams > 0 {
		s.FileBitsPerSourceWeight = 8 * float64(s.ArtifactBytes) / float64(s.SourceParams)
	}
	s.Ratio = float64(s.SourceTensorBytes) / float64(s.ArtifactBytes)
	for _, sr := range rep.Stages {
		if sr.Name == "pack" {
			var ps pack.Stats
			if err := json.Unmarshal(sr.Result, &ps); err != nil {
				return fmt.Errorf("compress: pack stage record: %w", err)
			}
			rep.ContentSHA256 = ps.ContentSHA256
		}
	}
	sum, err := fileFingerprint(p.st.artifact)
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	rep.SHA256 = sum
	return nil
}

func numel(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}
