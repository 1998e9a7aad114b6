package arch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// This file holds the helpers the family adapters share. What differs
// between families (defaults, biases, q/k norms, which layers slide, the
// FFN) lives in the family's own file: llama.go, mistral.go, mixtral.go,
// qwen2.go, qwen3.go, qwenmoe.go.

// decoderConfig holds the config.json fields that every supported family
// reads the same way. Each family's config struct embeds it and fills in
// transformers' defaults (configuration_<family>.py) before decoding, so a
// key absent from config.json keeps the family's default.
type decoderConfig struct {
	ModelType         string `json:"model_type"`
	HiddenSize        int    `json:"hidden_size"`
	IntermediateSize  int    `json:"intermediate_size"`
	NumHiddenLayers   int    `json:"num_hidden_layers"`
	NumAttentionHeads int    `json:"num_attention_heads"`
	// NumKeyValueHeads: nil (absent without a family default, or null)
	// means num_attention_heads.
	NumKeyValueHeads *int `json:"num_key_value_heads"`
	// HeadDim: nil or <= 0 means hidden_size / num_attention_heads.
	HeadDim               *int            `json:"head_dim"`
	VocabSize             int             `json:"vocab_size"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	RMSNormEps            float64         `json:"rms_norm_eps"`
	TieWordEmbeddings     bool            `json:"tie_word_embeddings"`
	BOSTokenID            *int            `json:"bos_token_id"`
	EOSTokenID            json.RawMessage `json:"eos_token_id"`
	HiddenAct             string          `json:"hidden_act"`
	// LayerTypes is transformers' per-layer attention type
	// ("full_attention" or "sliding_attention"); see layerTypes.
	LayerTypes []string `json:"layer_types"`
	// LayerConfigs is lmpack's extension for pruned checkpoints whose layers
	// differ in head counts and FFN sizes (stock loaders cannot read these).
	LayerConfigs []LayerConfig `json:"layer_configs"`
	// QuantizationConfig marks a pre-quantized checkpoint (GPTQ, AWQ,
	// FP8, bitsandbytes), which lmpack does not read.
	QuantizationConfig json.RawMessage `json:"quantization_config"`
	ropeConfig
}

// LayerConfig is one entry of lmpack's layer_configs list in config.json:
// the head counts and FFN size of one decoder block of a width-pruned
// checkpoint. A zero IntermediateSize means the config's intermediate_size.
type LayerConfig struct {
	NumAttentionHeads int `json:"num_attention_heads"`
	NumKeyValueHeads  int `json:"num_key_value_heads"`
	IntermediateSize  int `json:"intermediate_size"`
}

func ptr[T any](v T) *T { return &v }

// decode unmarshals config.json into a family's config struct c (a
// pointer whose fields already hold the family's defaults). Errors name
// the field.
func decode(raw []byte, c any) error {
	if err := json.Unmarshal(raw, c); err != nil {
		return jsonErr(err)
	}
	return nil
}

// newDescription checks the fields every family shares and returns the
// description's globals (sizes, norms, RoPE with defaultTheta when no
// rope_theta is given, token ids, tied embeddings) and per-layer attention
// (head counts, head_dim, q/k/v/o and norm tensor names). Biases, q/k
// norms, sliding windows and FFNs are the family's to add. Errors name the
// field.
func (c *decoderConfig) newDescription(defaultTheta float64) (*Description, error) {
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
	if c.NumHiddenLayers <= 0 || c.NumHiddenLayers > 1<<12 {
		return nil, fmt.Errorf("num_hidden_layers %d: want 1..4096", c.NumHiddenLayers)
	}
	if c.NumAttentionHeads <= 0 {
		return nil, fmt.Errorf("num_attention_heads %d: want > 0", c.NumAttentionHeads)
	}
	if c.HiddenSize <= 0 {
		return nil, fmt.Errorf("hidden_size %d: want > 0", c.HiddenSize)
	}
	rope, err := c.rope(defaultTheta, c.MaxPositionEmbeddings)
	if err != nil {
		return nil, err
	}
	d := &Description{
		ModelType:             c.ModelType,
		HiddenSize:            c.HiddenSize,
		VocabSize:             c.VocabSize,
		MaxPositionEmbeddings: c.MaxPositionEmbeddings,
		RMSNormEps:            c.RMSNormEps,
		RoPE:                  rope,
		TieWordEmbeddings:     c.TieWordEmbeddings,
		BOSTokenID:            -1,
		Embedding:             "model.embed_tokens.weight",
		FinalNorm:             "model.norm.weight",
		LMHead:                "lm_head.weight",
	}
	if c.BOSTokenID != nil {
		d.BOSTokenID = *c.BOSTokenID
	}
	if d.EOSTokenIDs, err = parseIDs(c.EOSTokenID); err != nil {
		return nil, fmt.Errorf("eos_token_id: %w", err)
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
	d.Layers = make([]Layer, c.NumHiddenLayers)
	for i := range d.Layers {
		p := layerPrefix(i)
		l := &d.Layers[i]
		l.NumHeads, l.NumKVHeads, l.HeadDim = c.NumAttentionHeads, kv, hd
		if len(c.LayerConfigs) > 0 {
			lc := c.LayerConfigs[i]
			l.NumHeads, l.NumKVHeads = lc.NumAttentionHeads, lc.NumKeyValueHeads
		}
		l.Attn = Attention{
			Norm: p + "input_layernorm.weight",
			Q:    p + "self_attn.q_proj.weight",
			K:    p + "self_attn.k_proj.weight",
			V:    p + "self_attn.v_proj.weight",
			O:    p + "self_attn.o_proj.weight",
		}
		l.FFNNorm = p + "post_attention_layernorm.weight"
	}
	return d, nil
}

// layerPrefix is the tensor-name prefix of decoder block i.
func layerPrefix(i int) string { return fmt.Sprintf("model.layers.%d.", i) }

// addQKVBias gives every layer q, k and v projection biases.
func addQKVBias(d *Description) {
	for i := range d.Layers {
		p, a := layerPrefix(i), &d.Layers[i].Attn
		a.QBias, a.KBias, a.VBias = p+"self_attn.q_proj.bias", p+"self_attn.k_proj.bias", p+"self_attn.v_proj.bias"
	}
}

// addOBias gives every layer an o projection bias.
func addOBias(d *Description) {
	for i := range d.Layers {
		d.Layers[i].Attn.OBias = layerPrefix(i) + "self_attn.o_proj.bias"
	}
}

// addQKNorm gives every layer Qwen3's RMSNorm over head_dim on q and k
// (q_norm, k_norm), applied before RoPE.
func addQKNorm(d *Description) {
	for i := range d.Layers {
		p, a := layerPrefix(i), &d.Layers[i].Attn
		a.QNorm, a.KNorm = p+"self_attn.q_norm.weight", p+"self_attn.k_norm.weight"
	}
}

// addDenseMLPs gives every layer of d a dense SwiGLU FFN named
// model.layers.N.mlp.*, sized by layer_configs or intermediate_size.
func addDenseMLPs(d *Description, c *decoderConfig) {
	for i := range d.Layers {
		d.Layers[i].MLP = denseMLP(layerPrefix(i)+"mlp.", c.layerFFNSize(i, c.IntermediateSize))
	}
}

// denseMLP returns the Llama-style SwiGLU tensor names under prefix
// (e.g. "model.layers.3.mlp.").
func denseMLP(prefix string, size int) *MLP {
	return &MLP{Gate: prefix + "gate_proj.weight", Up: prefix + "up_proj.weight", Down: prefix + "down_proj.weight", IntermediateSize: size}
}

// layerFFNSize returns layer i's intermediate size: layer_configs when
// present, else def.
func (c *decoderConfig) layerFFNSize(i, def int) int {
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
		// Embedded config structs appear in the path under their Go names.
		for _, e := range []string{"decoderConfig.", "ropeConfig.", "qwenWindowConfig.", "qwenMoEConfig."} {
			field = strings.ReplaceAll(field, e, "")
		}
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

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	return len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null"
}
