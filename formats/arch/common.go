package arch

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// baseConfig holds the config.json fields shared by the Llama family and
// its descendants (Mistral, Qwen2/3, Mixtral, Qwen MoE).
type baseConfig struct {
	ModelType             string           `json:"model_type"`
	HiddenSize            int              `json:"hidden_size"`
	IntermediateSize      int              `json:"intermediate_size"`
	NumHiddenLayers       int              `json:"num_hidden_layers"`
	NumAttentionHeads     int              `json:"num_attention_heads"`
	NumKeyValueHeads      *int             `json:"num_key_value_heads"`
	HeadDim               *int             `json:"head_dim"`
	VocabSize             int              `json:"vocab_size"`
	MaxPositionEmbeddings int              `json:"max_position_embeddings"`
	RMSNormEps            *float64         `json:"rms_norm_eps"`
	RopeTheta             *float64         `json:"rope_theta"`
	RopeScaling           *ropeScalingJSON `json:"rope_scaling"`
	TieWordEmbeddings     *bool            `json:"tie_word_embeddings"`
	BOSTokenID            *int             `json:"bos_token_id"`
	EOSTokenID            json.RawMessage  `json:"eos_token_id"`
	HiddenAct             string           `json:"hidden_act"`
	AttentionBias         bool             `json:"attention_bias"`
	MLPBias               bool             `json:"mlp_bias"`
	SlidingWindow         *int             `json:"sliding_window"`
	UseSlidingWindow      *bool            `json:"use_sliding_window"`
	MaxWindowLayers       int              `json:"max_window_layers"`
	// LayerConfigs is lmpack's extension for pruned checkpoints whose layers
	// differ in head counts and FFN sizes (stock loaders cannot read these).
	LayerConfigs []layerConfigJSON `json:"layer_configs"`
	// QuantizationConfig marks a pre-quantized checkpoint (GPTQ, AWQ,
	// FP8, bitsandbytes), which lmpack does not read.
	QuantizationConfig json.RawMessage `json:"quantization_config"`
}

type ropeScalingJSON struct {
	Type                          string  `json:"type"`
	RopeType                      string  `json:"rope_type"`
	Factor                        float64 `json:"factor"`
	LowFreqFactor                 float64 `json:"low_freq_factor"`
	HighFreqFactor                float64 `json:"high_freq_factor"`
	OriginalMaxPositionEmbeddings int     `json:"original_max_position_embeddings"`
}

type layerConfigJSON struct {
	NumAttentionHeads int `json:"num_attention_heads"`
	NumKeyValueHeads  int `json:"num_key_value_heads"`
	IntermediateSize  int `json:"intermediate_size"`
}

// familyOpts states what differs between families that share baseConfig.
type familyOpts struct {
	qkvBias     bool // Qwen2: q/k/v biases always present, no o bias
	qkNorm      bool // Qwen3: RMSNorm over head_dim on q and k
	tieDefault  bool // default of tie_word_embeddings
	ropeDefault float64
	// qwenWindow: the family has use_sliding_window (Qwen), default false;
	// otherwise sliding_window applies to every layer (Mistral).
	qwenWindow bool
}

// describeBase builds the common part of the description (everything but
// the FFN of each layer, which the family adapter fills in).
func describeBase(raw []byte, c *baseConfig, f familyOpts) (*Description, error) {
	if f.qwenWindow {
		off := false
		c.UseSlidingWindow = &off
	}
	if err := json.Unmarshal(raw, c); err != nil {
		return nil, jsonErr(err)
	}
	if q := c.QuantizationConfig; len(q) != 0 && string(q) != "null" {
		var m struct {
			QuantMethod string `json:"quant_method"`
		}
		json.Unmarshal(q, &m)
		return nil, fmt.Errorf("quantization_config (quant_method %q): pre-quantized checkpoints are not supported; use the original floating-point checkpoint", m.QuantMethod)
	}
	if c.HiddenAct != "" && c.HiddenAct != "silu" && c.HiddenAct != "swish" {
		return nil, fmt.Errorf("hidden_act %q unsupported (want silu)", c.HiddenAct)
	}
	if c.MLPBias {
		return nil, fmt.Errorf("mlp_bias true unsupported")
	}
	if c.NumHiddenLayers <= 0 || c.NumHiddenLayers > 1<<12 {
		return nil, fmt.Errorf("num_hidden_layers %d: want 1..4096", c.NumHiddenLayers)
	}
	if c.NumAttentionHeads <= 0 {
		return nil, fmt.Errorf("num_attention_heads %d: want > 0", c.NumAttentionHeads)
	}
	if c.HiddenSize <= 0 {
		return nil, fmt.Errorf("hidden_size %d: want > 0", c.HiddenSize)
	}
	d := &Description{
		ModelType:             c.ModelType,
		HiddenSize:            c.HiddenSize,
		VocabSize:             c.VocabSize,
		MaxPositionEmbeddings: c.MaxPositionEmbeddings,
		RMSNormEps:            1e-6,
		RoPE:                  RoPE{Theta: f.ropeDefault},
		TieWordEmbeddings:     f.tieDefault,
		BOSTokenID:            -1,
		Embedding:             "model.embed_tokens.weight",
		FinalNorm:             "model.norm.weight",
		LMHead:                "lm_head.weight",
	}
	if c.RMSNormEps != nil {
		d.RMSNormEps = *c.RMSNormEps
	}
	if c.RopeTheta != nil {
		d.RoPE.Theta = *c.RopeTheta
	}
	if c.TieWordEmbeddings != nil {
		d.TieWordEmbeddings = *c.TieWordEmbeddings
	}
	if c.BOSTokenID != nil {
		d.BOSTokenID = *c.BOSTokenID
	}
	eos, err := parseIDs(c.EOSTokenID)
	if err != nil {
		return nil, fmt.Errorf("eos_token_id: %w", err)
	}
	d.EOSTokenIDs = eos
	if s := c.RopeScaling; s != nil {
		t := s.RopeType
		if t == "" {
			t = s.Type
		}
		switch t {
		case "", "default":
		case "linear":
			if s.Factor <= 0 {
				return nil, fmt.Errorf("rope_scaling linear: factor %g: want > 0", s.Factor)
			}
			d.RoPE.Scaling = &RoPEScaling{Type: t, Factor: s.Factor}
		case "llama3":
			if s.Factor <= 0 || s.LowFreqFactor <= 0 || s.HighFreqFactor <= s.LowFreqFactor || s.OriginalMaxPositionEmbeddings <= 0 {
				return nil, fmt.Errorf("rope_scaling llama3: factor %g, low_freq_factor %g, high_freq_factor %g, original_max_position_embeddings %d: want positive, high > low",
					s.Factor, s.LowFreqFactor, s.HighFreqFactor, s.OriginalMaxPositionEmbeddings)
			}
			d.RoPE.Scaling = &RoPEScaling{Type: t, Factor: s.Factor, LowFreqFactor: s.LowFreqFactor,
				HighFreqFactor: s.HighFreqFactor, OriginalMaxPositionEmbeddings: s.OriginalMaxPositionEmbeddings}
		default:
			return nil, fmt.Errorf("rope_scaling type %q unsupported (want linear or llama3)", t)
		}
	}
	kv := c.NumAttentionHeads
	if c.NumKeyValueHeads != nil {
		kv = *c.NumKeyValueHeads
	}
	hd := 0
	if c.HeadDim != nil && *c.HeadDim > 0 {
		hd = *c.HeadDim
	} else {
		if c.HiddenSize%c.NumAttentionHeads != 0 {
			return nil, fmt.Errorf("hidden_size %d not divisible by num_attention_heads %d and no head_dim given", c.HiddenSize, c.NumAttentionHeads)
		}
		hd = c.HiddenSize / c.NumAttentionHeads
	}
	if len(c.LayerConfigs) != 0 && len(c.LayerConfigs) != c.NumHiddenLayers {
		return nil, fmt.Errorf("layer_configs has %d entries, num_hidden_layers is %d", len(c.LayerConfigs), c.NumHiddenLayers)
	}
	window := 0
	if c.SlidingWindow != nil && *c.SlidingWindow > 0 {
		window = *c.SlidingWindow
	}
	d.Layers = make([]Layer, c.NumHiddenLayers)
	for i := range d.Layers {
		p := fmt.Sprintf("model.layers.%d.", i)
		l := &d.Layers[i]
		l.NumHeads, l.NumKVHeads, l.HeadDim = c.NumAttentionHeads, kv, hd
		if len(c.LayerConfigs) > 0 {
			lc := c.LayerConfigs[i]
			l.NumHeads, l.NumKVHeads = lc.NumAttentionHeads, lc.NumKeyValueHeads
		}
		// Families with use_sliding_window (Qwen2) apply the window only
		// from max_window_layers on and only when enabled; the others
		// (Mistral) apply sliding_window to every layer.
		if c.UseSlidingWindow == nil {
			l.SlidingWindow = window
		} else if *c.UseSlidingWindow && i >= c.MaxWindowLayers {
			l.SlidingWindow = window
		}
		l.Attn = Attention{
			Norm: p + "input_layernorm.weight",
			Q:    p + "self_attn.q_proj.weight",
			K:    p + "self_attn.k_proj.weight",
			V:    p + "self_attn.v_proj.weight",
			O:    p + "self_attn.o_proj.weight",
		}
		if f.qkvBias || c.AttentionBias {
			l.Attn.QBias = p + "self_attn.q_proj.bias"
			l.Attn.KBias = p + "self_attn.k_proj.bias"
			l.Attn.VBias = p + "self_attn.v_proj.bias"
		}
		if c.AttentionBias && !f.qkvBias {
			l.Attn.OBias = p + "self_attn.o_proj.bias"
		}
		if f.qkNorm {
			l.Attn.QNorm = p + "self_attn.q_norm.weight"
			l.Attn.KNorm = p + "self_attn.k_norm.weight"
		}
		l.FFNNorm = p + "post_attention_layernorm.weight"
	}
	return d, nil
}

// addDenseMLPs gives every layer of d a dense SwiGLU FFN named
// model.layers.N.mlp.*, sized by layer_configs or intermediate_size.
func addDenseMLPs(d *Description, c *baseConfig) *Description {
	for i := range d.Layers {
		d.Layers[i].MLP = denseMLP(fmt.Sprintf("model.layers.%d.mlp.", i), c.layerFFNSize(i, c.IntermediateSize))
	}
	return d
}

// denseMLP returns the Llama-style SwiGLU tensor names under prefix
// (e.g. "model.layers.3.mlp.").
func denseMLP(prefix string, size int) *MLP {
	return &MLP{Gate: prefix + "gate_proj.weight", Up: prefix + "up_proj.weight", Down: prefix + "down_proj.weight", IntermediateSize: size}
}

// layerFFNSize returns layer i's intermediate size: layer_configs when
// present, else def.
func (c *baseConfig) layerFFNSize(i, def int) int {
	if len(c.LayerConfigs) > 0 && c.LayerConfigs[i].IntermediateSize > 0 {
		return c.LayerConfigs[i].IntermediateSize
	}
	return def
}

// jsonErr rewrites encoding/json's type errors in config.json's terms.
func jsonErr(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		want := te.Type.String()
		switch te.Type.Kind() {
		case reflect.Int, reflect.Int64, reflect.Int32:
			want = "an integer"
		case reflect.Float64, reflect.Float32:
			want = "a number"
		case reflect.Bool:
			want = "true or false"
		case reflect.String:
			want = "a string"
		}
		field := te.Field
		if field == "" {
			field = "(top level)"
		}
		return fmt.Errorf("field %s: got JSON %s, want %s", field, te.Value, want)
	}
	return err
}

// parseIDs accepts null, a number or a list of numbers.
func parseIDs(raw json.RawMessage) ([]int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one int
	if err := json.Unmarshal(raw, &one); err == nil {
		return []int{one}, nil
	}
	var many []int
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fmt.Errorf("want an integer or a list of integers, got %s", raw)
	}
	return many, nil
}
