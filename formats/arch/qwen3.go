package arch

// qwen3 describes Qwen3ForCausalLM: explicit head_dim, RMSNorm over
// head_dim on q and k (q_norm, k_norm) before RoPE, no biases unless
// attention_bias.
type qwen3 struct{}

var _ Adapter = (*qwen3)(nil)

func init() { Register("Qwen3ForCausalLM", func() Adapter { return &qwen3{} }) }

func (*qwen3) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	d, err := describeBase(raw, &c, familyOpts{qkNorm: true, ropeDefault: 1000000, qwenWindow: true})
	if err != nil {
		return nil, err
	}
	return addDenseMLPs(d, &c), nil
}
