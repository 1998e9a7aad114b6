package arch

// mistral describes MistralForCausalLM: Llama layout without biases and
// a sliding_window applied to every layer.
type mistral struct{}

var _ Adapter = (*mistral)(nil)

func init() { Register("MistralForCausalLM", func() Adapter { return &mistral{} }) }

// mistralConfig is MistralForCausalLM's config.json. Defaults are
// transformers' MistralConfig: num_key_value_heads 8, head_dim =
// hidden_size / num_attention_heads, rms_norm_eps 1e-6,
// max_position_embeddings 4096·32, rope_theta 10000, sliding_window 4096
// (null: full attention).
type mistralConfig struct {
	decoderConfig
	SlidingWindow *int `json:"sliding_window"`
}

func (*mistral) Describe(raw []byte) (*Description, error) {
	c := mistralConfig{
		decoderConfig: decoderConfig{NumKeyValueHeads: ptr(8), RMSNormEps: 1e-6, MaxPositionEmbeddings: 4096 * 32},
		SlidingWindow: ptr(4096),
	}
	if err := decode(raw, &c); err != nil {
		return nil, err
	}
	d, err := c.newDescription(10000)
	if err != nil {
		return nil, err
	}
	if err := uniformWindows(d, &c.decoderConfig, slidingWindowValue(c.SlidingWindow), "MistralForCausalLM"); err != nil {
		return nil, err
	}
	addDenseMLPs(d, &c.decoderConfig)
	return d, nil
}
