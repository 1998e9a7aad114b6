package arch

import (
	"encoding/json"
	"fmt"
)

// mixtral describes MixtralForCausalLM: Mistral attention and a sparse
// FFN in every layer (block_sparse_moe) whose experts are w1 (gate), w3
// (up) and w2 (down). Routing always renormalises the top-k weights.
type mixtral struct{}

var _ Adapter = (*mixtral)(nil)

func init() { Register("MixtralForCausalLM", func() Adapter { return &mixtral{} }) }

type mixtralConfig struct {
	NumLocalExperts  int `json:"num_local_experts"`
	NumExpertsPerTok int `json:"num_experts_per_tok"`
}

func (*mixtral) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	d, err := describeBase(raw, &c, familyOpts{ropeDefault: 1000000})
	if err != nil {
		return nil, err
	}
	var m mixtralConfig
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, jsonErr(err)
	}
	if m.NumLocalExperts <= 0 || m.NumLocalExperts > 4096 || m.NumExpertsPerTok <= 0 || m.NumExpertsPerTok > m.NumLocalExperts {
		return nil, fmt.Errorf("num_local_experts %d, num_experts_per_tok %d: want 0 < per_tok <= experts <= 4096", m.NumLocalExperts, m.NumExpertsPerTok)
	}
	for i := range d.Layers {
		p := fmt.Sprintf("model.layers.%d.block_sparse_moe.", i)
		size := c.layerFFNSize(i, c.IntermediateSize)
		moe := &MoE{Router: p + "gate.weight", NumExperts: m.NumLocalExperts, TopK: m.NumExpertsPerTok, NormTopKProb: true}
		for e := 0; e < m.NumLocalExperts; e++ {
			q := fmt.Sprintf("%sexperts.%d.", p, e)
			moe.Experts = append(moe.Experts, MLP{Gate: q + "w1.weight", Up: q + "w3.weight", Down: q + "w2.weight", IntermediateSize: size})
		}
		d.Layers[i].MoE = moe
	}
	return d, nil
}
