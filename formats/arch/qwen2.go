package arch

// qwen2 describes Qwen2ForCausalLM: Llama layout with q/k/v biases (always
// present, no o_proj bias) and a sliding window only when
// use_sliding_window, from layer max_window_layers on.
type qwen2 struct{}

var _ Adapter = (*qwen2)(nil)

func init() { Register("Qwen2ForCausalLM", func() Adapter { return &qwen2{} }) }

func (*qwen2) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	d, err := describeBase(raw, &c, familyOpts{qkvBias: true, ropeDefault: 10000, qwenWindow: true})
	if err != nil {
		return nil, err
	}
	return addDenseMLPs(d, &c), nil
}
