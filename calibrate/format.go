package calibrate

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/model"
)

// Kind is Header.Kind of a calibration file.
const Kind = "lmpack-calibration"

// FormatVersion is the calibration file format this package writes and
// the only one it reads.
const FormatVersion = 1

// StatOSCAR is the Header.Statistics name of the OSCAR covariances
// (tensors "oscar.layers.N.c_q" and "oscar.layers.N.c_s").
const StatOSCAR = "oscar"

// Sentinel errors, wrapped (with the file and the field or tensor) by Read,
// Write and Run.
var (
	// ErrNotCalibration: the file is a safetensors file but not an lmpack
	// calibration file (no "lmpack" metadata, or another kind).
	ErrNotCalibration = errors.New("not an lmpack calibration file")
	// ErrVersion: the file's format_version is not FormatVersion.
	ErrVersion = errors.New("unsupported calibration format version")
	// ErrBadStatistic: a statistic tensor is missing, has the wrong dtype
	// or shape, or holds NaN/Inf.
	ErrBadStatistic = errors.New("bad calibration statistic")
)

// Header is the JSON object stored under model.MetadataKey. Field names are the
// JSON names in Go casing.
type Header struct {
	// FormatVersion is the file format version (FormatVersion).
	FormatVersion int `json:"format_version"`
	// Kind is always Kind.
	Kind string `json:"kind"`
	// ModelFingerprint identifies the model the statistics were computed
	// on (model.Fingerprint, lowercase hex sha256).
	ModelFingerprint string `json:"model_fingerprint"`
	// DataFingerprint is the lowercase hex sha256 of the calibration text
	// file's bytes.
	DataFingerprint string `json:"data_fingerprint"`
	// Tokens is the number of tokens the statistics were computed over.
	Tokens int `json:"tokens"`
	// Ctx is the window length in tokens (each window runs from position 0).
	Ctx int `json:"ctx"`
	// LmpackVersion is the version of the lmpack that wrote the file.
	LmpackVersion string `json:"lmpack_version"`
	// Statistics lists the statistics the file holds (StatOSCAR, ...).
	Statistics []string `json:"statistics"`
}

// OSCARLayer holds one decoder layer's OSCAR covariances (docs/METHODS.md
// §1), float64, row-major, symmetric positive semi-definite.
type OSCARLayer struct {
	// HeadDim is d, the layer's head_dim.
	HeadDim int
	// CQ is the key target covariance C_Q, [d, d].
	CQ []float64
	// CS is the value target covariance C_S, [d, d].
	CS []float64
}

// Calibration is the content of a calibration file.
type Calibration struct {
	Header Header
	// OSCAR has one entry per decoder layer when Header.Statistics lists
	// StatOSCAR; nil otherwise.
	OSCAR []OSCARLayer
	// Similarity, when Header.Statistics lists StatLoRP, is the
	// SimilarityTensor matrix: float64, row-major [(L+1)*(L+1)] (block
	// inputs 0..L−1 and the final-norm input as state L); nil otherwise
	// (files written before the statistic existed).
	Similarity []float64
	// TokenIDs, when Header.Statistics lists StatTokens, are the
	// Header.Tokens calibration token ids (TokensTensor); nil otherwise.
	TokenIDs []int
	// HeadProxy, when Header.Statistics lists StatHeads, is the head
	// proxy [L][num_key_value_heads of layer l] (float64, >= 0); nil
	// otherwise.
	HeadProxy [][]float64
	// Experts, when Header.Statistics lists StatExperts, holds one entry
	// per MoE layer, in layer order (see ExpertLayer); nil otherwise.
	Experts []ExpertLayer
}

// SimilaritySide returns the side L+1 of c.Similarity, or 0 when absent.
func (c *Calibration) SimilaritySide() int {
	for m := 1; m*m <= len(c.Similarity); m++ {
		if m*m == len(c.Similarity) {
			return m
		}
	}
	return 0
}

// Has reports whether the calibration holds the named statistic.
func (c *Calibration) Has(stat string) bool { return slices.Contains(c.Header.Statistics, stat) }

// OSCARTensorName returns the tensor name of OSCAR statistic stat ("c_q"
// or "c_s") of layer, e.g. "oscar.layers.3.c_q".
func OSCARTensorName(layer int, stat string) string {
	return StatOSCAR + ".layers." + strconv.Itoa(layer) + "." + stat
}

// Fingerprint returns the lowercase hex sha256 of b (DataFingerprint of a
// text file's bytes; the calibration fingerprint of a calibration file).
func Fingerprint(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Write writes c to path as a calibration file, atomically
// (safetensors.WriteFile): tensors OSCARTensorName(l, "c_q"|"c_s"), F64,
// [d, d], SimilarityTensor F64 [L+1, L+1] when c.Similarity is set,
// HeadProxyTensorName(l) F64 [num_key_value_heads] when c.HeadProxy is set,
// TokensTensor when c.TokenIDs is set, the StatExperts tensors
// (ExpertTensorName) when c.Experts is set, and
// the Header as JSON under model.MetadataKey. Kind and FormatVersion
// are filled in; Statistics is set from the statistics c holds. The output
// is deterministic. Errors: a layer whose matrices are not [d, d] or hold
// NaN/Inf (ErrBadStatistic, naming the tensor), and I/O errors.
func Write(path string, c *Calibration) error { return write(path, c, nil) }

// write is Write; when c.Experts is nil and experts is not, the
// StatExperts tensors come from experts (already encoded and checked, e.g.
// streamed from the per-pass files of Run) in place of c.Experts.
func write(path string, c *Calibration, experts []safetensors.WriteTensor) error {
	h := c.Header
	h.Kind, h.FormatVersion = Kind, FormatVersion
	h.Statistics = nil
	var ts []safetensors.WriteTensor
	if c.OSCAR != nil {
		h.Statistics = append(h.Statistics, StatOSCAR)
		for l, lay := range c.OSCAR {
			for _, s := range []struct {
				name string
				m    []float64
			}{{"c_q", lay.CQ}, {"c_s", lay.CS}} {
				name := OSCARTensorName(l, s.name)
				d := lay.HeadDim
				if d <= 0 || len(s.m) != d*d {
					return fmt.Errorf("calibrate: %s: tensor %q: %d values for head_dim %d, want %d: %w", path, name, len(s.m), d, d*d, ErrBadStatistic)
				}
				if i := firstNonFinite(s.m); i >= 0 {
					return fmt.Errorf("calibrate: %s: tensor %q: element %d is %v: %w", path, name, i, s.m[i], ErrBadStatistic)
				}
				ts = append(ts, safetensors.WriteTensor{Name: name, DType: safetensors.F64, Shape: []int{d, d}, Data: f64Bytes(s.m)})
			}
		}
	}
	if c.Similarity != nil {
		m := c.SimilaritySide()
		if m < 2 {
			return fmt.Errorf("calibrate: %s: tensor %q: %d values, want (L+1)² with L >= 1: %w", path, SimilarityTensor, len(c.Similarity), ErrBadStatistic)
		}
		if i := firstNonFinite(c.Similarity); i >= 0 {
			return fmt.Errorf("calibrate: %s: tensor %q: element %d is %v: %w", path, SimilarityTensor, i, c.Similarity[i], ErrBadStatistic)
		}
		h.Statistics = append(h.Statistics, StatLoRP)
		ts = append(ts, safetensors.WriteTensor{Name: SimilarityTensor, DType: safetensors.F64, Shape: []int{m, m}, Data: f64Bytes(c.Similarity)})
	}
	if c.TokenIDs != nil {
		if len(c.TokenIDs) != h.Tokens {
			return fmt.Errorf("calibrate: %s: tensor %q: %d ids, the header says %d tokens: %w", path, TokensTensor, len(c.TokenIDs), h.Tokens, ErrBadStatistic)
		}
		t, err := tokensTensor(path, c.TokenIDs)
		if err != nil {
			return err
		}
		h.Statistics = append(h.Statistics, StatTokens)
		ts = append(ts, t)
	}
	if c.HeadProxy != nil {
		ht, err := headTensors(path, c.HeadProxy)
		if err != nil {
			return err
		}
		h.Statistics = append(h.Statistics, StatHeads)
		ts = append(ts, ht...)
	}
	if c.Experts != nil {
		et, err := expertTensors(path, c.Experts, h.Tokens)
		if err != nil {
			return err
		}
		h.Statistics = append(h.Statistics, StatExperts)
		ts = append(ts, et...)
	} else if experts != nil {
		h.Statistics = append(h.Statistics, StatExperts)
		ts = append(ts, experts...)
	}
	js, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("calibrate: %s: header: %w", path, err)
	}
	if err := safetensors.WriteFile(path, ts, map[string]string{model.MetadataKey: string(js)}); err != nil {
		return fmt.Errorf("calibrate: %w", err)
	}
	return nil
}

// calibrationMismatch is what Read wraps for a calibration file of
// another model: its message speaks of the calibration file, and it
// unwraps to model.ErrModelMismatch.
type calibrationMismatch struct{}

func (calibrationMismatch) Error() string { return "calibration file is from another model" }
func (calibrationMismatch) Unwrap() error { return model.ErrModelMismatch }

// calibrationOutdated is what Read wraps for a calibration file whose
// model_fingerprint an older lmpack made (model.OlderFingerprint); it
// unwraps to calibrationMismatch and so to model.ErrModelMismatch.
type calibrationOutdated struct{}

func (calibrationOutdated) Error() string { return "calibration file made by an older lmpack" }
func (calibrationOutdated) Unwrap() error { return calibrationMismatch{} }

// Read reads and validates the calibration file at path: a safetensors
// file (safetensors.Open's checks, which catch truncation) whose metadata
// holds a Header of Kind and FormatVersion; model_fingerprint equal to
// want.ModelFingerprint when that is set; and for each statistic it knows
// (StatOSCAR) every layer's tensors present, F64, [d, d] with d the layer's
// head_dim from want.Desc (or square and equal in c_q and c_s when Desc is
// nil), and finite; for StatLoRP, SimilarityTensor F64 [L+1, L+1] (L from
// want.Desc, any square side >= 2 when Desc is nil) and finite; for
// StatExperts, exactly the model's MoE layers (when Desc is set), I64
// counts in [0, tokens] and finite F64 Hessians of the model's shapes.
// Statistics it does not know are listed in the Header
// and otherwise ignored.
//
// Errors (wrapped, naming path and the field or tensor): safetensors
// errors; ErrNotCalibration; ErrVersion; model.ErrModelMismatch naming both
// fingerprints (saying "made by an older lmpack ... re-run lmpack
// calibrate" when the file's is an older lmpack's fingerprint,
// model.OlderFingerprint); ErrBadStatistic.
func Read(path string, want model.Expect) (*Calibration, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("calibrate: reading calibration file: %w", err)
	}
	defer f.Close()
	js, ok := f.Metadata()[model.MetadataKey]
	if !ok {
		return nil, fmt.Errorf("calibrate: %s: no %q metadata: %w", path, model.MetadataKey, ErrNotCalibration)
	}
	var h Header
	if err := json.Unmarshal([]byte(js), &h); err != nil {
		return nil, fmt.Errorf("calibrate: %s: %q metadata is not a valid header (%v): %w", path, model.MetadataKey, err, ErrNotCalibration)
	}
	if h.Kind != Kind {
		return nil, fmt.Errorf("calibrate: %s: kind %q, want %q: %w", path, h.Kind, Kind, ErrNotCalibration)
	}
	if h.FormatVersion != FormatVersion {
		return nil, fmt.Errorf("calibrate: %s: format_version %d, this lmpack reads %d: %w", path, h.FormatVersion, FormatVersion, ErrVersion)
	}
	if want.ModelFingerprint != "" && h.ModelFingerprint != want.ModelFingerprint && model.OlderFingerprint(h.ModelFingerprint) {
		return nil, fmt.Errorf("calibrate: %s: %w: its model_fingerprint %s does not cover the weights' values, so it cannot be checked against this model (fingerprint %s); re-run lmpack calibrate",
			path, calibrationOutdated{}, h.ModelFingerprint, want.ModelFingerprint)
	}
	if want.ModelFingerprint != "" && h.ModelFingerprint != want.ModelFingerprint {
		return nil, fmt.Errorf("calibrate: %s: model_fingerprint %s, but the model's fingerprint is %s (calibrate this model again): %w",
			path, h.ModelFingerprint, want.ModelFingerprint, calibrationMismatch{})
	}
	if h.Tokens <= 0 || h.Ctx <= 0 {
		return nil, fmt.Errorf("calibrate: %s: tokens %d, ctx %d: want both > 0: %w", path, h.Tokens, h.Ctx, ErrNotCalibration)
	}
	c := &Calibration{Header: h}
	if c.Has(StatOSCAR) {
		if c.OSCAR, err = readOSCAR(f, path, want.Desc); err != nil {
			return nil, err
		}
	}
	if c.Has(StatLoRP) {
		L := 0
		if want.Desc != nil {
			L = len(want.Desc.Layers)
		}
		if c.Similarity, err = readSimilarity(f, path, L); err != nil {
			return nil, err
		}
	}
	if c.Has(StatTokens) {
		vocab := 0
		if want.Desc != nil {
			vocab = want.Desc.VocabSize
		}
		if c.TokenIDs, err = readTokens(f, path, h.Tokens, vocab); err != nil {
			return nil, err
		}
	}
	if c.Has(StatHeads) {
		if c.HeadProxy, err = readHeads(f, path, want.Desc); err != nil {
			return nil, err
		}
	}
	if c.Has(StatExperts) {
		if c.Experts, err = readExperts(f, path, want.Desc, h.Tokens); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// readOSCAR reads every layer's c_q and c_s.
func readOSCAR(f *safetensors.File, path string, d *arch.Description) ([]OSCARLayer, error) {
	// Layers present in the file: indices 0..n-1 without gaps.
	n := 0
	for _, ti := range f.Tensors() {
		var l int
		var stat string
		if _, err := fmt.Sscanf(ti.Name, StatOSCAR+".layers.%d.%s", &l, &stat); err == nil && ti.Name == OSCARTensorName(l, stat) {
			n = max(n, l+1)
		}
	}
	if n > len(f.Tensors()) {
		return nil, fmt.Errorf("calibrate: %s: %q tensors name layer %d but the file holds only %d tensors: %w", path, StatOSCAR, n-1, len(f.Tensors()), ErrBadStatistic)
	}
	if d != nil && n != len(d.Layers) {
		return nil, fmt.Errorf("calibrate: %s: %q statistics for %d layers, the model has %d: %w", path, StatOSCAR, n, len(d.Layers), ErrBadStatistic)
	}
	if n == 0 {
		return nil, fmt.Errorf("calibrate: %s: statistics list %q but the file has no %q tensor: %w", path, StatOSCAR, OSCARTensorName(0, "c_q"), ErrBadStatistic)
	}
	out := make([]OSCARLayer, n)
	for l := range out {
		hd := 0
		if d != nil {
			hd = d.Layers[l].HeadDim
		}
		cq, hd, err := readSquare(f, path, OSCARTensorName(l, "c_q"), hd)
		if err != nil {
			return nil, err
		}
		cs, _, err := readSquare(f, path, OSCARTensorName(l, "c_s"), hd)
		if err != nil {
			return nil, err
		}
		out[l] = OSCARLayer{HeadDim: hd, CQ: cq, CS: cs}
	}
	return out, nil
}

// readSquare reads an F64 [d, d] tensor; d == 0 accepts any square shape
// and returns its size.
func readSquare(f *safetensors.File, path, name string, d int) ([]float64, int, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return nil, 0, fmt.Errorf("calibrate: %w: %w", err, ErrBadStatistic)
	}
	if t.DType != safetensors.F64 {
		return nil, 0, fmt.Errorf("calibrate: %s: tensor %q: dtype %s, want F64: %w", path, name, t.DType, ErrBadStatistic)
	}
	if d == 0 && len(t.Shape) == 2 && t.Shape[0] > 0 {
		d = t.Shape[0]
	}
	if len(t.Shape) != 2 || t.Shape[0] != d || t.Shape[1] != d {
		return nil, 0, fmt.Errorf("calibrate: %s: tensor %q: shape %v, want [%d %d]: %w", path, name, t.Shape, d, d, ErrBadStatistic)
	}
	m := make([]float64, d*d)
	for i := range m {
		m[i] = math.Float64frombits(binary.LittleEndian.Uint64(t.Data[8*i:]))
	}
	if i := firstNonFinite(m); i >= 0 {
		return nil, 0, fmt.Errorf("calibrate: %s: tensor %q: element %d (row %d, column %d) is %v: %w", path, name, i, i/d, i%d, m[i], ErrBadStatistic)
	}
	return m, d, nil
}

func f64Bytes(v []float64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(x))
	}
	return b
}

// firstNonFinite returns the index of the first NaN or ±Inf in v, or -1.
func firstNonFinite(v []float64) int {
	for i, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return i
		}
	}
	return -1
}
