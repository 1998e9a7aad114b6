package pack

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"maps"
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
// describes is unusable); ErrMismatch for a quantized tensor that is not a
// 2-d weight of the model other than the embedding, or whose shape
// differs from the model's.
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
	if !slices.Contains(arch.Supported(), d.Architecture) {
		return nil, fmt.Errorf("pack: %s: manifest model: architecture %q: %w; supported: %s", r.path, d.Architecture, arch.ErrUnsupportedArch, strings.Join(arch.Supported(), ", "))
	}
	if q := quantization(r.manifest); q != nil || r.manifest.WeightsMethod != "" {
		if err := checkQuantMethod(r.manifest.WeightsMethod); err != nil {
			return nil, fmt.Errorf("pack: %s: manifest: %w", r.path, err)
		}
	}
	if d.Quant = quantization(r.manifest); d.Quant != nil {
		shapes := d.TensorShapes()
		for _, n := range slices.Sorted(maps.Keys(d.Quant.Tensors)) {
			i := slices.IndexFunc(r.manifest.Tensors, func(t TensorEntry) bool { return t.Name == n })
			sh, ok := shapes[n]
			switch {
			case !ok || len(sh) != 2:
				return nil, fmt.Errorf("pack: %s: quantized tensor %q is not a 2-d weight of the manifest model: %w", r.path, n, ErrMismatch)
			case n == d.Embedding:
				return nil, fmt.Errorf("pack: %s: quantized tensor %q is the embedding, which is never quantized: %w", r.path, n, ErrMismatch)
			case !slices.Equal(sh, r.manifest.Tensors[i].Shape):
				return nil, fmt.Errorf("pack: %s: quantized tensor %q has shape %v, the model's is %v: %w", r.path, n, r.manifest.Tensors[i].Shape, sh, ErrMismatch)
			}
		}
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
// naming the artifact and the file; it also wraps fs.ErrNotExist, and is
// the only error meaning "absent": a file whose section fails its
// checksum is ErrChecksum, never absent); ErrChecksum; ErrFormat.
func (r *Reader) File(name string) ([]byte, error) {
	for _, f := range r.manifest.Files {
		if f.Name == name {
			return r.checkedSection(f.Section)
		}
	}
	return nil, fmt.Errorf("pack: %s: no embedded file %q: %w (%w)", r.path, name, ErrNoSection, fs.ErrNotExist)
}

// Tensor returns the manifest tensor name as a safetensors.Tensor view so
// that a Reader is a runtime.TensorSource: File is the artifact path,
// DType and Shape come from the manifest entry, Data is the section's raw
// bytes (a zero-copy read-only view of the map for uncompressed sections,
// a new slice for lz4 ones; valid until Close). Every call checks the
// section's CRC-32C first, so corrupt bytes are an error rather than
// wrong output. The tensor is recorded as consumed (see Unconsumed).
//
// A quantized weight NAME.weight is served as its storage tensors, under
// the names and in the layout of a quantized checkpoint (docs/QUANT.md):
// NAME.qweight U8 [rows, ceil(cols·bits/8)], NAME.scales F16 [rows,
// cols/group], NAME.qzeros F16 [rows, cols/group] (asymmetric only),
// NAME.perm I32 [cols] (act-order only); Description's Quant block makes
// the runtime ask for exactly those.
//
// Errors: a name the manifest lacks wraps safetensors.ErrMissingTensor,
// naming the artifact and the tensor; the name of a quantized weight
// itself is ErrFormat (read its storage tensors); ErrChecksum; ErrFormat
// from lz4 decoding.
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
	}
	var sec string
	var dtype safetensors.DType
	var shape []int
	switch {
	case i >= 0 && r.manifest.Tensors[i].Quant != nil:
		t := &r.manifest.Tensors[i]
		return nil, fmt.Errorf("pack: %s: tensor %q is stored quantized (%d-bit, group %d); read its storage tensors %s%s and %s%s: %w",
			r.path, name, t.Quant.Bits, t.Quant.GroupSize, arch.QuantPrefix(name), arch.SuffixQWeight, arch.QuantPrefix(name), arch.SuffixScales, ErrFormat)
	case i >= 0:
		t := &r.manifest.Tensors[i]
		sec, dtype, shape = t.Section, safetensors.DType(t.DType), t.Shape
	default:
		s, ok := r.storage[name]
		if !ok {
			return nil, fmt.Errorf("pack: %s: tensor %q: %w", r.path, name, safetensors.ErrMissingTensor)
		}
		sec, dtype, shape = s.section, s.dtype, s.shape
	}
	data, err := r.checkedSection(sec)
	if err != nil {
		return nil, fmt.Errorf("%w (tensor %q)", err, name)
	}
	r.used.mu.Lock()
	if r.used.used == nil {
		r.used.used = map[string]bool{}
	}
	r.used.used[name] = true
	r.used.mu.Unlock()
	return &safetensors.Tensor{Name: name, File: r.path, DType: dtype, Shape: slices.Clone(shape), Data: data}, nil
}

// Unconsumed lists the manifest tensors no Tensor call has returned, KV
// rotation tensors included (a rotation counts as consumed only when a
// consumer reads it), sorted by name: for a quantized weight, each of its
// storage tensors (NAME.qweight, NAME.scales, ...) not read. Loaders call
// it after loading to fail when the artifact holds data the model would
// silently ignore.
func (r *Reader) Unconsumed() []string {
	r.used.mu.Lock()
	defer r.used.mu.Unlock()
	var out []string
	for _, t := range r.manifest.Tensors {
		if t.Quant == nil && !r.used.used[t.Name] {
			out = append(out, t.Name)
		}
	}
	for n := range r.storage {
		if !r.used.used[n] {
			out = append(out, n)
		}
	}
	slices.Sort(out)
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

// TensorInfos returns every tensor as a checkpoint of the model would
// store it, sorted by name: name, dtype and row-major shape of each plain
// manifest tensor, and of each storage tensor of a quantized weight
// (NAME.qweight, NAME.scales, ...; see Tensor) instead of the weight.
// Begin and End are zero: sections have no offsets in a safetensors sense.
func (r *Reader) TensorInfos() []safetensors.TensorInfo {
	var out []safetensors.TensorInfo
	for _, t := range r.manifest.Tensors {
		if t.Quant == nil {
			out = append(out, safetensors.TensorInfo{Name: t.Name, DType: safetensors.DType(t.DType), Shape: slices.Clone(t.Shape)})
		}
	}
	for n, s := range r.storage {
		out = append(out, safetensors.TensorInfo{Name: n, DType: s.dtype, Shape: slices.Clone(s.shape)})
	}
	slices.SortFunc(out, func(a, b safetensors.TensorInfo) int { return strings.Compare(a.Name, b.Name) })
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
// does not take them (only oscar2, oscar4 and oscar-mixed do,
// kvcache.NeedsRotations) or none for one that needs them; rotations out
// of layer order, or not one per layer of the manifest model; clip ratios
// or per-layer widths without rotations; a rotation
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
	if err := CheckKVWindows(kv.Sink, kv.Recent, r.manifest.Model.MaxPositionEmbeddings); err != nil {
		// The check verify makes; a loader that skipped it ran windows
		// longer than the model's context.
		return "", kvcache.Options{}, fmt.Errorf("pack: %s: manifest kv: %w", r.path, err)
	}
	opt := kvcache.Options{Sink: kv.Sink, Recent: kv.Recent}
	takesRot := kvcache.NeedsRotations(kv.Cache)
	clips := len(kv.ClipK) > 0 || len(kv.ClipV) > 0 || len(kv.ClipK4) > 0 || len(kv.ClipV4) > 0 || len(kv.ClipK8) > 0 || len(kv.ClipV8) > 0
	switch {
	case len(kv.Rotations) > 0 && !takesRot:
		return bad("cache %q does not take rotations, yet the manifest lists %d (only oscar2, oscar4 and oscar-mixed use them)", kv.Cache, len(kv.Rotations))
	case len(kv.Rotations) == 0 && takesRot:
		return bad("cache %q needs per-layer rotations; the manifest lists none", kv.Cache)
	case len(kv.Rotations) == 0 && clips:
		return bad("clip ratios without rotations (cache %q would ignore them)", kv.Cache)
	case len(kv.Rotations) == 0 && (len(kv.BitsK) > 0 || len(kv.BitsV) > 0):
		return bad("per-layer widths bits_k/bits_v without rotations (cache %q would ignore them)", kv.Cache)
	case len(kv.Rotations) == 0:
		return kv.Cache, opt, nil
	}
	layers := r.manifest.Model.Layers
	if len(kv.Rotations) != len(layers) {
		return bad("%d rotation pairs for %d layers, want one per layer", len(kv.Rotations), len(layers))
	}
	rot := &kvcache.Rotations{ClipK: slices.Clone(kv.ClipK), ClipV: slices.Clone(kv.ClipV),
		ClipK4: slices.Clone(kv.ClipK4), ClipV4: slices.Clone(kv.ClipV4), ClipK8: slices.Clone(kv.ClipK8), ClipV8: slices.Clone(kv.ClipV8),
		BitsK: slices.Clone(kv.BitsK), BitsV: slices.Clone(kv.BitsV)}
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
