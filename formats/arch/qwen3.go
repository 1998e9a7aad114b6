package arch

import "fmt"

// qwen3 describes Qwen3ForCausalLM: explicit head_dim, RMSNorm over
// head_dim on q and k (q_norm, k_norm) before RoPE, no biases unless
// attention_bias.
type qwen3 struct{}

var _ Adapter = (*qwen3)(nil)

func init() { Register("Qwen3ForCausalLM", func() Adapter { return &qwen3{} }) }

func (*qwen3) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	f := false
	c.UseSlidingWindow = &f
	d, err := describeBase(raw, &c, familyOpts{qkNorm: true, ropeDefault: 1000000})
	if err != nil {
		return nil, err
	}
	for i := range d.Layers {
		d.Layers[i].MLP = denseMLP(fmt.Sprintf("model.layers.%d.mlp.", i), c.layerFFNSize(i, c.IntermediateSize))
	}
	return d, nil
}
