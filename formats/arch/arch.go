package arch

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// ErrUnsupportedArch is wrapped by Parse when config.json names an
// architecture that no adapter is registered for.
var ErrUnsupportedArch = errors.New("unsupported architecture")

// Description is the normalized description of a decoder-only transformer.
// Sizes are element counts; all tensors named here are row-major with the
// Hugging Face layout (a Linear weight is [out_features, in_features]).
type Description struct {
	// Architecture is config.json's architectures[0], e.g. "LlamaForCausalLM".
	Architecture string
	// ModelType is config.json's model_type, e.g. "llama".
	ModelType string
	// HiddenSize is the residual width (hidden_size).
	HiddenSize int
	// VocabSize is the number of rows of the embedding and lm_head.
	VocabSize int
	// MaxPositionEmbeddings is the trained context length in tokens.
	MaxPositionEmbeddings int
	// RMSNormEps is the epsilon of every RMSNorm.
	RMSNormEps float64
	// RoPE gives the rotary position embedding (rotate_half convention).
	RoPE RoPE
	// TieWordEmbeddings: lm_head reuses the embedding matrix when LMHead is
	// absent from the checkpoint.
	TieWordEmbeddings bool
	// BOSTokenID is -1 when config.json gives none.
	BOSTokenID int
	// EOSTokenIDs lists every end-of-sequence id (config.json allows a list).
	EOSTokenIDs []int
	// Embedding, FinalNorm and LMHead are tensor names: [vocab, hidden],
	// [hidden] and [vocab, hidden].
	Embedding, FinalNorm, LMHead string
	// Layers describes each decoder block; heterogeneous layers (after
	// pruning) differ in head counts and FFN sizes.
	Layers []Layer
	// Quant is config.json's lmpack_quantization block (docs/QUANT.md):
	// the weights stored as packed codes with fp16 scales. nil for a plain
	// floating-point checkpoint.
	Quant *Quantization
}

// RoPE is the rotary position embedding, applied to the whole head_dim.
// Theta is rope_theta (top level or inside rope_parameters); Scaling is nil
// for plain RoPE.
type RoPE struct {
	Theta   float64
	Scaling *RoPEScaling
}

// RoPEScaling is config.json's rope_scaling (v4) or rope_parameters (v5).
// Type is "linear" (positions divided by Factor) or "llama3"
// (frequency-dependent scaling, Llama 3.1).
type RoPEScaling struct {
	Type                          string
	Factor                        float64
	LowFreqFactor                 float64
	HighFreqFactor                float64
	OriginalMaxPositionEmbeddings int
}

// Layer describes one decoder block.
type Layer struct {
	// NumHeads is num_attention_heads; NumKVHeads is num_key_value_heads
	// (GQA: NumHeads is a multiple of NumKVHeads); HeadDim is head_dim.
	NumHeads, NumKVHeads, HeadDim int
	// SlidingWindow limits attention to the last SlidingWindow tokens
	// (the query included); 0 means full causal attention.
	SlidingWindow int
	// Attn names the attention tensors.
	Attn Attention
	// FFNNorm is post_attention_layernorm.weight, [hidden].
	FFNNorm string
	// MLP is the dense SwiGLU FFN; nil when MoE is set.
	MLP *MLP
	// MoE is the sparse FFN; nil for a dense layer.
	MoE *MoE
}

// Attention names a block's attention tensors; an empty name means the
// tensor is absent. Shapes: Norm [hidden]; Q [heads*head_dim, hidden];
// K, V [kv_heads*head_dim, hidden]; O [hidden, heads*head_dim]; biases are
// the matching output sizes; QNorm, KNorm [head_dim] (Qwen3).
type Attention struct {
	Norm, Q, K, V, O           string
	QBias, KBias, VBias, OBias string
	QNorm, KNorm               string
}

// MLP is a SwiGLU FFN: down(silu(gate(x)) * up(x)). Gate, Up: [I, hidden];
// Down: [hidden, I]; I = IntermediateSize.
type MLP struct {
	Gate, Up, Down   string
	IntermediateSize int
}

// MoE is a sparse mixture-of-experts FFN. The router (Router: [experts,
// hidden]) scores experts; routing is softmax over all experts, then top-k,
// then renormalisation of the k weights when NormTopKProb. Shared, when
// set, is an always-on expert whose output is scaled by
// sigmoid(SharedGate·x) (SharedGate: [1, hidden]) when SharedGate is set.
type MoE struct {
	Router       string
	NumExperts   int
	TopK         int
	NormTopKProb bool
	Experts      []MLP
	Shared       *MLP
	SharedGate   string
}

// QDim returns NumHeads*HeadDim, the width of q (elements).
func (l *Layer) QDim() int { return l.NumHeads * l.HeadDim }

// KVDim returns NumKVHeads*HeadDim, the width of k and v (elements).
func (l *Layer) KVDim() int { return l.NumKVHeads * l.HeadDim }

// TensorNames lists every tensor name the description refers to, sorted.
// LMHead is included only when untied.
func (d *Description) TensorNames() []string {
	var out []string
	add := func(s ...string) {
		for _, n := range s {
			if n != "" {
				out = append(out, n)
			}
		}
	}
	add(d.Embedding, d.FinalNorm)
	if !d.TieWordEmbeddings {
		add(d.LMHead)
	}
	addMLP := func(m *MLP) { add(m.Gate, m.Up, m.Down) }
	for i := range d.Layers {
		l := &d.Layers[i]
		a := l.Attn
		add(a.Norm, a.Q, a.K, a.V, a.O, a.QBias, a.KBias, a.VBias, a.OBias, a.QNorm, a.KNorm, l.FFNNorm)
		if l.MLP != nil {
			addMLP(l.MLP)
		}
		if l.MoE != nil {
			add(l.MoE.Router, l.MoE.SharedGate)
			for e := range l.MoE.Experts {
				addMLP(&l.MoE.Experts[e])
			}
			if l.MoE.Shared != nil {
				addMLP(l.MoE.Shared)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Validate checks the description's internal consistency: positive sizes,
// max_position_embeddings not negative (0: not given), NumHeads a multiple of NumKVHeads, sliding_window not
// negative (0: full attention), even HeadDim (RoPE), TopK within
// NumExperts. It returns an error naming the layer and field.
func (d *Description) Validate() error {
	if d.HiddenSize <= 0 || d.VocabSize <= 0 || len(d.Layers) == 0 {
		return fmt.Errorf("arch: %s: hidden_size %d, vocab_size %d, num_hidden_layers %d: want all > 0",
			d.Architecture, d.HiddenSize, d.VocabSize, len(d.Layers))
	}
	if d.RMSNormEps <= 0 {
		return fmt.Errorf("arch: %s: rms_norm_eps %g: want > 0", d.Architecture, d.RMSNormEps)
	}
	if d.BOSTokenID < -1 || d.BOSTokenID >= d.VocabSize {
		return fmt.Errorf("arch: %s: bos_token_id %d: want an id in [0, vocab_size %d)", d.Architecture, d.BOSTokenID, d.VocabSize)
	}
	for _, id := range d.EOSTokenIDs {
		if id < 0 || id >= d.VocabSize {
			return fmt.Errorf("arch: %s: eos_token_id %d: want an id in [0, vocab_size %d)", d.Architecture, id, d.VocabSize)
		}
	}
	if d.MaxPositionEmbeddings < 0 {
		return fmt.Errorf("arch: %s: max_position_embeddings %d: want > 0 (or leave it out)", d.Architecture, d.MaxPositionEmbeddings)
	}
	if d.RoPE.Theta <= 0 {
		return fmt.Errorf("arch: %s: rope_theta %g: want > 0", d.Architecture, d.RoPE.Theta)
	}
	if sc := d.RoPE.Scaling; sc != nil {
		switch {
		case sc.Type != "linear" && sc.Type != "llama3":
			return fmt.Errorf("arch: %s: rope_scaling type %q: want linear or llama3 (the scalings lmpack runs)", d.Architecture, sc.Type)
		case sc.Factor <= 0:
			return fmt.Errorf("arch: %s: rope_scaling %s: factor %g: want > 0", d.Architecture, sc.Type, sc.Factor)
		case sc.Type == "llama3" && (sc.LowFreqFactor <= 0 || sc.HighFreqFactor <= sc.LowFreqFactor || sc.OriginalMaxPositionEmbeddings <= 0):
			return fmt.Errorf("arch: %s: rope_scaling llama3: low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d: want positive, high > low",
				d.Architecture, sc.LowFreqFactor, sc.HighFreqFactor, sc.OriginalMaxPositionEmbeddings)
		}
	}
	for i := range d.Layers {
		l := &d.Layers[i]
		switch {
		case l.NumHeads <= 0 || l.NumKVHeads <= 0 || l.HeadDim <= 0:
			return fmt.Errorf("arch: %s: layer %d: num_attention_heads %d, num_key_value_heads %d, head_dim %d: want all > 0",
				d.Architecture, i, l.NumHeads, l.NumKVHeads, l.HeadDim)
		case l.NumHeads%l.NumKVHeads != 0:
			return fmt.Errorf("arch: %s: layer %d: num_attention_heads %d is not a multiple of num_key_value_heads %d",
				d.Architecture, i, l.NumHeads, l.NumKVHeads)
		case l.SlidingWindow < 0:
			return fmt.Errorf("arch: %s: layer %d: sliding_window %d: want > 0 (or null for full causal attention)", d.Architecture, i, l.SlidingWindow)
		case l.HeadDim%2 != 0:
			return fmt.Errorf("arch: %s: layer %d: head_dim %d is odd; RoPE needs an even head_dim", d.Architecture, i, l.HeadDim)
		case (l.MLP == nil) == (l.MoE == nil):
			return fmt.Errorf("arch: %s: layer %d: want exactly one of a dense MLP and an MoE", d.Architecture, i)
		}
		if l.MLP != nil && l.MLP.IntermediateSize <= 0 {
			return fmt.Errorf("arch: %s: layer %d: intermediate_size %d: want > 0", d.Architecture, i, l.MLP.IntermediateSize)
		}
		if m := l.MoE; m != nil {
			if m.NumExperts <= 0 || m.TopK <= 0 || m.TopK > m.NumExperts || len(m.Experts) != m.NumExperts {
				return fmt.Errorf("arch: %s: layer %d: %d experts, num_experts_per_tok %d: want 0 < top-k <= experts",
					d.Architecture, i, m.NumExperts, m.TopK)
			}
			for e := range m.Experts {
				if m.Experts[e].IntermediateSize <= 0 {
					return fmt.Errorf("arch: %s: layer %d expert %d: intermediate size %d: want > 0", d.Architecture, i, e, m.Experts[e].IntermediateSize)
				}
			}
		}
	}
	return nil
}

// Adapter turns one family's config.json into a Description.
type Adapter interface {
	// Describe parses config.json's bytes. Errors name the field.
	Describe(configJSON []byte) (*Description, error)
}

var (
	regMu    sync.RWMutex
	registry = map[string]func() Adapter{}
)

// Register adds an adapter for an architectures[0] name. It panics when the
// name is registered twice (a programming error).
func Register(name string, f func() Adapter) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := registry[name]; dup {
		panic("arch: duplicate registration of " + name)
	}
	registry[name] = f
}

// Supported returns the registered architecture names, sorted.
func Supported() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Parse reads config.json's bytes and returns the validated Description.
// Errors: invalid JSON; no architectures; an unregistered architecture
// (wraps ErrUnsupportedArch and lists the supported ones); a field out of
// range; a malformed lmpack_quantization block (wraps ErrQuant, naming the
// tensor).
func Parse(configJSON []byte) (*Description, error) {
	var head struct {
		Architectures []string `json:"architectures"`
		ModelType     string   `json:"model_type"`
	}
	if err := json.Unmarshal(configJSON, &head); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "" {
			return nil, fmt.Errorf("arch: config.json: the file holds a JSON %s, want a JSON object", te.Value)
		}
		if errors.As(err, &te) {
			return nil, fmt.Errorf("arch: config.json: field %s: got JSON %s, want %s", te.Field, te.Value, map[string]string{"architectures": "a list of strings", "model_type": "a string"}[te.Field])
		}
		return nil, fmt.Errorf("arch: config.json: %w", err)
	}
	if len(head.Architectures) == 0 {
		return nil, fmt.Errorf("arch: config.json: no \"architectures\" entry (model_type %q); supported: %s",
			head.ModelType, strings.Join(Supported(), ", "))
	}
	name := head.Architectures[0]
	regMu.RLock()
	f := registry[name]
	regMu.RUnlock()
	if f == nil {
		return nil, fmt.Errorf("arch: config.json: architecture %q: %w; supported: %s",
			name, ErrUnsupportedArch, strings.Join(Supported(), ", "))
	}
	d, err := f().Describe(configJSON)
	if err != nil {
		return nil, fmt.Errorf("arch: config.json (%s): %w", name, err)
	}
	d.Architecture = name
	if d.ModelType == "" {
		d.ModelType = head.ModelType
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	if d.Quant, err = parseQuant(configJSON, d); err != nil {
		return nil, err
	}
	return d, nil
}

// Load reads dir/config.json and parses it. Errors name the file.
func Load(dir string) (*Description, error) {
	p := filepath.Join(dir, "config.json")
	b, err := fsx.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("arch: %w", err)
	}
	d, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return d, nil
}

// TensorShapes returns every tensor the description names with its
// expected row-major shape (a Linear weight is [out_features,
// in_features]; norms and biases are 1-d; the shared-expert gate is
// [1, hidden]). LMHead is included only when untied.
func (d *Description) TensorShapes() map[string][]int {
	H := d.HiddenSize
	s := map[string][]int{d.Embedding: {d.VocabSize, H}, d.FinalNorm: {H}}
	if !d.TieWordEmbeddings {
		s[d.LMHead] = []int{d.VocabSize, H}
	}
	mlp := func(m *MLP) {
		s[m.Gate] = []int{m.IntermediateSize, H}
		s[m.Up] = []int{m.IntermediateSize, H}
		s[m.Down] = []int{H, m.IntermediateSize}
	}
	for i := range d.Layers {
		l := &d.Layers[i]
		a := l.Attn
		s[a.Norm], s[l.FFNNorm] = []int{H}, []int{H}
		s[a.Q], s[a.K], s[a.V], s[a.O] = []int{l.QDim(), H}, []int{l.KVDim(), H}, []int{l.KVDim(), H}, []int{H, l.QDim()}
		if a.QBias != "" {
			s[a.QBias] = []int{l.QDim()}
		}
		if a.KBias != "" {
			s[a.KBias] = []int{l.KVDim()}
		}
		if a.VBias != "" {
			s[a.VBias] = []int{l.KVDim()}
		}
		if a.OBias != "" {
			s[a.OBias] = []int{H}
		}
		if a.QNorm != "" {
			s[a.QNorm] = []int{l.HeadDim}
		}
		if a.KNorm != "" {
			s[a.KNorm] = []int{l.HeadDim}
		}
		if l.MLP != nil {
			mlp(l.MLP)
		}
		if m := l.MoE; m != nil {
			s[m.Router] = []int{m.NumExperts, H}
			for e := range m.Experts {
				mlp(&m.Experts[e])
			}
			if m.Shared != nil {
				mlp(m.Shared)
			}
			if m.SharedGate != "" {
				s[m.SharedGate] = []int{1, H}
			}
		}
	}
	return s
}
