package arch

// llama describes LlamaForCausalLM (Llama 2/3/3.1: GQA, optional
// attention_bias, rope_scaling linear or llama3).
type llama struct{}

var _ Adapter = (*llama)(nil)

func init() { Register("LlamaForCausalLM", func() Adapter { return &llama{} }) }

func (*llama) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	d, err := describeBase(raw, &c, familyOpts{ropeDefault: 10000})
	if err != nil {
		return nil, err
	}
	return addDenseMLPs(d, &c), nil
}
