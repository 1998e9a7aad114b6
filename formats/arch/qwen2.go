package arch

import "fmt"

// qwen2 describes Qwen2ForCausalLM: Llama layout with q/k/v biases (always
// present, no o_proj bias) and a sliding window only when
// use_sliding_window, from layer max_window_layers on.
type qwen2 struct{}

var _ Adapter = (*qwen2)(nil)

func init() { Register("Qwen2ForCausalLM", func() Adapter { return &qwen2{} }) }

func (*qwen2) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	f := false
	c.UseSlidingWindow = &f
	d, err := describeBase(raw, &c, familyOpts{qkvBias: true, ropeDefault: 10000})
	if err != nil {
		return nil, err
	}
	for i := range d.Layers {
		d.Layers[i].MLP = denseMLP(fmt.Sprintf("model.layers.%d.mlp.", i), c.layerFFNSize(i, c.IntermediateSize))
	}
	return d, nil
}
