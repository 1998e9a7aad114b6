package arch

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
)

// QuantKey is the config.json key of lmpack's weight-quantization block.
// It is deliberately not "quantization_config": stock loaders would take
// that for one of their own formats (GPTQ, AWQ), and Parse refuses foreign
// quantization_config blocks.
const QuantKey = "lmpack_quantization"

// QuantFormat and QuantVersion identify the quantized checkpoint format
// this package reads (docs/QUANT.md). A block with another format or a
// newer version is refused.
const (
	QuantFormat  = "lmpack-wq"
	QuantVersion = 1
)

// Storage tensor suffixes of a quantized Linear weight NAME.weight (the
// prefix NAME is the weight name without ".weight"); see docs/QUANT.md.
const (
	// SuffixQWeight: U8 [rows, ceil(cols·bits/8)], packed codes, one
	// LSB-first bit stream per row (quantize/weights packing order).
	SuffixQWeight = ".qweight"
	// SuffixScales: F16 [rows, cols/group_size], scales > 0.
	SuffixScales = ".scales"
	// SuffixQZeros: F16 [rows, cols/group_size], integer zero-points in
	// [0, 2^bits−1] (exact in fp16), at 1 bit any finite value;
	// asymmetric tensors only.
	SuffixQZeros = ".qzeros"
	// SuffixPerm: I32 [cols], storage column j holds original input column
	// perm[j]; only for act-order tensors with several groups per row.
	SuffixPerm = ".perm"
)

// ErrQuant is wrapped by Parse for a malformed lmpack_quantization block.
var ErrQuant = errors.New("bad lmpack_quantization block")

// Quantization is config.json's lmpack_quantization block: which Linear
// weights are stored quantized, and how.
type Quantization struct {
	// Format is QuantFormat; Version is QuantVersion.
	Format  string `json:"format"`
	Version int    `json:"version"`
	// Method is informational ("rtn", "gptq", "mixed").
	Method string `json:"method,omitempty"`
	// Tensors maps a weight tensor name of the description (e.g.
	// "model.layers.0.self_attn.q_proj.weight") to its quantization.
	// Weights not listed are stored as plain float tensors.
	Tensors map[string]TensorQuant `json:"tensors"`
}

// TensorQuant is the quantization of one [rows, cols] weight.
type TensorQuant struct {
	// Bits per code: 1 (asymmetric only; fractional zero-point), 2, 3, 4
	// or 8.
	Bits int `json:"bits"`
	// GroupSize is the number of consecutive (storage-order) input columns
	// sharing a scale and zero-point; it divides cols and equals cols for
	// per-channel quantization.
	GroupSize int `json:"group_size"`
	// Symmetric: no stored zero-points, the zero-point is 2^(bits−1).
	Symmetric bool `json:"symmetric"`
	// Perm: the tensor has a NAME.perm column permutation (GPTQ act-order).
	Perm bool `json:"perm,omitempty"`
}

// QuantPrefix returns the storage prefix of a quantized weight name
// ("x.weight" → "x").
func QuantPrefix(weight string) string { return strings.TrimSuffix(weight, ".weight") }

// QuantStorage returns the storage tensors of weight name (shape
// [rows, cols]) quantized as q: name → row-major shape. Dtypes: qweight
// U8, scales F16, qzeros U8, perm I32 (see the Suffix constants).
func QuantStorage(name string, rows, cols int, q TensorQuant) map[string][]int {
	p := QuantPrefix(name)
	g := cols / max(q.GroupSize, 1)
	s := map[string][]int{
		p + SuffixQWeight: {rows, (cols*q.Bits + 7) / 8},
		p + SuffixScales:  {rows, g},
	}
	if !q.Symmetric {
		s[p+SuffixQZeros] = []int{rows, g}
	}
	if q.Perm {
		s[p+SuffixPerm] = []int{cols}
	}
	return s
}

// parseQuant reads the lmpack_quantization block of configJSON (nil when
// absent) and checks it against d: known format and version, every
// tensor a 2-d weight of d other than the embedding, ending in ".weight",
// with valid bits and a group size dividing its columns.
func parseQuant(configJSON []byte, d *Description) (*Quantization, error) {
	var head map[string]json.RawMessage
	if err := json.Unmarshal(configJSON, &head); err != nil {
		return nil, fmt.Errorf("arch: config.json: %w", err)
	}
	raw, ok := head[QuantKey]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	var q Quantization
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		return nil, fmt.Errorf("arch: config.json: %s: %w: %v", QuantKey, ErrQuant, err)
	}
	if q.Format != QuantFormat {
		return nil, fmt.Errorf("arch: config.json: %s: %w: format %q, want %q", QuantKey, ErrQuant, q.Format, QuantFormat)
	}
	if q.Version < 1 || q.Version > QuantVersion {
		return nil, fmt.Errorf("arch: config.json: %s: %w: version %d, this lmpack reads versions 1..%d", QuantKey, ErrQuant, q.Version, QuantVersion)
	}
	shapes := d.TensorShapes()
	names := make([]string, 0, len(q.Tensors))
	for n := range q.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := q.Tensors[n]
		sh, ok := shapes[n]
		switch {
		case !ok:
			return nil, fmt.Errorf("arch: config.json: %s: %w: tensor %q is not a tensor of this model", QuantKey, ErrQuant, n)
		case len(sh) != 2 || !strings.HasSuffix(n, ".weight") || n == d.Embedding:
			return nil, fmt.Errorf("arch: config.json: %s: %w: tensor %q cannot be quantized (only 2-d .weight matrices other than the embedding)", QuantKey, ErrQuant, n)
		case !slices.Contains([]int{1, 2, 3, 4, 8}, t.Bits):
			return nil, fmt.Errorf("arch: config.json: %s: %w: tensor %q: bits %d, want 1, 2, 3, 4 or 8", QuantKey, ErrQuant, n, t.Bits)
		case t.Bits == 1 && t.Symmetric:
			return nil, fmt.Errorf("arch: config.json: %s: %w: tensor %q: 1 bit is asymmetric only", QuantKey, ErrQuant, n)
		case t.GroupSize <= 0 || sh[1]%t.GroupSize != 0:
			return nil, fmt.Errorf("arch: config.json: %s: %w: tensor %q: group_size %d must be > 0 and divide its %d columns", QuantKey, ErrQuant, n, t.GroupSize, sh[1])
		}
	}
	return &q, nil
}

// StorageShapes returns every tensor a checkpoint of d stores, with its
// row-major shape: TensorShapes, with each quantized weight replaced by
// its QuantStorage tensors.
func (d *Description) StorageShapes() map[string][]int {
	s := d.TensorShapes()
	if d.Quant == nil {
		return s
	}
	for n, q := range d.Quant.Tensors {
		sh, ok := s[n]
		if !ok || len(sh) != 2 {
			continue
		}
		delete(s, n)
		for k, v := range QuantStorage(n, sh[0], sh[1], q) {
			s[k] = v
		}
	}
	return s
}
