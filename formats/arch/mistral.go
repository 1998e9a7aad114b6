package arch

// mistral describes MistralForCausalLM: Llama layout with an optional
// sliding_window applied to every layer.
type mistral struct{}

var _ Adapter = (*mistral)(nil)

func init() { Register("MistralForCausalLM", func() Adapter { return &mistral{} }) }

func (*mistral) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	d, err := describeBase(raw, &c, familyOpts{ropeDefault: 10000})
	if err != nil {
		return nil, err
	}
	return addDenseMLPs(d, &c), nil
}
