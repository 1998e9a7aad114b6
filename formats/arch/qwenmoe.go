package arch

import "fmt"

// qwenMoEConfig holds the MoE keys of Qwen2-MoE and Qwen3-MoE configs.
type qwenMoEConfig struct {
	NumExperts                   int   `json:"num_experts"`
	NumExpertsPerTok             int   `json:"num_experts_per_tok"`
	MoEIntermediateSize          int   `json:"moe_intermediate_size"`
	SharedExpertIntermediateSize int   `json:"shared_expert_intermediate_size"`
	NormTopKProb                 bool  `json:"norm_topk_prob"`
	DecoderSparseStep            int   `json:"decoder_sparse_step"`
	MLPOnlyLayers                []int `json:"mlp_only_layers"`
}

// addQwenMoEFFNs fills each layer's FFN: layer i is sparse when it is not
// in mlp_only_layers and (i+1) % decoder_sparse_step == 0 (transformers'
// Qwen2MoeDecoderLayer, Qwen3MoeDecoderLayer); otherwise it is a dense MLP
// of intermediate_size. A sparse layer gets a shared expert (Qwen2-MoE's,
// scaled by sigmoid(shared_expert_gate·x)) when shared and
// shared_expert_intermediate_size > 0.
func addQwenMoEFFNs(d *Description, c *decoderConfig, m *qwenMoEConfig, shared bool) error {
	if m.NumExperts <= 0 || m.NumExperts > 4096 || m.NumExpertsPerTok <= 0 || m.NumExpertsPerTok > m.NumExperts {
		return fmt.Errorf("num_experts %d, num_experts_per_tok %d: want 0 < per_tok <= experts <= 4096", m.NumExperts, m.NumExpertsPerTok)
	}
	if m.MoEIntermediateSize <= 0 {
		return fmt.Errorf("moe_intermediate_size %d: want > 0", m.MoEIntermediateSize)
	}
	if m.DecoderSparseStep <= 0 {
		return fmt.Errorf("decoder_sparse_step %d: want > 0", m.DecoderSparseStep)
	}
	dense := map[int]bool{}
	for _, i := range m.MLPOnlyLayers {
		dense[i] = true
	}
	for i := range d.Layers {
		p := layerPrefix(i) + "mlp."
		if dense[i] || (i+1)%m.DecoderSparseStep != 0 {
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

// qwen2MoE describes Qwen2MoeForCausalLM: Qwen2 attention (q/k/v biases
// unless qkv_bias is false, no o bias), sparse layers with a shared expert
// scaled by sigmoid(shared_expert_gate·x).
type qwen2MoE struct{}

var _ Adapter = (*qwen2MoE)(nil)

func init() { Register("Qwen2MoeForCausalLM", func() Adapter { return &qwen2MoE{} }) }

// qwen2MoEConfig is Qwen2MoeForCausalLM's config.json. Defaults are
// transformers' Qwen2MoeConfig: num_key_value_heads 16 (null:
// num_attention_heads), rms_norm_eps 1e-6, max_position_embeddings 32768,
// rope_theta 10000, use_sliding_window false, sliding_window 4096,
// max_window_layers 28, qkv_bias true, num_experts 60,
// num_experts_per_tok 4, moe_intermediate_size 1408,
// shared_expert_intermediate_size 5632, norm_topk_prob false,
// decoder_sparse_step 1.
type qwen2MoEConfig struct {
	decoderConfig
	qwenWindowConfig
	qwenMoEConfig
	QKVBias bool `json:"qkv_bias"`
}

// qwen2MoEWindows sets Qwen2-MoE's windows: layer_types when given; else,
// when use_sliding_window, transformers' Qwen2MoeConfig makes layer i
// sliding when i is even and i < max_window_layers.
func qwen2MoEWindows(d *Description, c *decoderConfig, w *qwenWindowConfig) error {
	sliding, err := c.layerTypes()
	if err != nil {
		return err
	}
	if sliding == nil {
		sliding = make([]bool, len(d.Layers))
		for i := range sliding {
			sliding[i] = w.UseSlidingWindow && (i+1)%2 == 1 && i < w.MaxWindowLayers
		}
	}
	return setWindows(d, sliding, w.window(), w.why())
}

func (*qwen2MoE) Describe(raw []byte) (*Description, error) {
	c := qwen2MoEConfig{
		decoderConfig:    decoderConfig{NumKeyValueHeads: ptr(16), RMSNormEps: 1e-6, MaxPositionEmbeddings: 32768},
		qwenWindowConfig: qwenWindowDefaults(),
		qwenMoEConfig: qwenMoEConfig{NumExperts: 60, NumExpertsPerTok: 4, MoEIntermediateSize: 1408,
			SharedExpertIntermediateSize: 5632, DecoderSparseStep: 1},
		QKVBias: true,
	}
	if err := decode(raw, &c); err != nil {
		return nil, err
	}
	d, err := c.newDescription(10000)
	if err != nil {
		return nil, err
	}
	if c.QKVBias {
		addQKVBias(d)
	}
	if err := qwen2MoEWindows(d, &c.decoderConfig, &c.qwenWindowConfig); err != nil {
		return nil, err
	}
	if err := addQwenMoEFFNs(d, &c.decoderConfig, &c.qwenMoEConfig, true); err != nil {
		return nil, err
	}
	return d, nil
}

// qwen3MoE describes Qwen3MoeForCausalLM: Qwen3 attention (q/k norm,
// biases only when attention_bias) and sparse layers without a shared
// expert. Unlike Qwen3, its window (use_sliding_window) applies to every
// layer: transformers' Qwen3MoeAttention takes config.sliding_window for
// each layer and Qwen3MoeModel builds one sliding mask.
type qwen3MoE struct{}

var _ Adapter = (*qwen3MoE)(nil)

func init() { Register("Qwen3MoeForCausalLM", func() Adapter { return &qwen3MoE{} }) }

// qwen3MoEConfig is Qwen3MoeForCausalLM's config.json. Defaults are
// transformers' Qwen3MoeConfig: num_key_value_heads 4, head_dim =
// hidden_size / num_attention_heads, rms_norm_eps 1e-6,
// max_position_embeddings 32768, rope_theta 10000, use_sliding_window
// false, sliding_window 4096, num_experts 128, num_experts_per_tok 8,
// moe_intermediate_size 768, norm_topk_prob false, decoder_sparse_step 1.
// max_window_layers is not read.
type qwen3MoEConfig struct {
	decoderConfig
	qwenWindowConfig
	qwenMoEConfig
	AttentionBias bool `json:"attention_bias"`
}

func (*qwen3MoE) Describe(raw []byte) (*Description, error) {
	c := qwen3MoEConfig{
		decoderConfig:    decoderConfig{NumKeyValueHeads: ptr(4), RMSNormEps: 1e-6, MaxPositionEmbeddings: 32768},
		qwenWindowConfig: qwenWindowDefaults(),
		qwenMoEConfig:    qwenMoEConfig{NumExperts: 128, NumExpertsPerTok: 8, MoEIntermediateSize: 768, DecoderSparseStep: 1},
	}
	if err := decode(raw, &c); err != nil {
		return nil, err
	}
	d, err := c.newDescription(10000)
	if err != nil {
		return nil, err
	}
	if c.AttentionBias {
		addQKVBias(d)
		addOBias(d)
	}
	addQKNorm(d)
	if err := uniformWindows(d, &c.decoderConfig, c.window(), "Qwen3MoeForCausalLM"); err != nil {
		return nil, err
	}
	if err := addQwenMoEFFNs(d, &c.decoderConfig, &c.qwenMoEConfig, false); err != nil {
		return nil, err
	}
	return d, nil
}
