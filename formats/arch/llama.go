package arch

import "fmt"

// llama describes LlamaForCausalLM (Llama 2/3/3.1: GQA, optional
// attention_bias on q, k, v and o, rope_scaling linear or llama3, no
// sliding window).
type llama struct{}

var _ Adapter = (*llama)(nil)

func init() { Register("LlamaForCausalLM", func() Adapter { return &llama{} }) }

// llamaConfig is LlamaForCausalLM's config.json. Defaults are transformers'
// LlamaConfig: num_key_value_heads = num_attention_heads, head_dim =
// hidden_size / num_attention_heads, rms_norm_eps 1e-6,
// max_position_embeddings 2048, rope_theta 10000.
type llamaConfig struct {
	decoderConfig
	AttentionBias bool `json:"attention_bias"`
	MLPBias       bool `json:"mlp_bias"`
}

func (*llama) Describe(raw []byte) (*Description, error) {
	c := llamaConfig{decoderConfig: decoderConfig{RMSNormEps: 1e-6, MaxPositionEmbeddings: 2048}}
	if err := decode(raw, &c); err != nil {
		return nil, err
	}
	if c.MLPBias {
		return nil, fmt.Errorf("mlp_bias true unsupported")
	}
	d, err := c.newDescription(10000)
	if err != nil {
		return nil, err
	}
	if c.AttentionBias {
		addQKVBias(d)
		addOBias(d)
	}
	if err := uniformWindows(d, &c.decoderConfig, 0, "LlamaForCausalLM"); err != nil {
		return nil, err
	}
	addDenseMLPs(d, &c.decoderConfig)
	return d, nil
}
