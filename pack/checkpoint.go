package pack

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// EmbeddedFiles are the checkpoint files FromCheckpoint embeds when present
// (config.json is required).
var EmbeddedFiles = []string{"config.json", "generation_config.json", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"}

// FromOptions control FromCheckpoint.
type FromOptions struct {
	// KVRotations is an OSCAR rotation file (lmpack quantize kv); empty
	// for none. It must match the model's fingerprint.
	KVRotations string
	// KVCache is the runtime/kvcache method run and eval build for the
	// artifact (Manifest.KV.Cache); empty means "oscar2" when KVRotations
	// is set ("oscar-mixed" when the file has per-layer widths) and no KV
	// scheme (float32 cache) otherwise.
	KVCache string
	// KVSink and KVRecent are the fp16 windows in tokens
	// (kvcache.Options), recorded with KVCache.
	KVSink, KVRecent int
	// SourceModelFingerprint, when set, is recorded in the provenance
	// instead of the fingerprint of modelDir (a pipeline packing a pruned
	// copy records the model it started from).
	SourceModelFingerprint string
	// Recipe is stored in the provenance (valid JSON or nil).
	Recipe json.RawMessage
	// LmpackVersion is recorded in the provenance.
	LmpackVersion string
}

// FromCheckpoint builds an Artifact from the Hugging Face checkpoint in
// modelDir: every tensor (except an lm_head copy of a model with tied
// embeddings, which the runtime never reads) as a section of its own name (bytes viewed from
// the checkpoint's memory map, so the caller must Close the Artifact),
// the embedded files as sections "file/NAME", and with opt.KVRotations
// the per-layer OSCAR rotations as F32 [head_dim, head_dim] sections
// "kv/oscar.layers.N.r_k" and "...r_v" plus clip ratios in the manifest.
//
// It refuses a checkpoint the runtime would refuse to load: config.json
// and tensors that disagree (model.Check), a quantization
// method other than QuantMethods (ErrFormat), invalid quantized values
// (runtime.ReadQuantized, runtime.ErrBadWeights), a plain tensor that is
// not a float dtype or holds NaN or ±Inf (ErrFormat, naming the source
// file, the tensor and the element), no tokenizer.json, and a
// tokenizer.json or tokenizer_config.json that run and eval could not
// load (Reader.Tokenizer: tokenizer.ErrMalformed, tokenizer.ErrUnsupported,
// more tokens than vocab_size).
//
// Errors: invalid options (Validate, ValidateModel: a *field.Error);
// model (model.OpenDir, model.Check), runtime and oscar errors
// (a rotation file of another model is oscar.ErrRotationModelMismatch),
// wrapped with "pack:".
func FromCheckpoint(modelDir string, opt FromOptions) (*Artifact, error) {
	desc, ck, err := model.OpenDir(modelDir)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	a := &Artifact{closers: []func() error{ck.Close}}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	// Refuse what the runtime would refuse when loading the artifact: a
	// config.json that disagrees with the tensors (a quantized tensor
	// missing from the quantization block, a lost perm flag, a flipped
	// symmetric flag), an unknown weights method, invalid quantized
	// values (scales not finite and > 0, zero-points out of range, a
	// perm that is not a permutation).
	if err := model.Check(modelDir, desc, ck); err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	if desc.Quant != nil {
		if err := checkQuantMethod(desc.Quant.Method); err != nil {
			return nil, fmt.Errorf("pack: %s: config.json lmpack_quantization: %w", modelDir, err)
		}
		if err := checkQuantValues(desc, ck); err != nil {
			return nil, fmt.Errorf("pack: %s: %w", modelDir, err)
		}
	}
	fp, err := model.Fingerprint(modelDir, ck)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	m := &a.Manifest
	m.Model = ModelFromDescription(desc)
	m.Files = []FileEntry{}
	m.Tensors = []TensorEntry{}
	m.Provenance = Provenance{SourceModelFingerprint: fp, LmpackVersion: opt.LmpackVersion}
	if opt.SourceModelFingerprint != "" {
		m.Provenance.SourceModelFingerprint = opt.SourceModelFingerprint
	}
	if len(opt.Recipe) > 0 {
		var b bytes.Buffer
		if err := json.Compact(&b, opt.Recipe); err != nil {
			return nil, fmt.Errorf("pack: recipe: %w", err)
		}
		m.Provenance.Recipe = b.Bytes()
	}
	embedded := map[string][]byte{}
	for _, name := range EmbeddedFiles {
		b, err := fsx.ReadFile(filepath.Join(modelDir, name))
		if os.IsNotExist(err) && name != "config.json" {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pack: %w", err)
		}
		embedded[name] = b
		sec := "file/" + name
		m.Files = append(m.Files, FileEntry{Name: name, Section: sec})
		a.Sections = append(a.Sections, Section{Name: sec, Data: b})
		if name == "tokenizer.json" {
			m.Tokenizer = sec
		}
	}
	// run and eval build the tokenizer from the embedded files
	// (Reader.Tokenizer): refuse files they would refuse.
	if _, ok := embedded["tokenizer.json"]; !ok {
		return nil, fmt.Errorf("pack: %s: no tokenizer.json: run and eval read the tokenizer the artifact embeds, so it would not load (a Hugging Face checkpoint directory holds config.json, the *.safetensors weights and tokenizer.json)", modelDir)
	}
	if _, err := parseTokenizer(embedded["tokenizer.json"], embedded["tokenizer_config.json"], desc.VocabSize); err != nil {
		return nil, fmt.Errorf("pack: %s: %w; run and eval would refuse the artifact", modelDir, err)
	}
	quantized, err := quantEntries(desc, ck)
	if err != nil {
		return nil, err
	}
	for _, q := range quantized {
		m.Tensors = append(m.Tensors, q.entry)
		a.Sections = append(a.Sections, q.sections...)
	}
	if desc.Quant != nil {
		m.WeightsMethod = desc.Quant.Method
	}
	storageOf := map[string]bool{}
	for _, q := range quantized {
		for _, s := range q.sections {
			storageOf[s.Name] = true
		}
	}
	for _, name := range ck.Names() {
		if storageOf[name] || (desc.TieWordEmbeddings && name == desc.LMHead) {
			// A tied lm_head stored in the checkpoint is a copy of the
			// embedding, which the runtime uses instead.
			continue
		}
		t, err := ck.Tensor(name)
		if err != nil {
			return nil, fmt.Errorf("pack: %w", err)
		}
		// The runtime reads every plain tensor the model uses as a float
		// weight and refuses NaN and ±Inf; report both against the source
		// file (RoPE inv_freq buffers are never read).
		if !strings.HasSuffix(name, "rotary_emb.inv_freq") {
			if !t.DType.IsFloat() {
				return nil, fmt.Errorf("pack: %s: tensor %q: dtype %s, want a float dtype (F32, F16, BF16, F64, F8_E4M3, F8_E5M2; integer tensors only serve as quantized weights' storage, declared in config.json lmpack_quantization): %w",
					t.File, name, t.DType, ErrFormat)
			}
			if err := checkFinite(name, t.DType, t.Data); err != nil {
				return nil, fmt.Errorf("pack: %s: %w", t.File, err)
			}
		}
		m.Tensors = append(m.Tensors, TensorEntry{Name: name, Section: name, DType: string(t.DType), Shape: append([]int{}, t.Shape...)})
		a.Sections = append(a.Sections, Section{Name: name, ElemSize: t.DType.Size(), Data: t.Data})
	}
	if err := opt.Validate(); err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	if err := opt.ValidateModel(desc); err != nil {
		return nil, fmt.Errorf("pack: %s: %w", modelDir, err)
	}
	cache := opt.KVCache
	if cache == "" && opt.KVRotations != "" {
		cache = "oscar2"
	}
	if cache != "" {
		m.KV = &KVScheme{Cache: cache, Sink: opt.KVSink, Recent: opt.KVRecent}
	}
	kvOpt := kvcache.Options{Sink: opt.KVSink, Recent: opt.KVRecent}
	if opt.KVRotations != "" {
		rot, h, err := oscar.ReadFile(opt.KVRotations, model.Expect{ModelFingerprint: fp, Desc: desc})
		if err != nil {
			return nil, fmt.Errorf("pack: %w", err)
		}
		kv := m.KV
		kv.Method, kv.ModelFingerprint, kv.CalibrationFingerprint = h.Method, h.ModelFingerprint, h.CalibrationFingerprint
		kv.ClipK, kv.ClipV = rot.ClipK, rot.ClipV
		kv.ClipK4, kv.ClipV4, kv.ClipK8, kv.ClipV8 = rot.ClipK4, rot.ClipV4, rot.ClipK8, rot.ClipV8
		kv.BitsK, kv.BitsV = rot.BitsK, rot.BitsV
		// A rotation file with per-layer widths (quantize kv --kv-bits)
		// runs as oscar-mixed unless a cache is named.
		if opt.KVCache == "" && rot.BitsK != nil {
			kv.Cache = "oscar-mixed"
		}
		kr := kvcache.Rotations(*rot)
		kvOpt.Rotations = &kr
		m.Provenance.CalibrationFingerprint = h.CalibrationFingerprint
		for i := range rot.K {
			d := desc.Layers[i].HeadDim
			k, v := "kv/"+oscar.TensorName(i, "r_k"), "kv/"+oscar.TensorName(i, "r_v")
			kv.Rotations = append(kv.Rotations, KVRotations{Layer: i, K: k, V: v})
			for _, x := range []struct {
				name string
				r    []float32
			}{{k, rot.K[i]}, {v, rot.V[i]}} {
				m.Tensors = append(m.Tensors, TensorEntry{Name: x.name, Section: x.name, DType: "F32", Shape: []int{d, d}})
				a.Sections = append(a.Sections, Section{Name: x.name, ElemSize: 4, Data: f32Bytes(x.r)})
			}
		}
	}
	if m.KV != nil {
		if _, err := kvcache.New(m.KV.Cache, kvcache.LayersOf(desc), 1, kvOpt); err != nil {
			return nil, fmt.Errorf("pack: kv cache %s: %w", m.KV.Cache, err)
		}
	}
	sortTensors(m.Tensors)
	ok = true
	return a, nil
}

func f32Bytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func sortTensors(ts []TensorEntry) {
	slices.SortFunc(ts, func(a, b TensorEntry) int { return strings.Compare(a.Name, b.Name) })
}

// quantEntry is one quantized weight of a checkpoint as the artifact
// stores it: its manifest entry and its storage sections.
type quantEntry struct {
	entry    TensorEntry
	sections []Section
}

// quantEntries converts the quantized weights of a quantized checkpoint
// (desc.Quant, docs/QUANT.md) to manifest entries: NAME.weight [rows,
// cols], dtype U8, section NAME.qweight, with scale, zero-point and
// permutation sections of their storage names. Each storage tensor must
// be present with the dtype and shape arch.QuantStorage gives (qweight
// U8, scales and qzeros F16, perm I32).
//
// Errors: a storage tensor missing (wrapping
// safetensors.ErrMissingTensor) or of the wrong dtype or shape
// (ErrFormat), naming the checkpoint tensor.
func quantEntries(desc *arch.Description, ck *safetensors.Checkpoint) ([]quantEntry, error) {
	if desc.Quant == nil {
		return nil, nil
	}
	shapes := desc.TensorShapes()
	var out []quantEntry
	for _, name := range slices.Sorted(maps.Keys(desc.Quant.Tensors)) {
		tq := desc.Quant.Tensors[name]
		sh := shapes[name]
		rows, cols := sh[0], sh[1]
		p := arch.QuantPrefix(name)
		q := &QuantFormat{Bits: tq.Bits, GroupSize: tq.GroupSize, ScaleDType: QuantScaleDType,
			ScaleSection: p + arch.SuffixScales, PackingOrder: PackingLSBFirst}
		if !tq.Symmetric {
			q.ZeroDType, q.ZeroSection = QuantScaleDType, p+arch.SuffixQZeros
		}
		if tq.Perm {
			q.PermSection = p + arch.SuffixPerm
		}
		e := quantEntry{entry: TensorEntry{Name: name, Section: p + arch.SuffixQWeight, DType: string(safetensors.U8), Shape: []int{rows, cols}, Quant: q}}
		want := storage(&e.entry)
		for _, sn := range slices.Sorted(maps.Keys(want)) {
			w := want[sn]
			t, err := ck.Tensor(sn)
			if err != nil {
				return nil, fmt.Errorf("pack: quantized weight %q: storage tensor %q: %w", name, sn, err)
			}
			if t.DType != w.dtype || !slices.Equal(t.Shape, w.shape) {
				return nil, fmt.Errorf("pack: quantized weight %q: storage tensor %q is %s %v, want %s %v: %w", name, sn, t.DType, t.Shape, w.dtype, w.shape, ErrFormat)
			}
			e.sections = append(e.sections, Section{Name: sn, ElemSize: t.DType.Size(), Data: t.Data})
		}
		out = append(out, e)
	}
	return out, nil
}
