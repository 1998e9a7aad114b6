package export

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/gguf"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/internal/fsx"
	"github.com/lmpack/lmpack/quantize/weights"
)

// GGUFTypes are the values GGUFOptions.Type takes ("" means "auto").
var GGUFTypes = []string{"auto", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k", "f16", "bf16", "f32"}

// GGUFOptions configures GGUF.
type GGUFOptions struct {
	// Out is the .gguf file to write. An existing file is replaced only
	// when it is a GGUF file (a previous export); any other file is
	// refused.
	Out string
	// Type is the tensor type of the 2-D weights: "auto" (or "") keeps
	// float tensors in their dtype and writes quantized ones in their
	// exact GGUF counterpart (symmetric 8-bit → Q8_0, symmetric 4-bit or
	// 2/3-bit → Q4_0, asymmetric 4-bit → Q4_1, group sizes multiples of
	// 32), else requantizes them into the nearest llama.cpp type at or
	// above the stored bits; or one of GGUFTypes, applied to every 2-D
	// weight. 1-D tensors (norms, biases) and routers are always F32.
	Type string
	// AllowRequant lets an MoE layer whose experts were quantized at
	// different widths be written as one stacked tensor of the widest
	// expert's type (the others requantized); without it such a model is
	// refused.
	AllowRequant bool
}

// Validate checks opt without opening anything: Out given, Type one of
// GGUFTypes. Errors: a *field.Error naming the Go field.
func (opt *GGUFOptions) Validate() error {
	if opt.Out == "" {
		return field.New("Out", nil, "the .gguf file to write")
	}
	if opt.Type != "" && !slices.Contains(GGUFTypes, strings.ToLower(opt.Type)) {
		return field.New("Type", opt.Type, strings.Join(GGUFTypes, ", "))
	}
	return nil
}

// ggufArch is llama.cpp's architecture for a model.
type ggufArch struct {
	name string
	// permute: llama.cpp's arch uses the interleaved ("normal") RoPE, so
	// q_proj and k_proj rows are permuted as convert_hf_to_gguf's
	// LlamaModel.permute does; NEOX-RoPE archs (qwen*) are not.
	permute bool
	// normTopK is what llama.cpp's graph does with the top-k router
	// weights (renormalises them or not) for this arch's MoE.
	normTopK bool
	moe      bool
}

func archFor(d *arch.Description) (ggufArch, error) {
	switch d.Architecture {
	case "LlamaForCausalLM", "MistralForCausalLM":
		return ggufArch{name: "llama", permute: true}, nil
	case "MixtralForCausalLM":
		return ggufArch{name: "llama", permute: true, normTopK: true, moe: true}, nil
	case "Qwen2ForCausalLM":
		return ggufArch{name: "qwen2"}, nil
	case "Qwen3ForCausalLM":
		return ggufArch{name: "qwen3"}, nil
	case "Qwen2MoeForCausalLM":
		return ggufArch{name: "qwen2moe", moe: true}, nil
	case "Qwen3MoeForCausalLM":
		return ggufArch{name: "qwen3moe", normTopK: true, moe: true}, nil
	}
	return ggufArch{}, fmt.Errorf("export: architecture %q has no GGUF mapping (supported: Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE)", d.Architecture)
}

// planned is one output tensor: its info, its report row, and how to
// produce its bytes.
type planned struct {
	info    gguf.TensorInfo
	row     TensorRow
	produce func() ([]byte, *TensorRow, error)
}

type exporter struct {
	src  *source
	opt  GGUFOptions
	a    ggufArch
	want string // "auto" or a GGUFTypes entry
	rep  *Report
	out  []planned
}

// GGUF exports the model at path (a checkpoint directory, an lmpack-wq
// quantized checkpoint, or an .lmpk artifact) as a GGUF v3 file for
// llama.cpp at opt.Out, with llama.cpp's architecture, metadata and tensor
// names (see docs/EXPORT.md for the tables of what maps exactly, what is
// requantized and what is refused). Tensors are written one at a time;
// the file is written atomically (fsx.WriteAtomic) and is byte-identical
// for the same input and options.
//
// Errors: opt.Validate's; an existing Out that is not a GGUF file; a
// model that cannot be opened; an architecture without a mapping; a
// width-pruned model whose llama.cpp architecture has no per-layer sizes;
// an MoE layer with experts at different widths without AllowRequant; a
// tokenizer llama.cpp has no model for. Nothing is left at Out on error.
func GGUF(ctx context.Context, path string, opt GGUFOptions) (*Report, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if err := checkOut(opt.Out, gguf.Magic, "GGUF"); err != nil {
		return nil, err
	}
	src, err := openSource(ctx, path)
	if err != nil {
		return nil, err
	}
	defer src.close()
	a, err := archFor(src.desc)
	if err != nil {
		return nil, err
	}
	want := strings.ToLower(opt.Type)
	if want == "" {
		want = "auto"
	}
	e := &exporter{src: src, opt: opt, a: a, want: want, rep: &Report{Format: "gguf", Out: opt.Out}}
	kvs, err := e.metadata()
	if err != nil {
		return nil, err
	}
	if err := e.plan(); err != nil {
		return nil, err
	}
	var refused []string
	for _, p := range e.out {
		if p.row.Mode == ModeRefused {
			refused = append(refused, p.row.Name+": "+p.row.Reason)
		}
	}
	if len(refused) > 0 {
		for _, p := range e.out {
			e.rep.Tensors = append(e.rep.Tensors, p.row)
		}
		return e.rep, fmt.Errorf("export: %s: GGUF cannot hold %d tensor(s): %s", path, len(refused), strings.Join(refused, "; "))
	}
	kvs = append(kvs, gguf.KV{Key: "general.file_type", Value: e.fileType()})
	if e.quantized() {
		kvs = append(kvs, gguf.KV{Key: "general.quantization_version", Value: uint32(2)})
	}
	tk, warn, err := tokenizerKVs(src, e.vocabRows())
	if err != nil {
		return nil, err
	}
	e.rep.Warnings = append(e.rep.Warnings, warn...)
	kvs = append(kvs, tk...)
	infos := make([]gguf.TensorInfo, len(e.out))
	for i, p := range e.out {
		infos[i] = p.info
	}
	err = fsx.WriteAtomic(opt.Out, 0o644, func(f *os.File) error {
		w, err := gguf.NewWriter(f, kvs, infos)
		if err != nil {
			return err
		}
		for i := range e.out {
			if err := ctx.Err(); err != nil {
				return err
			}
			b, row, err := e.out[i].produce()
			if err != nil {
				return err
			}
			if row != nil {
				e.out[i].row = *row
			}
			e.out[i].row.Bytes = int64(len(b))
			if err := w.WriteTensor(b); err != nil {
				return err
			}
		}
		return w.Close()
	})
	if err != nil {
		return nil, fmt.Errorf("export: %s: %w", opt.Out, err)
	}
	for _, p := range e.out {
		e.rep.Tensors = append(e.rep.Tensors, p.row)
	}
	e.rep.Finish()
	// Read the header back (gguf.Read checks every range against the
	// file) and compare it with what was planned.
	g, err := gguf.Open(opt.Out)
	if err != nil {
		return nil, fmt.Errorf("export: reading back %s: %w", opt.Out, err)
	}
	defer g.Close()
	if len(g.Tensors) != len(infos) || len(g.KVs) != len(kvs) {
		return nil, fmt.Errorf("export: reading back %s: %d tensors and %d keys, wrote %d and %d", opt.Out, len(g.Tensors), len(g.KVs), len(infos), len(kvs))
	}
	for i, t := range g.Tensors {
		if t.Name != infos[i].Name || t.Type != infos[i].Type || !slices.Equal(t.Dims, infos[i].Dims) || t.Offset != infos[i].Offset {
			return nil, fmt.Errorf("export: reading back %s: tensor %d is %s %v %v, wrote %s %v %v", opt.Out, i, t.Name, t.Type, t.Dims, infos[i].Name, infos[i].Type, infos[i].Dims)
		}
	}
	if st, err := os.Stat(opt.Out); err == nil {
		e.rep.Bytes = st.Size()
	}
	return e.rep, nil
}

// checkOut refuses an Out that exists and is not a file of the format
// (magic), so that a mistyped -o cannot destroy an unrelated file; a
// previous export is replaced (as lmpack pack does with artifacts).
func checkOut(out, magic, what string) error {
	st, err := os.Stat(out)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("export: output %s: %w", out, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("export: output %s exists and is not a regular file; refusing to replace it", out)
	}
	f, err := os.Open(out)
	if err != nil {
		return fmt.Errorf("export: output %s: %w", out, err)
	}
	defer f.Close()
	b := make([]byte, len(magic))
	if _, err := io.ReadFull(f, b); err != nil || string(b) != magic {
		return fmt.Errorf("export: output %s exists and is not a %s file; refusing to overwrite it", out, what)
	}
	return nil
}

func (e *exporter) vocabRows() int {
	if sh, err := e.src.shapeOf(e.src.desc.Embedding); err == nil && len(sh) == 2 {
		return sh[0]
	}
	return e.src.desc.VocabSize
}

// widthPruned reports whether the layers differ in head counts, head_dim
// or FFN sizes.
func widthPruned(d *arch.Description) bool {
	l0 := d.Layers[0]
	for _, l := range d.Layers[1:] {
		if l.NumHeads != l0.NumHeads || l.NumKVHeads != l0.NumKVHeads || l.HeadDim != l0.HeadDim || ffnSize(&l) != ffnSize(&l0) ||
			(l.MoE == nil) != (l0.MoE == nil) || l.MoE != nil && (l.MoE.NumExperts != l0.MoE.NumExperts || sharedSize(&l) != sharedSize(&l0)) {
			return true
		}
	}
	return false
}

func ffnSize(l *arch.Layer) int {
	if l.MLP != nil {
		return l.MLP.IntermediateSize
	}
	if l.MoE != nil && len(l.MoE.Experts) > 0 {
		return l.MoE.Experts[0].IntermediateSize
	}
	return 0
}

func sharedSize(l *arch.Layer) int {
	if l.MoE != nil && l.MoE.Shared != nil {
		return l.MoE.Shared.IntermediateSize
	}
	return 0
}

// metadata builds the general and architecture keys (tokenizer keys are
// added by GGUF), choosing "deci" for a width-pruned Llama.
func (e *exporter) metadata() ([]gguf.KV, error) {
	d := e.src.desc
	if len(d.Layers) == 0 {
		return nil, fmt.Errorf("export: %s: the model has no layers", e.src.path)
	}
	l0 := &d.Layers[0]
	for i := range d.Layers {
		l := &d.Layers[i]
		if l.HeadDim != l0.HeadDim {
			return nil, fmt.Errorf("export: %s: layer %d has head_dim %d, layer 0 %d: llama.cpp has one key_length for all layers", e.src.path, i, l.HeadDim, l0.HeadDim)
		}
		if e.a.moe != (l.MoE != nil) {
			return nil, fmt.Errorf("export: %s: layer %d is %s in a %s model: llama.cpp's %s builds every layer alike", e.src.path, i, map[bool]string{true: "a mixture of experts", false: "dense"}[l.MoE != nil], d.Architecture, e.a.name)
		}
		if l.MoE != nil {
			for j := range l.MoE.Experts {
				if l.MoE.Experts[j].IntermediateSize != l.MoE.Experts[0].IntermediateSize {
					return nil, fmt.Errorf("export: %s: layer %d: expert %d has intermediate size %d, expert 0 %d: a stacked GGUF expert tensor needs equal experts", e.src.path, i, j, l.MoE.Experts[j].IntermediateSize, l.MoE.Experts[0].IntermediateSize)
				}
			}
		}
	}
	perLayer := widthPruned(d)
	if perLayer {
		if e.a.name != "llama" || e.a.moe {
			return nil, fmt.Errorf("export: %s: width-pruned model (per-layer head counts or FFN sizes) refused: llama.cpp's %s architecture builds every layer with layer 0's sizes; only a dense Llama-family model has a per-layer GGUF form (llama.cpp's deci architecture)", e.src.path, e.a.name)
		}
		e.a.name = "deci"
		e.rep.Warnings = append(e.rep.Warnings, "width-pruned Llama written as llama.cpp's \"deci\" architecture (per-layer head_count, head_count_kv and feed_forward_length arrays, the Llama graph and RoPE)")
	}
	A := e.a.name
	var kvs []gguf.KV
	add := func(k string, v any) { kvs = append(kvs, gguf.KV{Key: k, Value: v}) }
	add("general.architecture", A)
	add("general.name", e.src.name)
	add(gguf.KeyAlignment, uint32(gguf.DefaultAlignment))
	add(A+".vocab_size", uint32(e.vocabRows()))
	ctxLen := d.MaxPositionEmbeddings
	if ctxLen <= 0 {
		ctxLen = arch.DefaultContext(d)
	}
	add(A+".context_length", uint32(ctxLen))
	add(A+".embedding_length", uint32(d.HiddenSize))
	add(A+".block_count", uint32(len(d.Layers)))
	if perLayer {
		h, kv, ff := make([]int32, len(d.Layers)), make([]int32, len(d.Layers)), make([]int32, len(d.Layers))
		for i := range d.Layers {
			h[i], kv[i], ff[i] = int32(d.Layers[i].NumHeads), int32(d.Layers[i].NumKVHeads), int32(ffnSize(&d.Layers[i]))
		}
		add(A+".feed_forward_length", ff)
		add(A+".attention.head_count", h)
		add(A+".attention.head_count_kv", kv)
	} else {
		ff := ffnSize(l0)
		if e.a.moe && e.a.name != "llama" {
			// qwen*moe: feed_forward_length is config.json's dense
			// intermediate_size (unused by the graph); the experts' size
			// is expert_feed_forward_length.
			if v, ok := e.configInt("intermediate_size"); ok {
				ff = v
			}
		}
		add(A+".feed_forward_length", uint32(ff))
		add(A+".attention.head_count", uint32(l0.NumHeads))
		add(A+".attention.head_count_kv", uint32(l0.NumKVHeads))
	}
	add(A+".attention.key_length", uint32(l0.HeadDim))
	add(A+".attention.value_length", uint32(l0.HeadDim))
	add(A+".rope.dimension_count", uint32(l0.HeadDim))
	add(A+".rope.freq_base", float32(d.RoPE.Theta))
	add(A+".attention.layer_norm_rms_epsilon", float32(d.RMSNormEps))
	if s := d.RoPE.Scaling; s != nil {
		switch s.Type {
		case "linear":
			add(A+".rope.scaling.type", "linear")
			add(A+".rope.scaling.factor", float32(s.Factor))
		case "llama3":
			// llama.cpp takes Llama 3.1 scaling as the rope_freqs tensor
			// (plan adds it).
		default:
			return nil, fmt.Errorf("export: %s: rope_scaling type %q has no GGUF mapping here", e.src.path, s.Type)
		}
	}
	if w := l0.SlidingWindow; w > 0 {
		add(A+".attention.sliding_window", uint32(w))
		if w < ctxLen {
			e.rep.Warnings = append(e.rep.Warnings, fmt.Sprintf("sliding window %d: llama.cpp's %s graph attends to the whole context, so outputs past %d tokens differ from the model's; run with --ctx-size %d to stay within the window", w, A, w, w))
		}
	}
	if e.a.moe {
		m := l0.MoE
		add(A+".expert_count", uint32(m.NumExperts))
		add(A+".expert_used_count", uint32(m.TopK))
		if e.a.name != "llama" {
			add(A+".expert_feed_forward_length", uint32(ffnSize(l0)))
		}
		if m.Shared != nil {
			add(A+".expert_shared_feed_forward_length", uint32(m.Shared.IntermediateSize))
		}
		if m.NormTopKProb != e.a.normTopK {
			e.rep.Warnings = append(e.rep.Warnings, fmt.Sprintf("router: the model has norm_topk_prob %v, llama.cpp's %s graph %s the top-%d weights; its outputs will differ", m.NormTopKProb, A, map[bool]string{true: "renormalises", false: "does not renormalise"}[e.a.normTopK], m.TopK))
		}
	}
	if kv := e.src.kv; kv != nil && kv.Cache != "" && kv.Cache != "fp32" {
		e.rep.Warnings = append(e.rep.Warnings, kvWarning(kv.Cache, len(kv.Rotations) > 0))
	}
	return kvs, nil
}

// kvWarning says what llama.cpp KV-cache type replaces an artifact's KV
// scheme, which GGUF does not hold.
func kvWarning(cache string, rot bool) string {
	t := "q8_0"
	switch {
	case cache == "fp16":
		t = "f16"
	case strings.Contains(cache, "2"), strings.Contains(cache, "4"):
		t = "q4_0"
	}
	what := fmt.Sprintf("KV cache %q", cache)
	if rot {
		what += " with OSCAR rotations"
	}
	msg := fmt.Sprintf("%s is not stored in GGUF (llama.cpp quantizes its own KV cache at run time): run llama.cpp with --cache-type-k %s --cache-type-v %s", what, t, t)
	if t != "f16" {
		msg += " (a quantized V cache needs flash attention, -fa)"
	}
	if strings.Contains(cache, "2") {
		msg += "; q4_0 is llama.cpp's smallest KV type, 2-bit has no counterpart"
	}
	return msg
}

// configInt reads an integer field of the model's config.json (when the
// source has one).
func (e *exporter) configInt(key string) (int, bool) {
	b, err := e.src.file("config.json")
	if err != nil {
		return 0, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return 0, false
	}
	var v int
	if raw, ok := m[key]; ok && json.Unmarshal(raw, &v) == nil {
		return v, true
	}
	return 0, false
}

// plan lists the output tensors in llama.cpp's order: token_embd,
// (rope_freqs), then each block's tensors, output_norm, output.
func (e *exporter) plan() error {
	d := e.src.desc
	if err := e.add2D("token_embd.weight", d.Embedding, nil); err != nil {
		return err
	}
	if s := d.RoPE.Scaling; s != nil && s.Type == "llama3" {
		e.addRopeFreqs()
	}
	for i := range d.Layers {
		l := &d.Layers[i]
		b := fmt.Sprintf("blk.%d.", i)
		at := &l.Attn
		var qPerm, kPerm func(int) int
		if e.a.permute {
			qPerm = ropePerm(l.NumHeads, l.HeadDim)
			kPerm = ropePerm(l.NumKVHeads, l.HeadDim)
		}
		steps := []struct {
			out, in string
			perm    func(int) int
			oneD    bool
		}{
			{b + "attn_norm.weight", at.Norm, nil, true},
			{b + "attn_q.weight", at.Q, qPerm, false},
			{b + "attn_q.bias", at.QBias, qPerm, true},
			{b + "attn_k.weight", at.K, kPerm, false},
			{b + "attn_k.bias", at.KBias, kPerm, true},
			{b + "attn_v.weight", at.V, nil, false},
			{b + "attn_v.bias", at.VBias, nil, true},
			{b + "attn_output.weight", at.O, nil, false},
			{b + "attn_output.bias", at.OBias, nil, true},
			{b + "attn_q_norm.weight", at.QNorm, nil, true},
			{b + "attn_k_norm.weight", at.KNorm, nil, true},
			{b + "ffn_norm.weight", l.FFNNorm, nil, true},
		}
		for _, s := range steps {
			if s.in == "" {
				continue
			}
			var err error
			if s.oneD {
				err = e.add1D(s.out, s.in, s.perm)
			} else {
				err = e.add2D(s.out, s.in, s.perm)
			}
			if err != nil {
				return err
			}
		}
		if m := l.MLP; m != nil {
			for _, s := range [][2]string{{"ffn_gate", m.Gate}, {"ffn_up", m.Up}, {"ffn_down", m.Down}} {
				if err := e.add2D(b+s[0]+".weight", s[1], nil); err != nil {
					return err
				}
			}
		}
		if m := l.MoE; m != nil {
			if err := e.add1D(b+"ffn_gate_inp.weight", m.Router, nil); err != nil {
				return err
			}
			for _, s := range []struct {
				out string
				get func(x *arch.MLP) string
			}{{"ffn_gate_exps", func(x *arch.MLP) string { return x.Gate }}, {"ffn_up_exps", func(x *arch.MLP) string { return x.Up }}, {"ffn_down_exps", func(x *arch.MLP) string { return x.Down }}} {
				names := make([]string, len(m.Experts))
				for j := range m.Experts {
					names[j] = s.get(&m.Experts[j])
				}
				if err := e.addExperts(b+s.out+".weight", names); err != nil {
					return err
				}
			}
			if sh := m.Shared; sh != nil {
				for _, s := range [][2]string{{"ffn_gate_shexp", sh.Gate}, {"ffn_up_shexp", sh.Up}, {"ffn_down_shexp", sh.Down}} {
					if err := e.add2D(b+s[0]+".weight", s[1], nil); err != nil {
						return err
					}
				}
				if m.SharedGate != "" {
					if err := e.add1D(b+"ffn_gate_inp_shexp.weight", m.SharedGate, nil); err != nil {
						return err
					}
				}
			}
		}
	}
	if err := e.add1D("output_norm.weight", d.FinalNorm, nil); err != nil {
		return err
	}
	if !d.TieWordEmbeddings && d.LMHead != "" {
		if err := e.add2D("output.weight", d.LMHead, nil); err != nil {
			return err
		}
	}
	return nil
}

// ropePerm returns convert_hf_to_gguf's LlamaModel.permute as a row map
// for heads of headDim rows: output row h·hd + 2i + j is input row
// h·hd + j·hd/2 + i (i < hd/2, j ∈ {0, 1}): the two rotate_half halves of
// each head interleaved into the pairs llama.cpp's normal RoPE rotates.
func ropePerm(heads, headDim int) func(int) int {
	half := headDim / 2
	return func(r int) int {
		h, k := r/headDim, r%headDim
		i, j := k/2, k%2
		return h*headDim + j*half + i
	}
}

// addRopeFreqs adds rope_freqs.weight, llama.cpp's form of Llama 3.1
// RoPE scaling (LlamaModel.generate_extra_tensors in convert_hf_to_gguf):
// per frequency pair a divisor of the rotation frequency.
func (e *exporter) addRopeFreqs() {
	d := e.src.desc
	s := d.RoPE.Scaling
	dim := d.Layers[0].HeadDim
	factors := make([]float32, dim/2)
	old := float64(s.OriginalMaxPositionEmbeddings)
	lowW, highW := old/s.LowFreqFactor, old/s.HighFreqFactor
	for i := range factors {
		freq := 1 / math.Pow(d.RoPE.Theta, float64(2*i)/float64(dim))
		wl := 2 * math.Pi / freq
		switch {
		case wl < highW:
			factors[i] = 1
		case wl > lowW:
			factors[i] = float32(s.Factor)
		default:
			sm := (old/wl - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
			factors[i] = float32(1 / ((1-sm)/s.Factor + sm))
		}
	}
	b := safetensors.F32Bytes(factors)
	e.out = append(e.out, planned{
		info: gguf.TensorInfo{Name: "rope_freqs.weight", Dims: []uint64{uint64(len(factors))}, Type: gguf.TypeF32},
		row: TensorRow{Name: "rope_freqs.weight", Shape: []int{len(factors)}, From: "rope_scaling llama3", To: "F32", Mode: ModeExact,
			Reason: "Llama 3.1 RoPE scaling as llama.cpp's frequency factors"},
		produce: func() ([]byte, *TensorRow, error) { return b, nil, nil },
	})
}

// add1D plans a tensor stored F32 (norms, biases, routers: what
// convert_hf_to_gguf keeps in F32). perm, when set, reorders its rows
// (the first dimension).
func (e *exporter) add1D(out, in string, perm func(int) int) error {
	shape, err := e.src.shapeOf(in)
	if err != nil {
		return err
	}
	dims := gguf.DimsOf(shape)
	// A [1, hidden] shared-expert gate is llama.cpp's {n_embd}.
	if len(shape) == 2 && shape[0] == 1 {
		dims = dims[:1]
	}
	from := "F32"
	if tq, ok := e.src.quantOf(in); ok {
		from = quantDesc(tq)
	}
	row := TensorRow{Name: out, Source: in, Shape: shape, From: from, To: "F32", Mode: ModeExact}
	e.out = append(e.out, planned{
		info: gguf.TensorInfo{Name: out, Dims: dims, Type: gguf.TypeF32},
		row:  row,
		produce: func() ([]byte, *TensorRow, error) {
			w, err := e.src.load(in)
			if err != nil {
				return nil, nil, err
			}
			v, err := w.floats()
			if err != nil {
				return nil, nil, err
			}
			if perm != nil {
				v = permuteRows(v, shape[0], perm)
			}
			r := row
			r.From = w.from()
			switch {
			case w.q != nil:
				r.Reason = "dequantized to F32 (lmpack's values exactly)"
			case w.t.DType != safetensors.F32:
				r.Reason = "1-D tensors and routers are stored F32, as convert_hf_to_gguf does (lossless)"
			}
			return safetensors.F32Bytes(v), &r, nil
		},
	})
	return nil
}

func permuteRows(v []float32, rows int, perm func(int) int) []float32 {
	cols := len(v) / rows
	out := make([]float32, len(v))
	for r := 0; r < rows; r++ {
		copy(out[r*cols:(r+1)*cols], v[perm(r)*cols:(perm(r)+1)*cols])
	}
	return out
}

// meta is what planning knows of a weight without reading its values.
type meta struct {
	name  string
	shape []int
	dtype safetensors.DType // float weights
	tq    *arch.TensorQuant // quantized weights
}

func (e *exporter) metaOf(name string) (*meta, error) {
	shape, err := e.src.shapeOf(name)
	if err != nil {
		return nil, err
	}
	if len(shape) != 2 {
		return nil, fmt.Errorf("export: %s: tensor %q has shape %v, want 2-D", e.src.path, name, shape)
	}
	m := &meta{name: name, shape: shape}
	if tq, ok := e.src.quantOf(name); ok {
		m.tq = &tq
	} else {
		t, err := e.src.info(name)
		if err != nil {
			return nil, err
		}
		m.dtype = t.DType
	}
	return m, nil
}

func (m *meta) from() string {
	if m.tq != nil {
		return quantDesc(*m.tq)
	}
	return string(m.dtype)
}

var floatType = map[safetensors.DType]gguf.Type{safetensors.F32: gguf.TypeF32, safetensors.F16: gguf.TypeF16, safetensors.BF16: gguf.TypeBF16}

// choose returns the GGUF type of a 2-D weight and why, falling back as
// llama-quantize does when the row length does not fit the type's blocks.
func (e *exporter) choose(m *meta) (gguf.Type, string, error) {
	cols := m.shape[1]
	var t gguf.Type
	var why string
	if e.want == "auto" {
		if m.tq == nil {
			ft, ok := floatType[m.dtype]
			if !ok {
				return 0, "", fmt.Errorf("export: %s: tensor %q has dtype %s, want F32, F16 or BF16", e.src.path, m.name, m.dtype)
			}
			return ft, "", nil
		}
		q := m.tq
		switch {
		case q.Bits == 8:
			t = gguf.TypeQ8_0
		case q.Bits <= 4 && q.GroupSize%32 == 0:
			t = gguf.TypeQ4_0
			if !q.Symmetric && q.Bits == 4 || q.Bits == 1 {
				t = gguf.TypeQ4_1
			}
		default:
			t, why = gguf.TypeQ4_K, fmt.Sprintf("group size %d is not a multiple of 32: no exact block type; Q4_K is the nearest llama.cpp type at >= %d bits", q.GroupSize, q.Bits)
		}
	} else {
		var err error
		if t, err = gguf.ParseType(e.want); err != nil {
			return 0, "", err
		}
	}
	// Fallbacks for rows that are not whole blocks (llama-quantize's
	// tensor-type fallback: Q6_K → Q8_0, Q4_K → Q5_0, which this exporter
	// does not write, so Q4_1; no 32-block fits → F16).
	if bs := t.BlockSize(); bs > 1 && cols%bs != 0 {
		switch t {
		case gguf.TypeQ6_K:
			why, t = fmt.Sprintf("rows of %d values are not multiples of 256 (k-quants): Q8_0 instead of Q6_K, as llama-quantize does", cols), gguf.TypeQ8_0
		case gguf.TypeQ4_K:
			why, t = fmt.Sprintf("rows of %d values are not multiples of 256 (k-quants): Q4_1 instead of Q4_K (llama-quantize would take Q5_0, which this exporter does not write)", cols), gguf.TypeQ4_1
		}
		if cols%t.BlockSize() != 0 {
			why, t = fmt.Sprintf("rows of %d values are not multiples of 32: no block type fits; F16, as llama-quantize does", cols), gguf.TypeF16
		}
	}
	return t, why, nil
}

// typeRank orders types by fidelity for "the widest" of mixed experts.
var typeRank = map[gguf.Type]int{gguf.TypeQ4_0: 1, gguf.TypeQ4_K: 2, gguf.TypeQ4_1: 3, gguf.TypeQ6_K: 4, gguf.TypeQ8_0: 5, gguf.TypeBF16: 6, gguf.TypeF16: 7, gguf.TypeF32: 8}

// add2D plans a 2-D weight (rows permuted by perm when set).
func (e *exporter) add2D(out, in string, perm func(int) int) error {
	m, err := e.metaOf(in)
	if err != nil {
		return err
	}
	t, why, err := e.choose(m)
	if err != nil {
		return err
	}
	row := TensorRow{Name: out, Source: in, Shape: m.shape, From: m.from(), To: t.String()}
	e.out = append(e.out, planned{
		info: gguf.TensorInfo{Name: out, Dims: gguf.DimsOf(m.shape), Type: t},
		row:  row,
		produce: func() ([]byte, *TensorRow, error) {
			b, mode, reason, err := e.convert(in, t, perm)
			if err != nil {
				return nil, nil, err
			}
			r := row
			r.Mode, r.Reason = mode, joinReason(why, reason)
			return b, &r, nil
		},
	})
	return nil
}

func joinReason(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// addExperts plans a stacked expert tensor [experts, rows, cols] (ggml
// {cols, rows, experts}) from the experts' weights.
func (e *exporter) addExperts(out string, names []string) error {
	ms := make([]*meta, len(names))
	types := make([]gguf.Type, len(names))
	var why string
	for j, n := range names {
		m, err := e.metaOf(n)
		if err != nil {
			return err
		}
		if j > 0 && !slices.Equal(m.shape, ms[0].shape) {
			return fmt.Errorf("export: %s: expert tensor %q has shape %v, %q %v: a stacked GGUF expert tensor needs equal shapes", e.src.path, n, m.shape, names[0], ms[0].shape)
		}
		ms[j] = m
		if types[j], why, err = e.choose(m); err != nil {
			return err
		}
	}
	t := types[0]
	mixed := false
	for _, x := range types[1:] {
		if x != t {
			mixed = true
			if typeRank[x] > typeRank[t] {
				t = x
			}
		}
	}
	shape := append([]int{len(names)}, ms[0].shape...)
	row := TensorRow{Name: out, Source: names[0], Shape: shape, From: ms[0].from(), To: t.String()}
	froms := map[string]bool{}
	for _, m := range ms {
		froms[m.from()] = true
	}
	if len(froms) > 1 {
		fs := make([]string, 0, len(froms))
		for f := range froms {
			fs = append(fs, f)
		}
		sort.Strings(fs)
		row.From = "mixed: " + strings.Join(fs, ", ")
	}
	if mixed && !e.opt.AllowRequant {
		row.Mode, row.To = ModeRefused, ""
		row.Reason = fmt.Sprintf("experts quantized at different widths (%s): one stacked GGUF tensor has one type; --allow-requant writes all as %v (the widest), requantizing the others", row.From[len("mixed: "):], t)
		e.out = append(e.out, planned{row: row})
		return nil
	}
	if mixed {
		why = joinReason(why, fmt.Sprintf("experts at mixed widths written as the widest, %v (--allow-requant)", t))
	}
	e.out = append(e.out, planned{
		info: gguf.TensorInfo{Name: out, Dims: gguf.DimsOf(shape), Type: t},
		row:  row,
		produce: func() ([]byte, *TensorRow, error) {
			ti := gguf.TensorInfo{Name: out, Dims: gguf.DimsOf(shape), Type: t}
			size, _ := ti.Size()
			all := make([]byte, 0, size)
			modes := map[string]int{}
			var reasons []string
			for _, n := range names {
				b, mode, reason, err := e.convert(n, t, nil)
				if err != nil {
					return nil, nil, err
				}
				all = append(all, b...)
				modes[mode]++
				if reason != "" && !slices.Contains(reasons, reason) {
					reasons = append(reasons, reason)
				}
			}
			r := row
			r.Mode = ModeExact
			if modes[ModeRequantized] > 0 {
				r.Mode = ModeRequantized
				why := fmt.Sprintf("%d of %d experts requantized", modes[ModeRequantized], len(names))
				reasons = append([]string{why}, reasons...)
			}
			r.Reason = joinReason(row.Reason, joinReason(why, strings.Join(reasons, "; ")))
			return all, &r, nil
		},
	})
	return nil
}

// convert reads weight in and writes it as type t (rows permuted by
// perm): exactly when the storage maps onto t, else from its float values.
func (e *exporter) convert(in string, t gguf.Type, perm func(int) int) ([]byte, string, string, error) {
	w, err := e.src.load(in)
	if err != nil {
		return nil, "", "", err
	}
	rows, cols := w.shape[0], w.shape[1]
	if w.q != nil {
		if perm != nil {
			w.q = permuteQuantRows(w.q, perm)
		}
		switch t {
		case gguf.TypeQ8_0, gguf.TypeQ4_0, gguf.TypeQ4_1:
			b, c, err := gguf.FromQuantizedAs(w.q, t)
			if err == nil {
				if c.Exact {
					return b, ModeExact, c.Reason, nil
				}
				return b, ModeRequantized, fmt.Sprintf("%s (max |error| %.3g)", c.Reason, c.MaxAbsErr), nil
			}
			if !errors.Is(err, gguf.ErrNotExact) {
				return nil, "", "", fmt.Errorf("export: %s: %w", in, err)
			}
			why := strings.TrimPrefix(err.Error(), "gguf: ")
			v, _ := w.floats()
			b, err = gguf.Quantize(t, v, cols)
			if err != nil {
				return nil, "", "", fmt.Errorf("export: %s: %w", in, err)
			}
			return b, ModeRequantized, "from the dequantized weights: " + why, nil
		case gguf.TypeF32:
			v, _ := w.floats()
			return safetensors.F32Bytes(v), ModeExact, "dequantized to F32 (lmpack's values exactly)", nil
		}
		v, _ := w.floats()
		b, err := gguf.Quantize(t, v, cols)
		if err != nil {
			return nil, "", "", fmt.Errorf("export: %s: %w", in, err)
		}
		return b, ModeRequantized, "from the dequantized weights", nil
	}
	ft := floatType[w.t.DType]
	if ft == t {
		data := w.t.Data
		if perm != nil {
			data = permuteByteRows(data, rows, perm)
		}
		return data, ModeExact, "", nil
	}
	v, err := w.floats()
	if err != nil {
		return nil, "", "", err
	}
	if perm != nil {
		v = permuteRows(v, rows, perm)
	}
	b, err := gguf.Quantize(t, v, cols)
	if err != nil {
		return nil, "", "", fmt.Errorf("export: %s: %w", in, err)
	}
	if t == gguf.TypeF32 {
		return b, ModeExact, fmt.Sprintf("%s widened to F32 (lossless)", w.t.DType), nil
	}
	return b, ModeRequantized, fmt.Sprintf("converted from %s", w.t.DType), nil
}

func permuteByteRows(b []byte, rows int, perm func(int) int) []byte {
	rb := len(b) / rows
	out := make([]byte, len(b))
	for r := 0; r < rows; r++ {
		copy(out[r*rb:(r+1)*rb], b[perm(r)*rb:(perm(r)+1)*rb])
	}
	return out
}

// permuteQuantRows returns q with its rows (codes, scales, zero-points)
// reordered: output row r is input row perm(r).
func permuteQuantRows(q *weights.Quantized, perm func(int) int) *weights.Quantized {
	p := *q
	g := q.Cols / q.GroupSize
	p.Codes = permuteByteRows(q.Codes, q.Rows, perm)
	p.Scales = make([]uint16, len(q.Scales))
	for r := 0; r < q.Rows; r++ {
		copy(p.Scales[r*g:(r+1)*g], q.Scales[perm(r)*g:(perm(r)+1)*g])
	}
	if q.Zeros != nil {
		p.Zeros = make([]uint16, len(q.Zeros))
		for r := 0; r < q.Rows; r++ {
			copy(p.Zeros[r*g:(r+1)*g], q.Zeros[perm(r)*g:(perm(r)+1)*g])
		}
	}
	return &p
}

// fileType is general.file_type (llama_ftype) of the most common type of
// the 2-D weights.
func (e *exporter) fileType() uint32 {
	count := map[gguf.Type]int{}
	for _, p := range e.out {
		if len(p.info.Dims) >= 2 {
			count[p.info.Type]++
		}
	}
	best, n := gguf.TypeF32, -1
	for _, t := range []gguf.Type{gguf.TypeF32, gguf.TypeF16, gguf.TypeBF16, gguf.TypeQ8_0, gguf.TypeQ6_K, gguf.TypeQ4_1, gguf.TypeQ4_K, gguf.TypeQ4_0} {
		if count[t] > n {
			best, n = t, count[t]
		}
	}
	return map[gguf.Type]uint32{gguf.TypeF32: 0, gguf.TypeF16: 1, gguf.TypeQ4_0: 2, gguf.TypeQ4_1: 3, gguf.TypeQ8_0: 7, gguf.TypeQ4_K: 15, gguf.TypeQ6_K: 18, gguf.TypeBF16: 32}[best]
}

func (e *exporter) quantized() bool {
	for _, p := range e.out {
		if p.info.Type.BlockSize() > 1 {
			return true
		}
	}
	return false
}
