package arch

import "fmt"

// mixtral describes MixtralForCausalLM: Mistral attention and a sparse
// FFN in every layer (block_sparse_moe) whose experts are w1 (gate), w3
// (up) and w2 (down). Routing always renormalises the top-k weights.
type mixtral struct{}

var _ Adapter = (*mixtral)(nil)

func init() { Register("MixtralForCausalLM", func() Adapter { return &mixtral{} }) }

// mixtralConfig is MixtralForCausalLM's config.json. Defaults are
// transformers' MixtralConfig: num_key_value_heads 8, rms_norm_eps 1e-5,
// max_position_embeddings 4096·32, rope_theta 1e6, sliding_window null
// (full attention; a window applies to every layer), num_local_experts 8,
// num_experts_per_tok 2.
type mixtralConfig struct {
	decoderConfig
	SlidingWindow    *int `json:"sliding_window"`
	NumLocalExperts  int  `json:"num_local_experts"`
	NumExpertsPerTok int  `json:"num_experts_per_tok"`
}

func (*mixtral) Describe(raw []byte) (*Description, error) {
	c := mixtralConfig{decoderConfig: decoderConfig{NumKeyValueHeads: ptr(8), RMSNormEps: 1e-5, MaxPositionEmbeddings: 4096 * 32},
		NumLocalExperts: 8, NumExpertsPerTok: 2}
	if err := decode(raw, &c); err != nil {
		return nil, err
	}
	d, err := c.newDescription(1000000)
	if err != nil {
		return nil, err
	}
	if err := uniformWindows(d, &c.decoderConfig, slidingWindowValue(c.SlidingWindow), "MixtralForCausalLM"); err != nil {
		return nil, err
	}
	if c.NumLocalExperts <= 0 || c.NumLocalExperts > 4096 || c.NumExpertsPerTok <= 0 || c.NumExpertsPerTok > c.NumLocalExperts {
		return nil, fmt.Errorf("num_local_experts %d, num_experts_per_tok %d: want 0 < per_tok <= experts <= 4096", c.NumLocalExperts, c.NumExpertsPerTok)
	}
	for i := range d.Layers {
		p := layerPrefix(i) + "block_sparse_moe."
		size := c.layerFFNSize(i, c.IntermediateSize)
		moe := &MoE{Router: p + "gate.weight", NumExperts: c.NumLocalExperts, TopK: c.NumExpertsPerTok, NormTopKProb: true}
		for e := 0; e < c.NumLocalExperts; e++ {
			q := fmt.Sprintf("%sexperts.%d.", p, e)
			moe.Experts = append(moe.Experts, MLP{Gate: q + "w1.weight", Up: q + "w3.weight", Down: q + "w2.weight", IntermediateSize: size})
		}
		d.Layers[i].MoE = moe
	}
	return d, nil
}
