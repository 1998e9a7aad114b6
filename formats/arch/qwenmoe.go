package arch

import (
	"encoding/json"
	"fmt"
)

// qwenMoEConfig holds the MoE fields of Qwen2-MoE and Qwen3-MoE configs.
type qwenMoEConfig struct {
	NumExperts                   int   `json:"num_experts"`
	NumExpertsPerTok             int   `json:"num_experts_per_tok"`
	MoEIntermediateSize          int   `json:"moe_intermediate_size"`
	SharedExpertIntermediateSize int   `json:"shared_expert_intermediate_size"`
	NormTopKProb                 bool  `json:"norm_topk_prob"`
	DecoderSparseStep            *int  `json:"decoder_sparse_step"`
	MLPOnlyLayers                []int `json:"mlp_only_layers"`
}

// describeQwenMoE fills each layer's FFN: layer i is sparse when it is not
// in mlp_only_layers and (i+1) % decoder_sparse_step == 0; otherwise it is
// a dense MLP of intermediate_size. shared adds Qwen2-MoE's shared expert
// with its sigmoid gate.
func describeQwenMoE(raw []byte, c *baseConfig, d *Description, shared bool) error {
	var m qwenMoEConfig
	if err := json.Unmarshal(raw, &m); err != nil {
		return jsonErr(err)
	}
	if m.NumExperts <= 0 || m.NumExperts > 4096 || m.NumExpertsPerTok <= 0 || m.NumExpertsPerTok > m.NumExperts {
		return fmt.Errorf("num_experts %d, num_experts_per_tok %d: want 0 < per_tok <= experts <= 4096", m.NumExperts, m.NumExpertsPerTok)
	}
	if m.MoEIntermediateSize <= 0 {
		return fmt.Errorf("moe_intermediate_size %d: want > 0", m.MoEIntermediateSize)
	}
	step := 1
	if m.DecoderSparseStep != nil {
		step = *m.DecoderSparseStep
	}
	if step <= 0 {
		return fmt.Errorf("decoder_sparse_step %d: want > 0", step)
	}
	dense := map[int]bool{}
	for _, i := range m.MLPOnlyLayers {
		dense[i] = true
	}
	for i := range d.Layers {
		p := fmt.Sprintf("model.layers.%d.mlp.", i)
		if dense[i] || (i+1)%step != 0 {
			d.Layers[i].MLP = denseMLP(p, c.layerFFNSize(i, c.IntermediateSize))
			continue
		}
		moe := &MoE{Router: p + "gate.weight", NumExperts: m.NumExperts, TopK: m.NumExpertsPerTok, NormTopKProb: m.NormTopKProb}
		for e := 0; e < m.NumExperts; e++ {
			moe.Experts = append(moe.Experts, *denseMLP(fmt.Sprintf("%sexperts.%d.", p, e), m.MoEIntermediateSize))
		}
		if shared && m.SharedExpertIntermediateSize > 0 {
			moe.Shared = denseMLP(p+"shared_expert.", m.SharedExpertIntermediateSize)
			moe.SharedGate = p + "shared_expert_gate.weight"
		}
		d.Layers[i].MoE = moe
	}
	return nil
}

// qwen2MoE describes Qwen2MoeForCausalLM: Qwen2 attention (q/k/v biases),
// sparse layers with a shared expert scaled by sigmoid(shared_expert_gate·x).
type qwen2MoE struct{}

var _ Adapter = (*qwen2MoE)(nil)

func init() { Register("Qwen2MoeForCausalLM", func() Adapter { return &qwen2MoE{} }) }

func (*qwen2MoE) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	d, err := describeBase(raw, &c, familyOpts{qkvBias: true, ropeDefault: 10000, qwenWindow: true})
	if err != nil {
		return nil, err
	}
	if err := describeQwenMoE(raw, &c, d, true); err != nil {
		return nil, err
	}
	return d, nil
}

// qwen3MoE describes Qwen3MoeForCausalLM: Qwen3 attention (q/k norm,
// explicit head_dim) and sparse layers without a shared expert.
type qwen3MoE struct{}

var _ Adapter = (*qwen3MoE)(nil)

func init() { Register("Qwen3MoeForCausalLM", func() Adapter { return &qwen3MoE{} }) }

func (*qwen3MoE) Describe(raw []byte) (*Description, error) {
	var c baseConfig
	d, err := describeBase(raw, &c, familyOpts{qkNorm: true, ropeDefault: 1000000, qwenWindow: true})
	if err != nil {
		return nil, err
	}
	if err := describeQwenMoE(raw, &c, d, false); err != nil {
		return nil, err
	}
	return d, nil
}
