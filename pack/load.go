package pack

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// consumption tracks which manifest tensors a loader has read through
// Reader.Tensor.
type consumption struct {
	mu   sync.Mutex
	used map[string]bool
}

// Description converts the manifest's model back to an arch.Description
// (the inverse of ModelFromDescription; a tied model without an lm_head
// name gets arch's default "lm_head.weight", which the runtime ignores
// when tied) and validates it.
//
// Errors: the arch.Validate error, wrapped with "pack:" and the artifact
// path (ErrFormat is not wrapped: the manifest parsed, the model it
// describes is unusable).
func (r *Reader) Description() (*arch.Description, error) {
	m := &r.manifest.Model
	d := &arch.Description{
		Architecture: m.Architecture, ModelType: m.ModelType, HiddenSize: m.HiddenSize,
		VocabSize: m.VocabSize, MaxPositionEmbeddings: m.MaxPositionEmbeddings,
		RMSNormEps: m.RMSNormEps, RoPE: arch.RoPE{Theta: m.RoPETheta}, TieWordEmbeddings: m.TieWordEmbeddings,
		BOSTokenID: m.BOSTokenID, EOSTokenIDs: slices.Clone(m.EOSTokenIDs),
		Embedding: m.Embedding, FinalNorm: m.FinalNorm, LMHead: m.LMHead,
	}
	if d.LMHead == "" && d.TieWordEmbeddings {
		d.LMHead = "lm_head.weight"
	}
	if s := m.RoPEScaling; s != nil {
		d.RoPE.Scaling = &arch.RoPEScaling{Type: s.Type, Factor: s.Factor, LowFreqFactor: s.LowFreqFactor,
			HighFreqFactor: s.HighFreqFactor, OriginalMaxPositionEmbeddings: s.OriginalMaxPositionEmbeddings}
	}
	mlp := func(x *MLP) *arch.MLP {
		if x == nil {
			return nil
		}
		return &arch.MLP{Gate: x.Gate, Up: x.Up, Down: x.Down, IntermediateSize: x.IntermediateSize}
	}
	for _, l := range m.Layers {
		a := l.Attention
		al := arch.Layer{
			NumHeads: l.NumAttentionHeads, NumKVHeads: l.NumKeyValueHeads, HeadDim: l.HeadDim,
			SlidingWindow: l.SlidingWindow, FFNNorm: l.FFNNorm, MLP: mlp(l.MLP),
			Attn: arch.Attention{Norm: a.Norm, Q: a.Q, K: a.K, V: a.V, O: a.O, QBias: a.QBias, KBias: a.KBias,
				VBias: a.VBias, OBias: a.OBias, QNorm: a.QNorm, KNorm: a.KNorm},
		}
		if e := l.MoE; e != nil {
			am := &arch.MoE{Router: e.Router, NumExperts: e.NumExperts, TopK: e.TopK, NormTopKProb: e.NormTopKProb,
				Shared: mlp(e.Shared), SharedGate: e.SharedGate}
			for i := range e.Experts {
				am.Experts = append(am.Experts, *mlp(&e.Experts[i]))
			}
			al.MoE = am
		}
		d.Layers = append(d.Layers, al)
	}
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("pack: %s: manifest model: %w", r.path, err)
	}
	return d, nil
}

// Path returns the artifact's path as given to Open.
func (r *Reader) Path() string { return r.path }

// checkedSection returns a section's raw bytes after checking its stored
// bytes against the section's CRC-32C (and, for lz4 codecs, that they
// decode to the recorded size). Unlike Section it never hands out bytes
// that fail their checksum.
//
// Errors: ErrNoSection; ErrChecksum; ErrFormat.
func (r *Reader) checkedSection(name string) ([]byte, error) {
	i, ok := r.l.index[name]
	if !ok {
		return nil, fmt.Errorf("pack: %s: section %q: %w", r.path, name, ErrNoSection)
	}
	e := r.l.entries[i]
	if got := crc(r.mem[e.Offset : e.Offset+e.Stored]); got != e.CRC {
		return nil, fmt.Errorf("pack: %s: section %q: CRC-32C %08x, stored %08x (the artifact is corrupt; run lmpack verify): %w",
			r.path, name, got, e.CRC, ErrChecksum)
	}
	return r.decode(e)
}

// File returns the bytes of the embedded file with the given base name
// (e.g. "tokenizer.json"), checked against its section CRC-32C.
//
// Errors: ErrNoSection when the artifact embeds no such file (wrapped,
// naming the artifact and the file); ErrChecksum; ErrFormat.
func (r *Reader) File(name string) ([]byte, error) {
	for _, f := range r.manifest.Files {
		if f.Name == name {
			return r.checkedSection(f.Section)
		}
	}
	return nil, fmt.Errorf("pack: %s: no embedded file %q: %w", r.path, name, ErrNoSection)
}

// Tensor returns the manifest tensor name as a safetensors.Tensor view so
// that a Reader is a runtime.TensorSource: File is the artifact path,
// DType and Shape come from the manifest entry, Data is the section's raw
// bytes (a zero-copy read-only view of the map for uncompressed sections,
// a new slice for lz4 ones; valid until Close). Every call checks the
// section's CRC-32C first, so corrupt bytes are an error rather than
// wrong output. The tensor is recorded as consumed (see Unconsumed).
//
// Errors: a name the manifest lacks wraps safetensors.ErrMissingTensor,
// naming the artifact and the tensor; a quantized tensor (Quant set) is
// ErrFormat (no consumer reads quantized tensors yet); ErrChecksum;
// ErrFormat from lz4 decoding.
func (r *Reader) Tensor(name string) (*safetensors.Tensor, error) {
	i, ok := slices.BinarySearchFunc(r.manifest.Tensors, name, func(t TensorEntry, n string) int {
		switch {
		case t.Name < n:
			return -1
		case t.Name > n:
			return 1
		}
		return 0
	})
	if !ok {
		// The manifest is sorted when written; fall back to a scan for a
		// hand-made one.
		i = slices.IndexFunc(r.manifest.Tensors, func(t TensorEntry) bool { return t.Name == name })
		if i < 0 {
			return nil, fmt.Errorf("pack: %s: tensor %q: %w", r.path, name, safetensors.ErrMissingTensor)
		}
	}
	t := &r.manifest.Tensors[i]
	if t.Quant != nil {
		return nil, fmt.Errorf("pack: %s: tensor %q is quantized (%d-bit); this lmpack cannot load quantized tensors yet: %w",
			r.path, name, t.Quant.Bits, ErrFormat)
	}
	data, err := r.checkedSection(t.Section)
	if err != nil {
		return nil, fmt.Errorf("%w (tensor %q)", err, name)
	}
	r.used.mu.Lock()
	if r.used.used == nil {
		r.used.used = map[string]bool{}
	}
	r.used.used[name] = true
	r.used.mu.Unlock()
	return &safetensors.Tensor{Name: name, File: r.path, DType: safetensors.DType(t.DType), Shape: slices.Clone(t.Shape), Data: data}, nil
}

// Unconsumed lists, in manifest order (sorted by name), the manifest
// tensors no Tensor call has returned, KV rotation tensors included: a
// rotation counts as consumed only when a consumer reads it. Loaders call
// it after loading to fail when the artifact holds data the model would
// silently ignore.
func (r *Reader) Unconsumed() []string {
	r.used.mu.Lock()
	defer r.used.mu.Unlock()
	var out []string
	for _, t := range r.manifest.Tensors {
		if !r.used.used[t.Name] {
			out = append(out, t.Name)
		}
	}
	return out
}

// IsKVRotation reports whether name is a KV rotation tensor named by the
// manifest's KV scheme.
func (r *Reader) IsKVRotation(name string) bool {
	if r.manifest.KV == nil {
		return false
	}
	for _, k := range r.manifest.KV.Rotations {
		if k.K == name || k.V == name {
			return true
		}
	}
	return false
}

// TensorInfos returns every manifest tensor's name, dtype and row-major
// shape, sorted by name (Begin and End are zero: sections have no offsets
// in a safetensors sense). Quantized tensors report their stored dtype.
func (r *Reader) TensorInfos() []safetensors.TensorInfo {
	out := make([]safetensors.TensorInfo, len(r.manifest.Tensors))
	for i, t := range r.manifest.Tensors {
		out[i] = safetensors.TensorInfo{Name: t.Name, DType: safetensors.DType(t.DType), Shape: slices.Clone(t.Shape)}
	}
	return out
}

// KVCache returns the artifact's KV-cache scheme as the runtime builds it:
// the runtime/kvcache method name (Manifest.KV.Cache; "" when the manifest
// has no KV scheme, meaning the float32 cache) and its options, with
// every rotation of the manifest read through Tensor (so each counts as
// consumed) as F32 [head_dim, head_dim] row-major matrices, in layer
// order, and the clip ratios and windows copied.
//
// Errors (ErrFormat, wrapped, naming the artifact and the layer or
// tensor): a scheme without a cache method; rotations for a method that
// does not take them (only oscar2 and oscar4 do, kvcache.Options) or none
// for one that needs them; rotations out of layer order, or not one per
// layer of the manifest model; clip ratios without rotations; a rotation
// tensor that is not F32 [head_dim, head_dim] for its layer; and the
// Tensor errors (a missing tensor, ErrChecksum).
func (r *Reader) KVCache() (string, kvcache.Options, error) {
	kv := r.manifest.KV
	if kv == nil {
		return "", kvcache.Options{}, nil
	}
	bad := func(format string, a ...any) (string, kvcache.Options, error) {
		return "", kvcache.Options{}, fmt.Errorf("pack: %s: manifest kv: %s: %w", r.path, fmt.Sprintf(format, a...), ErrFormat)
	}
	if kv.Cache == "" {
		return bad("no cache method (want one of %s)", strings.Join(kvcache.Methods(), ", "))
	}
	opt := kvcache.Options{Sink: kv.Sink, Recent: kv.Recent}
	takesRot := kv.Cache == "oscar2" || kv.Cache == "oscar4"
	switch {
	case len(kv.Rotations) > 0 && !takesRot:
		return bad("cache %q does not take rotations, yet the manifest lists %d (only oscar2 and oscar4 use them)", kv.Cache, len(kv.Rotations))
	case len(kv.Rotations) == 0 && takesRot:
		return bad("cache %q needs per-layer rotations; the manifest lists none", kv.Cache)
	case len(kv.Rotations) == 0 && (len(kv.ClipK) > 0 || len(kv.ClipV) > 0):
		return bad("clip ratios without rotations (cache %q would ignore them)", kv.Cache)
	case len(kv.Rotations) == 0:
		return kv.Cache, opt, nil
	}
	layers := r.manifest.Model.Layers
	if len(kv.Rotations) != len(layers) {
		return bad("%d rotation pairs for %d layers, want one per layer", len(kv.Rotations), len(layers))
	}
	rot := &kvcache.Rotations{ClipK: slices.Clone(kv.ClipK), ClipV: slices.Clone(kv.ClipV)}
	for i, e := range kv.Rotations {
		if e.Layer != i {
			return bad("rotation entry %d is for layer %d, want layer %d (entries in layer order)", i, e.Layer, i)
		}
		d := layers[i].HeadDim
		for _, side := range []struct {
			name string
			dst  *[][]float32
		}{{e.K, &rot.K}, {e.V, &rot.V}} {
			t, err := r.Tensor(side.name)
			if err != nil {
				return "", kvcache.Options{}, fmt.Errorf("%w (kv rotation of layer %d)", err, i)
			}
			if t.DType != safetensors.F32 || len(t.Shape) != 2 || t.Shape[0] != d || t.Shape[1] != d {
				return bad("rotation %q of layer %d is %s %v, want F32 [%d %d] (head_dim %d)", side.name, i, t.DType, t.Shape, d, d, d)
			}
			m := make([]float32, d*d)
			for j := range m {
				m[j] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*j:]))
			}
			*side.dst = append(*side.dst, m)
		}
	}
	opt.Rotations = rot
	return kv.Cache, opt, nil
}
