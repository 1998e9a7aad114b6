package pack

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/lmpack/lmpack/formats/arch"
)

// Manifest is the artifact's JSON manifest (docs/FORMAT.md "Manifest").
// Field names are the JSON names in Go casing. It is encoded with
// encoding/json from these structs (so key order is fixed) and decoded
// strictly: unknown fields and trailing data are ErrFormat.
type Manifest struct {
	// FormatVersion equals the header's format version: 1, or 2
	// (QuantFormatVersion) when any tensor is quantized.
	FormatVersion int `json:"format_version"`
	// Model describes the architecture, layer by layer.
	Model Model `json:"model"`
	// Files lists embedded non-tensor files (config.json, tokenizer.json,
	// ...), each stored as one uncompressed or lz4 section.
	Files []FileEntry `json:"files"`
	// Tokenizer names the section holding tokenizer.json; empty when the
	// artifact carries no tokenizer.
	Tokenizer string `json:"tokenizer,omitempty"`
	// KV is the KV-cache scheme; nil for a plain (unrotated) cache.
	KV *KVScheme `json:"kv,omitempty"`
	// Tensors lists every tensor, sorted by name.
	Tensors []TensorEntry `json:"tensors"`
	// WeightsMethod is the weight-quantization method (QuantMethods: "rtn"
	// or "gptq"; informational, format version 2), empty when no tensor
	// is quantized.
	WeightsMethod string `json:"weights_method,omitempty"`
	// Provenance says where the artifact came from.
	Provenance Provenance `json:"provenance"`
}

// Model mirrors arch.Description in snake_case (see that type for units
// and shapes).
type Model struct {
	Architecture          string       `json:"architecture"`
	ModelType             string       `json:"model_type"`
	HiddenSize            int          `json:"hidden_size"`
	VocabSize             int          `json:"vocab_size"`
	MaxPositionEmbeddings int          `json:"max_position_embeddings"`
	RMSNormEps            float64      `json:"rms_norm_eps"`
	RoPETheta             float64      `json:"rope_theta"`
	RoPEScaling           *RoPEScaling `json:"rope_scaling,omitempty"`
	TieWordEmbeddings     bool         `json:"tie_word_embeddings"`
	BOSTokenID            int          `json:"bos_token_id"`
	EOSTokenIDs           []int        `json:"eos_token_ids"`
	Embedding             string       `json:"embedding"`
	FinalNorm             string       `json:"final_norm"`
	LMHead                string       `json:"lm_head,omitempty"`
	Layers                []Layer      `json:"layers"`
}

// RoPEScaling mirrors arch.RoPEScaling.
type RoPEScaling struct {
	Type                          string  `json:"type"`
	Factor                        float64 `json:"factor"`
	LowFreqFactor                 float64 `json:"low_freq_factor,omitempty"`
	HighFreqFactor                float64 `json:"high_freq_factor,omitempty"`
	OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings,omitempty"`
}

// Layer mirrors arch.Layer: per-layer head counts, head_dim, window and
// FFN sizes (heterogeneous after pruning), and the tensor names.
type Layer struct {
	NumAttentionHeads int       `json:"num_attention_heads"`
	NumKeyValueHeads  int       `json:"num_key_value_heads"`
	HeadDim           int       `json:"head_dim"`
	SlidingWindow     int       `json:"sliding_window,omitempty"`
	Attention         Attention `json:"attention"`
	FFNNorm           string    `json:"ffn_norm"`
	MLP               *MLP      `json:"mlp,omitempty"`
	MoE               *MoE      `json:"moe,omitempty"`
}

// Attention mirrors arch.Attention (empty name: tensor absent).
type Attention struct {
	Norm  string `json:"norm"`
	Q     string `json:"q"`
	K     string `json:"k"`
	V     string `json:"v"`
	O     string `json:"o"`
	QBias string `json:"q_bias,omitempty"`
	KBias string `json:"k_bias,omitempty"`
	VBias string `json:"v_bias,omitempty"`
	OBias string `json:"o_bias,omitempty"`
	QNorm string `json:"q_norm,omitempty"`
	KNorm string `json:"k_norm,omitempty"`
}

// MLP mirrors arch.MLP: Gate, Up [intermediate_size, hidden]; Down
// [hidden, intermediate_size].
type MLP struct {
	Gate             string `json:"gate"`
	Up               string `json:"up"`
	Down             string `json:"down"`
	IntermediateSize int    `json:"intermediate_size"`
}

// MoE mirrors arch.MoE.
type MoE struct {
	Router       string `json:"router"`
	NumExperts   int    `json:"num_experts"`
	TopK         int    `json:"top_k"`
	NormTopKProb bool   `json:"norm_topk_prob"`
	Experts      []MLP  `json:"experts"`
	Shared       *MLP   `json:"shared,omitempty"`
	SharedGate   string `json:"shared_gate,omitempty"`
}

// FileEntry is an embedded file: its original base name and its section.
type FileEntry struct {
	Name    string `json:"name"`
	Section string `json:"section"`
}

// KVScheme is the KV-cache quantization scheme the runtime builds for
// the artifact (run and eval use it instead of a float32 cache).
//
// Cache is the runtime/kvcache method name ("oscar2", "oscar4", "kivi2",
// "int2-naive", ...; kvcache.Methods). Method is the rotation method
// ("oscar") when Rotations are present, else empty. Rotations lists, per
// layer in order 0..L-1, the sections of the key and value rotations (F32
// [head_dim, head_dim] row-major, applied as k·R); only oscar2 and oscar4
// take them (and oscar-mixed). ClipK, ClipV are per-layer clip ratios in
// (0, 1] of the 2-bit sides; ClipK4 … ClipV8 those of the 4- and 8-bit
// sides (nil: no clipping); BitsK, BitsV the per-layer widths (2, 4 or
// 8) of oscar-mixed (kvcache.Rotations' fields of the same names). Sink and
// Recent are the fp16 windows in tokens (kvcache.Options; 0 = none, or
// the method's default residual).
type KVScheme struct {
	Cache                  string        `json:"cache"`
	Method                 string        `json:"method,omitempty"`
	ModelFingerprint       string        `json:"model_fingerprint,omitempty"`
	CalibrationFingerprint string        `json:"calibration_fingerprint,omitempty"`
	Rotations              []KVRotations `json:"rotations,omitempty"`
	ClipK                  []float64     `json:"clip_k,omitempty"`
	ClipV                  []float64     `json:"clip_v,omitempty"`
	ClipK4                 []float64     `json:"clip_k4,omitempty"`
	ClipV4                 []float64     `json:"clip_v4,omitempty"`
	ClipK8                 []float64     `json:"clip_k8,omitempty"`
	ClipV8                 []float64     `json:"clip_v8,omitempty"`
	BitsK                  []int         `json:"bits_k,omitempty"`
	BitsV                  []int         `json:"bits_v,omitempty"`
	Sink                   int           `json:"sink,omitempty"`
	Recent                 int           `json:"recent,omitempty"`
}

// KVRotations names one layer's rotation sections.
type KVRotations struct {
	Layer int    `json:"layer"`
	K     string `json:"k"`
	V     string `json:"v"`
}

// TensorEntry describes one tensor: its section, dtype (safetensors
// spelling: F32, BF16, F16, ...), row-major shape, and for quantized
// tensors the quantization format (nil for plain dtypes; see QuantFormat
// for what Section, DType and Shape mean then).
type TensorEntry struct {
	Name    string       `json:"name"`
	Section string       `json:"section"`
	DType   string       `json:"dtype"`
	Shape   []int        `json:"shape"`
	Quant   *QuantFormat `json:"quant,omitempty"`
}

// QuantFormat is the storage of one quantized Linear weight (format
// version 2; docs/FORMAT.md "Quantized tensors"), the lmpack-wq v1 layout
// of docs/QUANT.md moved into sections. The TensorEntry's Name is the
// weight's name (NAME.weight), its Shape the logical [rows, cols], its
// DType "U8" and its Section the packed codes U8 [rows, ceil(cols·bits/8)]
// (NAME.qweight). The runtime dequantizes it at load exactly as it does a
// quantized checkpoint (runtime.ReadQuantized): ŵ[r, c] = s·(q − z).
type QuantFormat struct {
	// Bits per code: 2, 3, 4 or 8.
	Bits int `json:"bits"`
	// GroupSize is the number of consecutive (storage-order) input columns
	// sharing one scale and zero-point; it divides cols (= cols for
	// per-channel).
	GroupSize int `json:"group_size"`
	// ScaleDType is the dtype of the scales: "F16" (the only one defined).
	ScaleDType string `json:"scale_dtype"`
	// ScaleSection holds the scales [rows, cols/group_size] (NAME.scales).
	ScaleSection string `json:"scale_section"`
	// ZeroDType ("F16": integers in [0, 2^bits−1], exact in fp16) and
	// ZeroSection (NAME.qzeros, [rows, cols/group_size]) are empty for a
	// symmetric tensor, whose zero-point is 2^(bits−1).
	ZeroDType   string `json:"zero_dtype,omitempty"`
	ZeroSection string `json:"zero_section,omitempty"`
	// PermSection (NAME.perm, I32 [cols]: storage column j holds input
	// column perm[j]) is set for GPTQ act-order tensors; empty: identity.
	PermSection string `json:"perm_section,omitempty"`
	// PackingOrder is the order of codes within each row's byte stream:
	// "lsb_first" (the only one defined: code j occupies stream bits
	// [j·bits, (j+1)·bits), bit k of the stream is bit k%8 of byte k/8).
	PackingOrder string `json:"packing_order"`
}

// Symmetric reports whether the tensor has no stored zero-points.
func (q *QuantFormat) Symmetric() bool { return q.ZeroSection == "" }

// Provenance records where an artifact came from.
type Provenance struct {
	// SourceModelFingerprint is model.Fingerprint of the source.
	SourceModelFingerprint string `json:"source_model_fingerprint"`
	// CalibrationFingerprint is the calibration data's fingerprint, when
	// any stage used calibration.
	CalibrationFingerprint string `json:"calibration_fingerprint,omitempty"`
	// Recipe is the recipe the artifact was built with (free JSON, stored
	// compacted); omitted when none.
	Recipe json.RawMessage `json:"recipe,omitempty"`
	// LmpackVersion is the version of the lmpack that wrote the artifact.
	LmpackVersion string `json:"lmpack_version"`
}

// ModelFromDescription converts an arch.Description to its manifest form.
func ModelFromDescription(d *arch.Description) Model {
	m := Model{
		Architecture: d.Architecture, ModelType: d.ModelType, HiddenSize: d.HiddenSize,
		VocabSize: d.VocabSize, MaxPositionEmbeddings: d.MaxPositionEmbeddings,
		RMSNormEps: d.RMSNormEps, RoPETheta: d.RoPE.Theta, TieWordEmbeddings: d.TieWordEmbeddings,
		BOSTokenID: d.BOSTokenID, EOSTokenIDs: append([]int{}, d.EOSTokenIDs...),
		Embedding: d.Embedding, FinalNorm: d.FinalNorm, Layers: []Layer{},
	}
	if !d.TieWordEmbeddings {
		m.LMHead = d.LMHead
	}
	if s := d.RoPE.Scaling; s != nil {
		m.RoPEScaling = &RoPEScaling{s.Type, s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositionEmbeddings}
	}
	mlp := func(x *arch.MLP) *MLP {
		if x == nil {
			return nil
		}
		return &MLP{x.Gate, x.Up, x.Down, x.IntermediateSize}
	}
	for _, l := range d.Layers {
		a := l.Attn
		ml := Layer{
			NumAttentionHeads: l.NumHeads, NumKeyValueHeads: l.NumKVHeads, HeadDim: l.HeadDim,
			SlidingWindow: l.SlidingWindow, FFNNorm: l.FFNNorm, MLP: mlp(l.MLP),
			Attention: Attention{a.Norm, a.Q, a.K, a.V, a.O, a.QBias, a.KBias, a.VBias, a.OBias, a.QNorm, a.KNorm},
		}
		if e := l.MoE; e != nil {
			mo := &MoE{Router: e.Router, NumExperts: e.NumExperts, TopK: e.TopK, NormTopKProb: e.NormTopKProb,
				Shared: mlp(e.Shared), SharedGate: e.SharedGate, Experts: []MLP{}}
			for i := range e.Experts {
				mo.Experts = append(mo.Experts, *mlp(&e.Experts[i]))
			}
			ml.MoE = mo
		}
		m.Layers = append(m.Layers, ml)
	}
	return m
}

// decodeManifest parses b strictly: unknown fields and trailing bytes are
// ErrFormat; a format_version outside [MinFormatVersion, FormatVersion],
// or a quantized tensor in a version-1 manifest, is ErrVersion.
func decodeManifest(path string, b []byte) (*Manifest, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("pack: %s: manifest: %v: %w", path, err, ErrFormat)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("pack: %s: manifest: trailing data after the JSON object: %w", path, ErrFormat)
	}
	if m.FormatVersion < MinFormatVersion || m.FormatVersion > FormatVersion {
		return nil, fmt.Errorf("pack: %s: manifest format_version %d, this lmpack reads %d..%d: %w", path, m.FormatVersion, MinFormatVersion, FormatVersion, ErrVersion)
	}
	if m.FormatVersion < QuantFormatVersion {
		if m.WeightsMethod != "" {
			return nil, fmt.Errorf("pack: %s: manifest format_version %d has weights_method, which needs format version %d: %w", path, m.FormatVersion, QuantFormatVersion, ErrVersion)
		}
		for _, t := range m.Tensors {
			if t.Quant != nil {
				return nil, fmt.Errorf("pack: %s: manifest format_version %d: tensor %q is quantized, which needs format version %d: %w", path, m.FormatVersion, t.Name, QuantFormatVersion, ErrVersion)
			}
		}
	}
	return &m, nil
}
