package calibrate

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/model"
)

// Options configures Run.
type Options struct {
	// Model is a model directory or a Hugging Face hub id (model.Load).
	Model string
	// Data is the UTF-8 calibration text file.
	Data string
	// Tokens is the number of calibration tokens (> 0).
	Tokens int
	// Ctx is the window length in tokens (>= 2, at most the model's
	// max_position_embeddings); 0 means arch.DefaultContext of the model,
	// min(512, max_position_embeddings).
	Ctx int
	// Out is the calibration file to write.
	Out string
	// Threads is the CPU worker count; <= 0 means all cores.
	Threads int
	// Version is the lmpack version recorded in the file.
	Version string
	// Progress, when not nil, is called after each window with the tokens
	// forwarded so far and the total (2·Tokens: two passes; for an MoE
	// model (2+P)·Tokens with P the expert passes).
	Progress func(done, total int)
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
	// AllExperts (MoE models): every token is accumulated into every
	// expert's Hessians, for statistics only (ExpertOptions.AllExperts).
	AllExperts bool
	// MinExpertTokens is the sparse-expert report threshold in routed
	// tokens (ExpertOptions.MinTokens); 0 means DefaultMinExpertTokens.
	MinExpertTokens int
	// MaxExpertBytes (MoE models) bounds the memory of the expert
	// statistics, in bytes: the MoE layers are split into groups of
	// consecutive layers whose ExpertLayerBytes sum to at most it
	// (ExpertPasses), each collected in its own pass over the windows and
	// written to a temporary file beside Out, and the file is assembled
	// from those at the end; it is byte-identical to a single pass's. 0
	// means no limit (one pass, every layer held in memory until Write);
	// negative is an error.
	MaxExpertBytes int64
}

// Summary reports a finished Run.
type Summary struct {
	// Path is the calibration file written.
	Path string `json:"path"`
	// ModelFingerprint and DataFingerprint are those of the file's Header.
	ModelFingerprint string `json:"model_fingerprint"`
	DataFingerprint  string `json:"data_fingerprint"`
	// Tokens and Windows: the calibration tokens and how many windows of
	// at most Ctx tokens they were run in.
	Tokens  int `json:"tokens"`
	Windows int `json:"windows"`
	Ctx     int `json:"ctx"`
	// Seconds is the wall time of the collection (all passes).
	Seconds float64 `json:"seconds"`
	// TokensPerSecond is calibration tokens per second: Tokens / Seconds
	// (each token is forwarded twice).
	TokensPerSecond float64 `json:"tokens_per_second"`
	// ExpertLayers is the number of MoE layers with expert statistics
	// (StatExperts; 0 for a dense model).
	ExpertLayers int `json:"expert_layers,omitempty"`
	// ExpertPasses is the number of passes over the windows that
	// collected the expert statistics (Options.MaxExpertBytes; 0 for a
	// dense model).
	ExpertPasses int `json:"expert_passes,omitempty"`
	// SparseExperts lists the experts routed fewer than MinExpertTokens
	// tokens; their Hessians fall back as ExpertLayer.Hessians documents
	// (not with AllExperts, where every expert sees every token).
	SparseExperts []SparseExpert `json:"sparse_experts,omitempty"`
	// Routing gives, per MoE layer in layer order, the calibration
	// tokens the router sent to each expert (top-k routing, also with
	// AllExperts; ExpertStat.Routed): the table `lmpack calibrate`
	// prints. Each layer's counts sum to Tokens × top-k. Nil for a dense
	// model.
	Routing []ExpertRouting `json:"routing,omitempty"`
}

// ExpertRouting is one MoE layer's routing counts: Routed[e] is the
// number of calibration tokens routed to expert e (length E, the layer's
// expert count).
type ExpertRouting struct {
	Layer  int     `json:"layer"`
	Routed []int64 `json:"routed"`
}

// Run is `lmpack calibrate`: it opens the model on the CPU backend (the
// decoder blocks' weights kept in the checkpoint's dtype and converted to
// float32 one block at a time: runtime.LoadOptions.ConvertPerBlock), reads
// the data file and tokenizes it as one string with BOS prepended (as
// `lmpack eval` does), splits the first opt.Tokens tokens into windows of
// opt.Ctx tokens (Windows), collects the OSCAR, block-similarity and
// head-proxy statistics (CollectStats), for an MoE model also the expert
// statistics (CollectExperts: one more pass per group of MoE layers that
// fits opt.MaxExpertBytes, see ExpertPasses; sparse experts are logged as
// warnings and listed in the Summary), and writes the calibration file
// opt.Out (Write, atomic). With more than one expert pass, each pass's
// statistics go to a temporary safetensors file in a directory beside
// opt.Out (removed at the end) and the final write copies them from there,
// so that memory holds one group at a time; the output bytes do not depend
// on the grouping.
//
// Errors: invalid options (Validate, ValidateModel: a *field.Error); an MoE layer needing more than
// opt.MaxExpertBytes (ExpertPasses, naming the bytes needed); the output
// directory missing; the data file unreadable, empty, not UTF-8 or
// shorter than opt.Tokens tokens; an output inside the model directory
// (fsx.CheckOutside, also the cache snapshot of a hub id); model errors
// from model.Resolve and model.Load; collection and write errors.
func Run(ctx context.Context, opt Options) (*Summary, error) {
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	if st, err := os.Stat(filepath.Dir(opt.Out)); err != nil {
		return nil, fmt.Errorf("calibrate: output %s: %w", opt.Out, err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("calibrate: output %s: %s is not a directory", opt.Out, filepath.Dir(opt.Out))
	}
	if st, err := os.Stat(opt.Out); err == nil && st.IsDir() {
		return nil, fmt.Errorf("calibrate: output %s is a directory; want a file path", opt.Out)
	}
	if st, err := os.Stat(opt.Out); err == nil && !st.IsDir() && !isCalibrationFile(opt.Out) {
		return nil, fmt.Errorf("calibrate: output %s exists and is not an lmpack calibration file; refusing to overwrite it (remove it or choose another path)", opt.Out)
	}
	text, err := fsx.ReadText(opt.Data)
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	// The windows are prefill only: converting one block's weights at a
	// time costs little beside the matmuls and keeps memory at the mapped
	// checkpoint plus one block in float32.
	// A hub id resolves to a snapshot in the Hugging Face cache: the
	// output must not land there either (inputs are never modified).
	dir, err := model.Resolve(ctx, opt.Model, model.HubOptions(opt.Logger))
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	if err := fsx.CheckOutside(dir, opt.Out, "the calibration file"); err != nil {
		return nil, fmt.Errorf("calibrate: output: %w", err)
	}
	e, err := model.Load(ctx, dir, model.LoadOptions{Threads: opt.Threads, Logger: opt.Logger, ConvertPerBlock: true})
	if err != nil {
		return nil, fmt.Errorf("calibrate: %w", err)
	}
	defer e.Close()
	if err := opt.ValidateModel(e.Desc); err != nil {
		return nil, fmt.Errorf("calibrate: %s: %w", e.Dir, err)
	}
	if opt.Ctx == 0 {
		opt.Ctx = arch.DefaultContext(e.Desc)
	}
	fp, err := model.Fingerprint(e.Dir, e.Checkpoint)
	if err != nil {
		return nil, err
	}
	ids := tokenize(e, text)
	windows, err := Windows(ids, opt.Tokens, opt.Ctx)
	if err != nil {
		return nil, fmt.Errorf("calibrate: data file %s: %w", opt.Data, err)
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log.Info("calibrating", "model", e.Dir, "data", opt.Data, "tokens", opt.Tokens, "ctx", opt.Ctx, "windows", len(windows), "passes", 2)
	t0 := time.Now()
	moe := false
	for _, l := range e.Desc.Layers {
		moe = moe || l.MoE != nil
	}
	groups, err := ExpertPasses(e.Desc, opt.MaxExpertBytes)
	if err != nil {
		return nil, err
	}
	progress := opt.Progress
	if moe && progress != nil {
		// OSCAR (2 passes) and the expert statistics (one per group).
		progress = func(done, _ int) { opt.Progress(done, (2+len(groups))*opt.Tokens) }
	}
	st, err := CollectStats(ctx, e.Model, windows, progress)
	if err != nil {
		return nil, err
	}
	var experts []ExpertLayer
	var sparse []SparseExpert
	var routing []ExpertRouting
	var passFiles []string // with more than one expert pass
	nExpertLayers := 0
	if moe {
		var need int64
		for _, g := range groups {
			for _, l := range g {
				need += ExpertLayerBytes(e.Desc, l)
			}
		}
		log.Info("expert statistics", "passes", len(groups), "moe_layers", countLayers(groups),
			"bytes_all_layers", need, "max_expert_bytes", opt.MaxExpertBytes)
		tmp := ""
		if len(groups) > 1 {
			var done func()
			if tmp, done, err = fsx.ScratchDir(opt.Out, "experts"); err != nil {
				return nil, fmt.Errorf("calibrate: expert statistics: %w", err)
			}
			defer done()
		}
		var ep func(done int)
		if opt.Progress != nil {
			ep = func(done int) { opt.Progress(2*opt.Tokens+done, (2+len(groups))*opt.Tokens) }
		}
		er, err := collectExpertPasses(ctx, e, windows, groups, opt, tmp, log, ep)
		if err != nil {
			return nil, err
		}
		experts, passFiles, nExpertLayers, sparse, routing = er.experts, er.passFiles, er.layers, er.sparse, er.routing
		for _, s := range sparse {
			fb := "its Hessians fall back to the layer's pooled input Hessian (gate/up) and the identity (down)"
			if opt.AllExperts {
				fb = "--calibrate-all-experts gave it every token's statistics"
			}
			log.Warn("sparse expert", "layer", s.Layer, "expert", s.Expert, "routed_tokens", s.Routed, "fallback", fb)
		}
	}
	secs := time.Since(t0).Seconds()
	c := &Calibration{
		Header: Header{
			ModelFingerprint: fp,
			DataFingerprint:  Fingerprint([]byte(text)),
			Tokens:           opt.Tokens,
			Ctx:              opt.Ctx,
			LmpackVersion:    opt.Version,
		},
		OSCAR:      st.OSCAR,
		Similarity: st.Similarity,
		TokenIDs:   ids[:opt.Tokens],
		HeadProxy:  st.HeadProxy,
		Experts:    experts,
	}
	var streamed []safetensors.WriteTensor
	if passFiles != nil {
		var closeAll func()
		if streamed, closeAll, err = passTensors(passFiles); err != nil {
			return nil, err
		}
		defer closeAll()
	}
	if err := write(opt.Out, c, streamed); err != nil {
		return nil, err
	}
	s := &Summary{Path: opt.Out, ModelFingerprint: fp, DataFingerprint: c.Header.DataFingerprint,
		Tokens: opt.Tokens, Windows: len(windows), Ctx: opt.Ctx, Seconds: secs, TokensPerSecond: float64(opt.Tokens) / secs,
		ExpertLayers: nExpertLayers, ExpertPasses: len(groups), SparseExperts: sparse, Routing: routing}
	log.Info("calibration written", "path", opt.Out, "seconds", secs, "tokens_per_second", s.TokensPerSecond)
	return s, nil
}

// expertRun is what collectExpertPasses collected.
type expertRun struct {
	// experts holds every layer's statistics after a single pass; nil
	// after several.
	experts []ExpertLayer
	// passFiles are the files of the passes (writePass), one per group,
	// when there were several; nil after a single pass.
	passFiles []string
	// layers is the number of MoE layers collected.
	layers int
	// sparse lists the sparse experts of every pass, in layer order.
	sparse []SparseExpert
	// routing holds every MoE layer's routing counts, in layer order.
	routing []ExpertRouting
}

// collectExpertPasses runs CollectExperts once per group of MoE layers
// (ExpertPasses) with opt's AllExperts and MinExpertTokens. One group is
// kept in memory (expertRun.experts, every MoE layer); with several, each
// group's statistics are written to tmpDir/pass-K.safetensors (writePass)
// and released (with a GC) before the next pass, so that the heap holds one
// group at a time. progress, when not nil, gets the tokens forwarded over
// all the passes so far. Errors: those of CollectExperts and writePass.
func collectExpertPasses(ctx context.Context, e *model.Loaded, windows [][]int, groups [][]int, opt Options, tmpDir string, log *slog.Logger, progress func(done int)) (*expertRun, error) {
	r := &expertRun{}
	T := 0
	for _, w := range windows {
		T += len(w)
	}
	for k, g := range groups {
		var ep func(done, total int)
		if progress != nil {
			ep = func(done, _ int) { progress(k*T + done) }
		}
		eo := ExpertOptions{AllExperts: opt.AllExperts, MinTokens: opt.MinExpertTokens}
		if len(groups) > 1 {
			eo.Layers = g
		}
		ls, err := CollectExperts(ctx, e.Model, e.Desc, e.Checkpoint, windows, eo, ep)
		if err != nil {
			return nil, err
		}
		r.layers += len(ls)
		for i := range ls {
			r.sparse = append(r.sparse, ls[i].Sparse(opt.MinExpertTokens)...)
			er := ExpertRouting{Layer: ls[i].Layer, Routed: make([]int64, len(ls[i].Experts))}
			for e, st := range ls[i].Experts {
				er.Routed[e] = st.Routed
			}
			r.routing = append(r.routing, er)
		}
		if len(groups) == 1 {
			r.experts = ls
			break
		}
		path := filepath.Join(tmpDir, fmt.Sprintf("pass-%d.safetensors", k))
		if err := writePass(path, ls, T); err != nil {
			return nil, err
		}
		r.passFiles = append(r.passFiles, path)
		log.Info("expert statistics pass", "pass", k+1, "of", len(groups), "layers", g)
		// Free this group's statistics before the next group's are
		// allocated (one GC per pass over the data costs nothing in
		// comparison).
		goruntime.GC()
	}
	return r, nil
}

// countLayers returns the number of layers in groups.
func countLayers(groups [][]int) int {
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	return n
}

// writePass writes one expert pass's statistics (expertTensors, checked)
// to path as a plain safetensors file.
func writePass(path string, ls []ExpertLayer, tokens int) error {
	ts, err := expertTensors(path, ls, tokens)
	if err != nil {
		return err
	}
	if err := safetensors.WriteFile(path, ts, nil); err != nil {
		return fmt.Errorf("calibrate: expert statistics: %w", err)
	}
	return nil
}

// passTensors opens the pass files written by writePass and returns their
// tensors as WriteTensors that copy the bytes from the files' mappings
// (WriteTo), and a function closing the files (to call after the write).
// Errors: safetensors.Open errors.
func passTensors(paths []string) ([]safetensors.WriteTensor, func(), error) {
	var files []*safetensors.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	var ts []safetensors.WriteTensor
	for _, p := range paths {
		f, err := safetensors.Open(p)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("calibrate: expert statistics: %w", err)
		}
		files = append(files, f)
		for _, ti := range f.Tensors() {
			name := ti.Name
			ts = append(ts, safetensors.WriteTensor{Name: name, DType: ti.DType, Shape: ti.Shape, WriteTo: func(w io.Writer) error {
				t, err := f.Tensor(name)
				if err != nil {
					return err
				}
				_, err = w.Write(t.Data)
				return err
			}})
		}
	}
	return ts, closeAll, nil
}

// tokenize encodes text as one string with the tokenizer's special tokens
// and makes sure it starts with BOS when the model has one (the rule of
// engine.EvalFile).
func tokenize(e *model.Loaded, text string) []int {
	ids := e.Tokenizer.Encode(text, true)
	bos, ok := e.Tokenizer.BOS()
	if !ok && e.Desc.BOSTokenID >= 0 {
		bos, ok = e.Desc.BOSTokenID, true
	}
	if ok && (len(ids) == 0 || ids[0] != bos) {
		ids = append([]int{bos}, ids...)
	}
	return ids
}

// Windows splits ids[:tokens] into consecutive windows of ctx tokens; the
// last window holds the remainder (tokens mod ctx) when it is not zero.
// The windows alias ids. Errors: tokens or ctx <= 0; fewer than tokens ids
// (naming both counts).
func Windows(ids []int, tokens, ctx int) ([][]int, error) {
	if tokens <= 0 || ctx <= 0 {
		return nil, fmt.Errorf("tokens %d, ctx %d: want both > 0", tokens, ctx)
	}
	if len(ids) < tokens {
		return nil, fmt.Errorf("%d tokens, fewer than the %d requested (use a longer file or fewer tokens)", len(ids), tokens)
	}
	var w [][]int
	for lo := 0; lo < tokens; lo += ctx {
		w = append(w, ids[lo:min(lo+ctx, tokens)])
	}
	return w, nil
}

// isCalibrationFile reports whether path is a safetensors file whose
// metadata names Kind (an earlier calibration output, safe to replace).
func isCalibrationFile(path string) bool {
	f, err := safetensors.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var h struct {
		Kind string `json:"kind"`
	}
	return json.Unmarshal([]byte(f.Metadata()[model.MetadataKey]), &h) == nil && h.Kind == Kind
}
