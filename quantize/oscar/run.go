package oscar

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/lmpack/lmpack/calibrate"
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
	// ClipK, ClipV are the clipping ratios for every layer, in (0, 1]
	// (DefaultClipK 0.96, DefaultClipV 0.92).
	ClipK, ClipV float64
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
}

// QuantizeKV is `lmpack quantize kv --method oscar`: it reads the model's
// description and fingerprint, reads the calibration file (validated
// against the model with calibrate.Read), computes every layer's K and V
// rotations (Compute) and writes the rotation file opt.Out (WriteFile) with
// the clip ratios and both fingerprints.
//
// Errors: invalid options (Validate: a *field.Error); the output
// directory missing; an output inside the model directory
// (fsx.CheckOutside, also the cache snapshot of a hub id); model errors; calibration errors (another model:
// model.ErrModelMismatch; no "oscar" statistics); a head_dim that is not
// a power of two (ErrBadCovariance); write errors.
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
	for _, ly := range layers {
		h.ClipK = append(h.ClipK, opt.ClipK)
		h.ClipV = append(h.ClipV, opt.ClipV)
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
		opt.Logger.Info("KV rotations written", "path", opt.Out, "method", Method, "layers", len(layers), "clip_k", opt.ClipK, "clip_v", opt.ClipV,
			"max_orthogonality_error", s.MaxOrthogonalityError)
	}
	return s, nil
}
