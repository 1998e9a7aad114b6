package oscar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/model"
)

// Kind is RotationHeader.Kind of a KV rotation file.
const Kind = "lmpack-kv-rotation"

// FormatVersion is the rotation file format this package writes and the
// only one it reads.
const FormatVersion = 1

// Method is RotationHeader.Method for OSCAR rotations.
const Method = "oscar"

// MaxOrthogonalityError bounds max|R·Rᵀ − I| for a float32 rotation read
// from a file (float32 rounding of an orthogonal matrix gives about 1e-7).
const MaxOrthogonalityError = 1e-4

// Widths are the per-layer K and V widths in bits of a mixed-width cache
// (RotationHeader.BitsK/BitsV; kvcache's oscar-mixed).
var Widths = []int{2, 4, 8}

// Sentinel errors of ReadFile, wrapped with the file and tensor or field.
var (
	// ErrNotRotation: not an lmpack KV rotation file (no "lmpack"
	// metadata, another kind or method).
	ErrNotRotation = errors.New("not an lmpack KV rotation file")
	// ErrRotationModelMismatch: the rotation file was computed for another
	// model. It wraps model.ErrModelMismatch for callers that test
	// either.
	ErrRotationModelMismatch error = rotationMismatch{}
	// ErrVersion: format_version is not FormatVersion.
	ErrVersion = errors.New("unsupported rotation format version")
	// ErrBadRotation: a rotation tensor is missing, has the wrong dtype or
	// shape, holds NaN/Inf or is not orthogonal; a clip ratio is out of
	// (0, 1]; a width is not 2, 4 or 8; or a per-layer list has the wrong
	// length.
	ErrBadRotation = errors.New("bad rotation")
)

// RotationHeader is the JSON object stored under model.MetadataKey
// ("lmpack") in a rotation file's "__metadata__".
type RotationHeader struct {
	FormatVersion int    `json:"format_version"`
	Kind          string `json:"kind"`
	Method        string `json:"method"`
	// ModelFingerprint is model.Fingerprint of the model.
	ModelFingerprint string `json:"model_fingerprint"`
	// CalibrationFingerprint is the sha256 (hex) of the calibration file's
	// bytes the rotations were computed from.
	CalibrationFingerprint string `json:"calibration_fingerprint"`
	// ClipK, ClipV: per-layer clipping ratios in (0, 1] of the 2-bit
	// sides (oscar2, and the 2-bit layers of oscar-mixed).
	ClipK []float64 `json:"clip_k"`
	ClipV []float64 `json:"clip_v"`
	// ClipK4, ClipV4, ClipK8, ClipV8: per-layer ratios in (0, 1] of the 4-
	// and 8-bit sides; absent (nil) means no clipping at that width. Set
	// by --clip-search (the KL-searched ratios; 1 where none beat the
	// default), or when a ratio is given for the width.
	ClipK4 []float64 `json:"clip_k4,omitempty"`
	ClipV4 []float64 `json:"clip_v4,omitempty"`
	ClipK8 []float64 `json:"clip_k8,omitempty"`
	ClipV8 []float64 `json:"clip_v8,omitempty"`
	// BitsK, BitsV: per-layer K and V widths in {2, 4, 8} chosen by
	// --kv-bits (cache "oscar-mixed"); absent when none were chosen. Both
	// or neither are present.
	BitsK []int `json:"bits_k,omitempty"`
	BitsV []int `json:"bits_v,omitempty"`
	// KVBits is the --kv-bits budget the widths were chosen for (average
	// bits per element at KVServingCtx tokens with the fp16 windows
	// KVSink and KVRecent); 0 without widths.
	KVBits       float64 `json:"kv_bits,omitempty"`
	KVServingCtx int     `json:"kv_serving_ctx,omitempty"`
	KVSink       int     `json:"kv_sink,omitempty"`
	KVRecent     int     `json:"kv_recent,omitempty"`
	// LmpackVersion is the version of the lmpack that wrote the file.
	LmpackVersion string `json:"lmpack_version"`
}

// TensorName returns the name of layer's rotation, which is "r_k" or
// "r_v": "oscar.layers.N.r_k".
func TensorName(layer int, which string) string {
	return Method + ".layers." + strconv.Itoa(layer) + "." + which
}

// WriteFile writes the rotations of layers to path, atomically and
// deterministically (safetensors.WriteFile): tensors TensorName(l, "r_k")
// and TensorName(l, "r_v"), F32 [d, d] row-major (x_rot = x·R), and h as
// JSON under "lmpack" with Kind, FormatVersion and Method filled in.
// h.ClipK and h.ClipV must have one ratio in (0, 1] per layer, and so
// must the 4- and 8-bit lists when present; BitsK and BitsV, when
// present, one width in {2, 4, 8} per layer each. Errors: mismatched
// lengths, bad ratios or widths, non-finite or non-orthogonal rotations
// (ErrBadRotation, naming the layer and field), I/O errors.
func WriteFile(path string, h RotationHeader, layers []Layer) error {
	h.Kind, h.FormatVersion, h.Method = Kind, FormatVersion, Method
	if err := checkHeader(path, &h, len(layers)); err != nil {
		return err
	}
	var ts []safetensors.WriteTensor
	for l, ly := range layers {
		for _, r := range []struct {
			which string
			m     []float64
		}{{"r_k", ly.RK}, {"r_v", ly.RV}} {
			name := TensorName(l, r.which)
			f := make([]float32, len(r.m))
			for i, x := range r.m {
				f[i] = float32(x)
			}
			if err := checkRotation(path, name, f, ly.HeadDim); err != nil {
				return err
			}
			ts = append(ts, safetensors.FromFloat32(name, []int{ly.HeadDim, ly.HeadDim}, f))
		}
	}
	js, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("oscar: %s: header: %w", path, err)
	}
	if err := safetensors.WriteFile(path, ts, map[string]string{model.MetadataKey: string(js)}); err != nil {
		return fmt.Errorf("oscar: %w", err)
	}
	return nil
}

// ReadFile reads and validates the rotation file at path: a safetensors
// file with a RotationHeader of Kind, FormatVersion and Method;
// model_fingerprint equal to want.ModelFingerprint when set; one clip_k
// and clip_v ratio in (0, 1] per layer, and so for the optional 4- and
// 8-bit lists (clip_k4, clip_v4, clip_k8, clip_v8); optional bits_k and
// bits_v (both or neither) with one width in {2, 4, 8} per layer; and per
// layer r_k and r_v, F32,
// [d, d] with d the layer's head_dim (want.Desc; when nil any square
// size), finite and orthogonal (max|R·Rᵀ − I| ≤ MaxOrthogonalityError).
// The number of layers is want.Desc's, or that of the clip lists.
//
// Errors (wrapped, naming path and the tensor or field): safetensors
// errors (a truncated file); ErrNotRotation; ErrVersion;
// ErrRotationModelMismatch (which wraps model.ErrModelMismatch) naming both fingerprints, saying "made by an older lmpack" for a
// fingerprint of an older lmpack (model.OlderFingerprint); ErrBadRotation.
func ReadFile(path string, want model.Expect) (*Rotations, *RotationHeader, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("oscar: reading rotation file: %w", err)
	}
	defer f.Close()
	js, ok := f.Metadata()[model.MetadataKey]
	if !ok {
		return nil, nil, fmt.Errorf("oscar: %s: no %q metadata: %w", path, model.MetadataKey, ErrNotRotation)
	}
	var h RotationHeader
	if err := json.Unmarshal([]byte(js), &h); err != nil {
		return nil, nil, fmt.Errorf("oscar: %s: %q metadata is not a valid header (%v): %w", path, model.MetadataKey, err, ErrNotRotation)
	}
	switch {
	case h.Kind != Kind:
		return nil, nil, fmt.Errorf("oscar: %s: kind %q, want %q: %w", path, h.Kind, Kind, ErrNotRotation)
	case h.FormatVersion != FormatVersion:
		return nil, nil, fmt.Errorf("oscar: %s: format_version %d, this lmpack reads %d: %w", path, h.FormatVersion, FormatVersion, ErrVersion)
	case h.Method != Method:
		return nil, nil, fmt.Errorf("oscar: %s: method %q, want %q: %w", path, h.Method, Method, ErrNotRotation)
	case want.ModelFingerprint != "" && h.ModelFingerprint != want.ModelFingerprint && model.OlderFingerprint(h.ModelFingerprint):
		return nil, nil, fmt.Errorf("oscar: %s: %w: its model_fingerprint %s does not cover the weights' values, so it cannot be checked against this model (fingerprint %s); re-run lmpack calibrate and lmpack quantize kv",
			path, rotationOutdated{}, h.ModelFingerprint, want.ModelFingerprint)
	case want.ModelFingerprint != "" && h.ModelFingerprint != want.ModelFingerprint:
		return nil, nil, fmt.Errorf("oscar: %s: model_fingerprint %s, but the model's fingerprint is %s (compute rotations for this model): %w",
			path, h.ModelFingerprint, want.ModelFingerprint, ErrRotationModelMismatch)
	}
	L := len(h.ClipK)
	if want.Desc != nil {
		L = len(want.Desc.Layers)
	}
	if err := checkHeader(path, &h, L); err != nil {
		return nil, nil, err
	}
	if n := len(f.Tensors()); n != 2*L {
		return nil, nil, fmt.Errorf("oscar: %s: %d tensors, want r_k and r_v for %d layers (%d): %w", path, n, L, 2*L, ErrBadRotation)
	}
	r := &Rotations{K: make([][]float32, L), V: make([][]float32, L), ClipK: h.ClipK, ClipV: h.ClipV,
		ClipK4: h.ClipK4, ClipV4: h.ClipV4, ClipK8: h.ClipK8, ClipV8: h.ClipV8, BitsK: h.BitsK, BitsV: h.BitsV}
	for l := 0; l < L; l++ {
		d := 0
		if want.Desc != nil {
			d = want.Desc.Layers[l].HeadDim
		}
		if r.K[l], d, err = readRotation(f, path, TensorName(l, "r_k"), d); err != nil {
			return nil, nil, err
		}
		if r.V[l], _, err = readRotation(f, path, TensorName(l, "r_v"), d); err != nil {
			return nil, nil, err
		}
	}
	return r, &h, nil
}

// checkHeader checks h's per-layer lists for L layers: clip_k and clip_v
// required, the 4- and 8-bit ratios optional, all in (0, 1]; bits_k and
// bits_v both or neither, widths in {2, 4, 8}. Errors name the field and
// the layer (ErrBadRotation).
func checkHeader(path string, h *RotationHeader, L int) error {
	for _, c := range []struct {
		name     string
		r        []float64
		required bool
	}{{"clip_k", h.ClipK, true}, {"clip_v", h.ClipV, true}, {"clip_k4", h.ClipK4, false}, {"clip_v4", h.ClipV4, false},
		{"clip_k8", h.ClipK8, false}, {"clip_v8", h.ClipV8, false}} {
		if c.r == nil && !c.required {
			continue
		}
		if len(c.r) != L {
			return fmt.Errorf("oscar: %s: %d %s ratios, want one per layer (%d): %w", path, len(c.r), c.name, L, ErrBadRotation)
		}
		for l, x := range c.r {
			if err := CheckClip(c.name, x); err != nil {
				return fmt.Errorf("oscar: %s: layer %d: %s %v: want a ratio in (0, 1]: %w", path, l, c.name, x, ErrBadRotation)
			}
		}
	}
	if (h.BitsK == nil) != (h.BitsV == nil) {
		return fmt.Errorf("oscar: %s: bits_k has %d and bits_v %d widths: want both (one per layer) or neither: %w", path, len(h.BitsK), len(h.BitsV), ErrBadRotation)
	}
	for _, c := range []struct {
		name string
		b    []int
	}{{"bits_k", h.BitsK}, {"bits_v", h.BitsV}} {
		if c.b == nil {
			continue
		}
		if len(c.b) != L {
			return fmt.Errorf("oscar: %s: %d %s widths, want one per layer (%d): %w", path, len(c.b), c.name, L, ErrBadRotation)
		}
		for l, b := range c.b {
			if !slices.Contains(Widths, b) {
				return fmt.Errorf("oscar: %s: layer %d: %s %d: want a width of 2, 4 or 8 bits: %w", path, l, c.name, b, ErrBadRotation)
			}
		}
	}
	if h.BitsK != nil && !(h.KVBits > 0 && h.KVServingCtx > 0 && h.KVSink >= 0 && h.KVRecent >= 0) {
		return fmt.Errorf("oscar: %s: per-layer widths with kv_bits %v, kv_serving_ctx %d, kv_sink %d, kv_recent %d: want a budget > 0, a serving context > 0 and windows ≥ 0: %w",
			path, h.KVBits, h.KVServingCtx, h.KVSink, h.KVRecent, ErrBadRotation)
	}
	return nil
}

// readRotation reads an F32 [d, d] rotation (d == 0: any square size) and
// checks it.
func readRotation(f *safetensors.File, path, name string, d int) ([]float32, int, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return nil, 0, fmt.Errorf("oscar: %w: %w", err, ErrBadRotation)
	}
	if t.DType != safetensors.F32 {
		return nil, 0, fmt.Errorf("oscar: %s: tensor %q: dtype %s, want F32: %w", path, name, t.DType, ErrBadRotation)
	}
	if d == 0 && len(t.Shape) == 2 && t.Shape[0] > 0 {
		d = t.Shape[0]
	}
	if len(t.Shape) != 2 || t.Shape[0] != d || t.Shape[1] != d {
		return nil, 0, fmt.Errorf("oscar: %s: tensor %q: shape %v, want [%d %d] (head_dim × head_dim): %w", path, name, t.Shape, d, d, ErrBadRotation)
	}
	r, err := t.Float32()
	if err != nil {
		return nil, 0, fmt.Errorf("oscar: %w: %w", err, ErrBadRotation)
	}
	if err := checkRotation(path, name, r, d); err != nil {
		return nil, 0, err
	}
	return r, d, nil
}

// checkRotation: r is [d, d], finite and orthogonal to
// MaxOrthogonalityError.
func checkRotation(path, name string, r []float32, d int) error {
	if d <= 0 || len(r) != d*d {
		return fmt.Errorf("oscar: %s: tensor %q: %d values, want %d×%d: %w", path, name, len(r), d, d, ErrBadRotation)
	}
	for i, x := range r {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return fmt.Errorf("oscar: %s: tensor %q: element %d (row %d, column %d) is %v: %w", path, name, i, i/d, i%d, x, ErrBadRotation)
		}
	}
	if e := Orthogonality(r, d); e > MaxOrthogonalityError {
		return fmt.Errorf("oscar: %s: tensor %q: not orthogonal (max|R·Rᵀ − I| = %.3g > %g): %w", path, name, e, MaxOrthogonalityError, ErrBadRotation)
	}
	return nil
}

// rotationMismatch is ErrRotationModelMismatch: its message speaks of the
// rotation file, and it unwraps to model.ErrModelMismatch.
type rotationMismatch struct{}

func (rotationMismatch) Error() string { return "rotation file is from another model" }
func (rotationMismatch) Unwrap() error { return model.ErrModelMismatch }

// rotationOutdated is what ReadFile wraps for a rotation file whose
// model_fingerprint an older lmpack made (model.OlderFingerprint); it
// unwraps to ErrRotationModelMismatch.
type rotationOutdated struct{}

func (rotationOutdated) Error() string { return "rotation file made by an older lmpack" }
func (rotationOutdated) Unwrap() error { return ErrRotationModelMismatch }
