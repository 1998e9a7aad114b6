package arch

// qwen3 describes Qwen3ForCausalLM: head_dim 128 unless given, RMSNorm
// over head_dim on q and k (q_norm, k_norm) before RoPE, biases on q, k,
// v and o only when attention_bias, and Qwen2's sliding-window rule.
type qwen3 struct{}

var _ Adapter = (*qwen3)(nil)

func init() { Register("Qwen3ForCausalLM", func() Adapter { return &qwen3{} }) }

// qwen3Config is Qwen3ForCausalLM's config.json. Defaults are
// transformers' Qwen3Config: num_key_value_heads 32 (null:
// num_attention_heads), head_dim 128, rms_norm_eps 1e-6,
// max_position_embeddings 32768, rope_theta 10000, use_sliding_window
// false, sliding_window 4096, max_window_layers 28.
type qwen3Config struct {
	decoderConfig
	qwenWindowConfig
	AttentionBias bool `json:"attention_bias"`
}

func (*qwen3) Describe(raw []byte) (*Description, error) {
	c := qwen3Config{
		decoderConfig:    decoderConfig{NumKeyValueHeads: ptr(32), HeadDim: ptr(128), RMSNormEps: 1e-6, MaxPositionEmbeddings: 32768},
		qwenWindowConfig: qwenWindowDefaults(),
	}
	if err := decode(raw, &c); err != nil {
		return nil, err
	}
	d, err := c.newDescription(10000)
	if err != nil {
		return nil, err
	}
	if c.AttentionBias {
		addQKVBias(d)
		addOBias(d)
	}
	addQKNorm(d)
	if err := thresholdWindows(d, &c.decoderConfig, &c.qwenWindowConfig); err != nil {
		return nil, err
	}
	addDenseMLPs(d, &c.decoderConfig)
	return d, nil
}
