package oscar

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/model"
)

// KVOptions configures QuantizeKV.
type KVOptions struct {
	// Model is a model directory or a Hugging Face hub id; only config.json
	// and the checkpoint headers are read.
	Model string
	// Calib is the calibration file (calibrate.Run) of the same model,
	// holding the "oscar" statistics.
	Calib string
	// Method is the rotation method: "oscar" (the empty string means
	// "oscar").
	Method string
	// ClipK, ClipV are the 2-bit sides' clipping ratios for every layer,
	// in (0, 1] (DefaultClipK 0.96, DefaultClipV 0.92).
	ClipK, ClipV float64
	// ClipK4, ClipV4, ClipK8, ClipV8 are the 4- and 8-bit sides' ratios
	// for every layer, in (0, 1]; 0 (the default) means no clipping at
	// that width (the file then holds no list for it).
	ClipK4, ClipV4, ClipK8, ClipV8 float64
	// ClipSearch picks every layer's K and V ratio at each width from
	// ClipGrid by the KL of the final logits measured on the calibration
	// tokens (see QuantizeKV), instead of the ratios above; a ratio is
	// kept only when it beats the width's default (ClipK/ClipV at 2 bits,
	// the given or 1 at 4 and 8) by SearchMargin standard errors over the
	// calibration windows.
	ClipSearch bool
	// KVBits, when > 0, chooses every layer's K and V width in {2, 4, 8}
	// (cache "oscar-mixed") so that the average bits per element at
	// ServingCtx tokens, fp16 windows Sink and Recent counted, stays ≤
	// KVBits, minimising the summed measured error by exact DP
	// (quantize/alloc.SolveDP).
	KVBits float64
	// ServingCtx is the context of the KVBits budget in tokens; 0 means
	// DefaultServingCtx (32768).
	ServingCtx int
	// Sink and Recent are the fp16 windows (tokens) the cache will run
	// with: they enter the KVBits budget (amortised over ServingCtx) and
	// the error measurement (those keys are read exact). 0 = none.
	Sink, Recent int
	// SearchTokens caps the calibration tokens the error measurement runs
	// (the first windows of the calibration file); 0 means
	// DefaultSearchTokens.
	SearchTokens int
	// Threads is the CPU worker count of the measurement; ≤ 0: all cores.
	Threads int
	// Out is the rotation file to write.
	Out string
	// Version is the lmpack version recorded in the file.
	Version string
	// Logger receives progress lines; nil discards them.
	Logger *slog.Logger
}

// KVSummary reports a finished QuantizeKV.
type KVSummary struct {
	Path   string `json:"path"`
	Layers int    `json:"layers"`
	// MaxOrthogonalityError is the largest max|R·Rᵀ − I| over all layers'
	// float64 rotations.
	MaxOrthogonalityError float64 `json:"max_orthogonality_error"`
	// KeyEigenvalueShare is, per layer, the fraction of trace(C_Q) held by
	// its largest eigenvalue (how concentrated key importance is).
	KeyEigenvalueShare []float64 `json:"key_eigenvalue_share"`
	// ClipSearch and the fields below are set when the errors were
	// measured (KVOptions.ClipSearch or KVBits): SearchTokens calibration
	// tokens; PerLayer the clip ratios and errors per layer, side and
	// width (the error unit of SideReport).
	ClipSearch   bool          `json:"clip_search,omitempty"`
	SearchTokens int           `json:"search_tokens,omitempty"`
	PerLayer     []LayerReport `json:"per_layer,omitempty"`
	// KVBits, ServingCtx, Sink, Recent: the budget of the mixed widths;
	// BitsPerElement the achieved average bits per element at ServingCtx
	// (windows amortised), PredictedError the summed error of the chosen
	// widths, UniformError and UniformBitsPerElement the same for every
	// layer at 2, 4 and 8 bits (keys "2", "4", "8").
	KVBits                float64            `json:"kv_bits,omitempty"`
	ServingCtx            int                `json:"kv_serving_ctx,omitempty"`
	Sink                  int                `json:"kv_sink,omitempty"`
	Recent                int                `json:"kv_recent,omitempty"`
	BitsPerElement        float64            `json:"bits_per_element,omitempty"`
	PredictedError        float64            `json:"predicted_error,omitempty"`
	UniformError          map[string]float64 `json:"uniform_error,omitempty"`
	UniformBitsPerElement map[string]float64 `json:"uniform_bits_per_element,omitempty"`
}

// QuantizeKV is `lmpack quantize kv --method oscar`: it reads the model's
// description and fingerprint, reads the calibration file (validated
// against the model with calibrate.Read), computes every layer's K and V
// rotations (Compute) and writes the rotation file opt.Out (WriteFile) with
// the clip ratios and both fingerprints.
//
// With ClipSearch or KVBits it also measures, per layer, side and width
// in {2, 4, 8}, the end-to-end error of quantising that side alone: the
// calibration file's token ids (the first SearchTokens, in its windows)
// run through the model on the CPU one window at a time; the post-RoPE q,
// k, v of every layer and the reference logits are captured; for each
// ratio tried the side is quantised as the oscar caches store it
// (rotation, clip, asymmetric codes per (token, head) row with fp16 scale
// and zero), the layer's attention output is recomputed as served (each
// query reading its own token and the Sink/Recent windows exact, older
// tokens quantized; GQA and q/k norm as the model runs them) and
// substituted at the o_proj input, the window runs on through the later
// layers, and the error is the mean over tokens of KL(p ‖ q) of the final
// next-token distributions (nats), the quantity eval --kv reports. (The
// attention-output error ‖softmax(qKᵀ/√d)V − softmax(qK̂ᵀ/√d)V̂‖², the
// earlier objective, is reported beside it: it weighs every coordinate
// of the output alike, whatever the later layers read, and its scale
// differs by layer, so it picked V ratios the KL does not and widths on
// incomparable scales.) ClipSearch keeps per layer, side and width the
// ratio of ClipGrid with the least KL when it beats the width's default
// ratio by SearchMargin standard errors of the paired per-window
// differences (pick), the default otherwise; without ClipSearch the
// 2-bit ratios are ClipK/ClipV and the 4-/8-bit ones ClipK4…ClipV8 (0:
// none). KVBits then chooses the widths
// by alloc.SolveDP over the 2·layers items (cost: sideCost at
// ServingCtx; error: the measured KL at the kept ratio) and records
// them (RotationHeader.BitsK/BitsV).
//
// Errors: invalid options (Validate: a *field.Error); the output
// directory missing; an output inside the model directory
// (fsx.CheckOutside, also the cache snapshot of a hub id); model errors; calibration errors (another model:
// model.ErrModelMismatch; no "oscar" statistics; no token ids when the
// errors are measured); a head_dim that is not a power of two
// (ErrBadCovariance); a KVBits below the all-2-bit cost (alloc's
// ErrInfeasible, naming that cost); write errors.
func QuantizeKV(ctx context.Context, opt KVOptions) (*KVSummary, error) {
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("oscar: %w", err)
	}
	if st, err := os.Stat(filepath.Dir(opt.Out)); err != nil {
		return nil, fmt.Errorf("oscar: output %s: %w", opt.Out, err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("oscar: output %s: %s is not a directory", opt.Out, filepath.Dir(opt.Out))
	}
	if st, err := os.Stat(opt.Out); err == nil && st.IsDir() {
		return nil, fmt.Errorf("oscar: output %s is a directory; want a file path", opt.Out)
	}
	dir, desc, ck, err := model.Open(ctx, opt.Model, model.HubOptions(opt.Logger))
	if err != nil {
		return nil, fmt.Errorf("oscar: %w", err)
	}
	// A hub id resolves to a snapshot in the Hugging Face cache: the
	// output must not land there either (inputs are never modified).
	if err := fsx.CheckOutside(dir, opt.Out, "the rotation file"); err != nil {
		ck.Close()
		return nil, fmt.Errorf("oscar: output: %w", err)
	}
	fp, err := model.Fingerprint(dir, ck)
	ck.Close()
	if err != nil {
		return nil, err
	}
	cb, err := fsx.ReadFile(opt.Calib)
	if err != nil {
		return nil, fmt.Errorf("oscar: calibration file: %w", err)
	}
	cal, err := calibrate.Read(opt.Calib, model.Expect{ModelFingerprint: fp, Desc: desc})
	if err != nil {
		return nil, err
	}
	if !cal.Has(calibrate.StatOSCAR) {
		return nil, fmt.Errorf("oscar: %s: no %q statistics (it holds %v): run lmpack calibrate again", opt.Calib, calibrate.StatOSCAR, cal.Header.Statistics)
	}
	layers, err := Compute(cal.OSCAR)
	if err != nil {
		return nil, fmt.Errorf("oscar: %s: %w", opt.Calib, err)
	}
	s := &KVSummary{Path: opt.Out, Layers: len(layers)}
	h := RotationHeader{ModelFingerprint: fp, CalibrationFingerprint: calibrate.Fingerprint(cb), LmpackVersion: opt.Version}
	if opt.ClipSearch || opt.KVBits > 0 {
		if err := searchKV(ctx, opt, dir, cal, desc, layers, &h, s); err != nil {
			return nil, err
		}
	} else {
		for range layers {
			h.ClipK, h.ClipV = append(h.ClipK, opt.ClipK), append(h.ClipV, opt.ClipV)
			for _, c := range []struct {
				dst   *[]float64
				ratio float64
			}{{&h.ClipK4, opt.ClipK4}, {&h.ClipV4, opt.ClipV4}, {&h.ClipK8, opt.ClipK8}, {&h.ClipV8, opt.ClipV8}} {
				if c.ratio > 0 {
					*c.dst = append(*c.dst, c.ratio)
				}
			}
		}
	}
	for _, ly := range layers {
		s.MaxOrthogonalityError = max(s.MaxOrthogonalityError, Orthogonality(ly.RK, ly.HeadDim), Orthogonality(ly.RV, ly.HeadDim))
		var tr float64
		for _, x := range ly.EigK {
			tr += x
		}
		share := 0.0
		if tr > 0 {
			share = ly.EigK[0] / tr
		}
		s.KeyEigenvalueShare = append(s.KeyEigenvalueShare, share)
	}
	if err := WriteFile(opt.Out, h, layers); err != nil {
		return nil, err
	}
	if opt.Logger != nil {
		opt.Logger.Info("KV rotations written", "path", opt.Out, "method", Method, "layers", len(layers), "clip_k", h.ClipK, "clip_v", h.ClipV,
			"bits_k", h.BitsK, "bits_v", h.BitsV, "max_orthogonality_error", s.MaxOrthogonalityError)
	}
	return s, nil
}

// searchKV measures the per-layer errors (measureAll), fills h's clip
// ratios (searched or given) and, with opt.KVBits, its widths by exact
// DP, and reports them in s.
func searchKV(ctx context.Context, opt KVOptions, dir string, cal *calibrate.Calibration, desc *arch.Description, layers []Layer, h *RotationHeader, s *KVSummary) error {
	wins := cal.CalibrationWindows()
	if len(wins) == 0 {
		return fmt.Errorf("oscar: %s holds no calibration token ids, which --clip-search and --kv-bits run through the model (calibrate again with this lmpack)", opt.Calib)
	}
	ld, err := model.Load(ctx, dir, model.LoadOptions{Threads: opt.Threads, Logger: opt.Logger})
	if err != nil {
		return fmt.Errorf("oscar: %w", err)
	}
	defer ld.Close()
	given := [2][3]float64{{opt.ClipK, opt.ClipK4, opt.ClipK8}, {opt.ClipV, opt.ClipV4, opt.ClipV8}}
	// def[side][wi]: the ratio the width uses without the search.
	var def [2][3]float64
	for side := range def {
		for wi := range Widths {
			def[side][wi] = 1
			if given[side][wi] > 0 {
				def[side][wi] = given[side][wi]
			}
		}
	}
	clips := func(int) [2][][]float64 {
		var c [2][][]float64
		for side := 0; side < 2; side++ {
			for wi := range Widths {
				switch {
				case opt.ClipSearch:
					g := ClipGrid
					if Widths[wi] == 8 {
						g = []float64{1}
					}
					if !slices.Contains(g, def[side][wi]) {
						g = append(slices.Clone(g), def[side][wi])
					}
					c[side] = append(c[side], g)
				case given[side][wi] > 0:
					c[side] = append(c[side], []float64{given[side][wi]})
				default:
					c[side] = append(c[side], []float64{1})
				}
			}
		}
		return c
	}
	maxTok := opt.SearchTokens
	if maxTok == 0 {
		maxTok = DefaultSearchTokens
	}
	w := attnWindows{sink: opt.Sink, recent: opt.Recent}
	longest := 0
	for _, win := range wins {
		longest = max(longest, len(win))
	}
	// The last query of the longest window (t = longest−1) reads key j < t
	// quantized only when sink ≤ j < t + 1 − recent (attnWindows): none
	// such, nothing is measured.
	if min(longest-1, longest-opt.Recent) <= opt.Sink {
		return fmt.Errorf("oscar: --kv-window %d,%d covers every calibration window of %s (the longest holds %d tokens): no key or value would be read quantized, so --clip-search and --kv-bits would measure nothing; want sink + max(recent, 1) < %d (smaller windows, or calibrate with longer windows)",
			opt.Sink, opt.Recent, opt.Calib, longest, longest)
	}
	if opt.KVBits > 0 {
		// An infeasible budget is refused before the measurement (which
		// takes minutes): the all-2-bit cost depends on the shapes alone.
		probe := make([]WidthLayer, len(desc.Layers))
		for i, l := range desc.Layers {
			probe[i] = WidthLayer{NumKVHeads: l.NumKVHeads, HeadDim: l.HeadDim}
		}
		if _, err := ChooseWidths(probe, opt.KVBits, opt.ServingCtx, opt.Sink, opt.Recent); err != nil {
			return err
		}
	}
	tabs, n, err := measureAll(ctx, ld.Model, wins, maxTok, layers, clips, w, opt.Threads)
	if err != nil {
		return err
	}
	s.ClipSearch, s.SearchTokens = opt.ClipSearch, n
	// chosen[l][side][wi]: the index of the kept ratio.
	L := len(layers)
	lists := [2][3]*[]float64{{&h.ClipK, &h.ClipK4, &h.ClipK8}, {&h.ClipV, &h.ClipV4, &h.ClipV8}}
	errAt := make([][2][3]float64, L)
	for l, t := range tabs {
		lr := LayerReport{Layer: l}
		for side := 0; side < 2; side++ {
			sr := &lr.K
			if side == 1 {
				sr = &lr.V
			}
			for wi := range Widths {
				b := pick(t.err[side][wi], t.win[side][wi], slices.Index(t.clips[side][wi], def[side][wi]))
				ratio := t.clips[side][wi][b]
				errAt[l][side][wi] = t.err[side][wi][b]
				sr.Clip, sr.Error = append(sr.Clip, ratio), append(sr.Error, t.err[side][wi][b])
				sr.AttnError = append(sr.AttnError, t.attn[side][wi][b])
				if wi == 0 || opt.ClipSearch || given[side][wi] > 0 {
					*lists[side][wi] = append(*lists[side][wi], ratio)
				}
			}
		}
		s.PerLayer = append(s.PerLayer, lr)
	}
	if opt.KVBits <= 0 {
		return nil
	}
	wl := make([]WidthLayer, L)
	for l, dl := range desc.Layers {
		wl[l] = WidthLayer{NumKVHeads: dl.NumKVHeads, HeadDim: dl.HeadDim, ErrK: errAt[l][0], ErrV: errAt[l][1]}
	}
	p, err := ChooseWidths(wl, opt.KVBits, opt.ServingCtx, opt.Sink, opt.Recent)
	if err != nil {
		return err
	}
	for l := 0; l < L; l++ {
		s.PerLayer[l].K.Bits, s.PerLayer[l].V.Bits = p.BitsK[l], p.BitsV[l]
	}
	h.BitsK, h.BitsV = p.BitsK, p.BitsV
	h.KVBits, h.KVServingCtx, h.KVSink, h.KVRecent = opt.KVBits, p.ServingCtx, opt.Sink, opt.Recent
	s.KVBits, s.ServingCtx, s.Sink, s.Recent = opt.KVBits, p.ServingCtx, opt.Sink, opt.Recent
	s.BitsPerElement, s.PredictedError = p.BitsPerElement, p.Error
	s.UniformError, s.UniformBitsPerElement = p.UniformError, p.UniformBitsPerElement
	return nil
}

func sum(x []int64) int64 {
	var s int64
	for _, v := range x {
		s += v
	}
	return s
}
