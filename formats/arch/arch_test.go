package arch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

func TestStories260K(t *testing.T) {
	d, err := Load(shared.Path(t, "stories260K-hf"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Architecture != "LlamaForCausalLM" || d.HiddenSize != 64 || d.VocabSize != 512 || len(d.Layers) != 5 {
		t.Fatalf("got %+v", d)
	}
	l := d.Layers[4]
	if l.NumHeads != 8 || l.NumKVHeads != 4 || l.HeadDim != 8 || l.MLP == nil || l.MLP.IntermediateSize != 172 || l.MoE != nil {
		t.Fatalf("layer 4: %+v", l)
	}
	if l.Attn.Q != "model.layers.4.self_attn.q_proj.weight" || l.MLP.Down != "model.layers.4.mlp.down_proj.weight" || l.Attn.QBias != "" {
		t.Fatalf("names: %+v %+v", l.Attn, l.MLP)
	}
	if !d.TieWordEmbeddings || d.RoPE.Theta != 10000 || d.RMSNormEps != 1e-5 || d.BOSTokenID != 1 || len(d.EOSTokenIDs) != 1 || d.EOSTokenIDs[0] != 2 {
		t.Fatalf("globals: %+v", d)
	}
	// 48 tensors in the file; lm_head is tied so TensorNames lists 47.
	if n := len(d.TensorNames()); n != 47 {
		t.Fatalf("TensorNames: %d names, want 47", n)
	}
}

func TestStories260KMoE(t *testing.T) {
	d, err := Load(shared.Path(t, "stories260K-moe-hf"))
	if err != nil {
		t.Fatal(err)
	}
	m := d.Layers[2].MoE
	if m == nil || m.NumExperts != 4 || m.TopK != 2 || !m.NormTopKProb || m.Router != "model.layers.2.block_sparse_moe.gate.weight" {
		t.Fatalf("moe: %+v", m)
	}
	if e := m.Experts[3]; e.Gate != "model.layers.2.block_sparse_moe.experts.3.w1.weight" || e.Up != "model.layers.2.block_sparse_moe.experts.3.w3.weight" || e.Down != "model.layers.2.block_sparse_moe.experts.3.w2.weight" || e.IntermediateSize != 172 {
		t.Fatalf("expert names: %+v", e)
	}
}

const base = `"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
 "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-6, "max_position_embeddings": 128`

func TestFamilies(t *testing.T) {
	cases := []struct {
		name  string
		json  string
		check func(t *testing.T, d *Description)
	}{
		{"qwen2", `{"architectures":["Qwen2ForCausalLM"],` + base + `, "sliding_window": 64, "use_sliding_window": false, "tie_word_embeddings": true}`,
			func(t *testing.T, d *Description) {
				a := d.Layers[1].Attn
				if a.QBias != "model.layers.1.self_attn.q_proj.bias" || a.VBias == "" || a.OBias != "" || a.QNorm != "" {
					t.Errorf("qwen2 biases: %+v", a)
				}
				if d.Layers[3].SlidingWindow != 0 || d.Layers[0].HeadDim != 8 || !d.TieWordEmbeddings {
					t.Errorf("qwen2: %+v", d.Layers[3])
				}
			}},
		{"qwen3", `{"architectures":["Qwen3ForCausalLM"],` + base + `, "head_dim": 16}`,
			func(t *testing.T, d *Description) {
				a := d.Layers[0].Attn
				if a.QNorm != "model.layers.0.self_attn.q_norm.weight" || a.KNorm != "model.layers.0.self_attn.k_norm.weight" || a.QBias != "" {
					t.Errorf("qwen3 attn: %+v", a)
				}
				if d.Layers[0].HeadDim != 16 || d.Layers[0].QDim() != 64 || d.RoPE.Theta != 10000 {
					t.Errorf("qwen3 head_dim %d qdim %d theta %g", d.Layers[0].HeadDim, d.Layers[0].QDim(), d.RoPE.Theta)
				}
			}},
		{"mistral", `{"architectures":["MistralForCausalLM"],` + base + `, "sliding_window": 16, "rope_theta": 1e6}`,
			func(t *testing.T, d *Description) {
				if d.Layers[0].SlidingWindow != 16 || d.Layers[3].SlidingWindow != 16 || d.RoPE.Theta != 1e6 {
					t.Errorf("mistral window %d theta %g", d.Layers[0].SlidingWindow, d.RoPE.Theta)
				}
			}},
		{"llama3", `{"architectures":["LlamaForCausalLM"],` + base + `, "rope_theta": 500000, "eos_token_id": [7, 9], "bos_token_id": 3,
		  "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}}`,
			func(t *testing.T, d *Description) {
				s := d.RoPE.Scaling
				if s == nil || s.Type != "llama3" || s.Factor != 8 || s.HighFreqFactor != 4 || s.OriginalMaxPositionEmbeddings != 8192 {
					t.Errorf("llama3 scaling: %+v", s)
				}
				if len(d.EOSTokenIDs) != 2 || d.EOSTokenIDs[1] != 9 || d.BOSTokenID != 3 || d.TieWordEmbeddings {
					t.Errorf("llama3 ids: %v %d", d.EOSTokenIDs, d.BOSTokenID)
				}
			}},
		{"llama-linear-bias", `{"architectures":["LlamaForCausalLM"],` + base + `, "attention_bias": true, "rope_scaling": {"type": "linear", "factor": 2}}`,
			func(t *testing.T, d *Description) {
				if d.RoPE.Scaling == nil || d.RoPE.Scaling.Type != "linear" || d.RoPE.Scaling.Factor != 2 {
					t.Errorf("linear scaling: %+v", d.RoPE.Scaling)
				}
				if d.Layers[0].Attn.OBias != "model.layers.0.self_attn.o_proj.bias" || d.Layers[0].Attn.QBias == "" {
					t.Errorf("llama attention_bias: %+v", d.Layers[0].Attn)
				}
			}},
		{"qwen2moe", `{"architectures":["Qwen2MoeForCausalLM"],` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
		  "shared_expert_intermediate_size": 40, "decoder_sparse_step": 2, "mlp_only_layers": [3]}`,
			func(t *testing.T, d *Description) {
				// step 2: layers 1 and 3 sparse, but 3 is mlp-only.
				if d.Layers[0].MoE != nil || d.Layers[1].MoE == nil || d.Layers[2].MoE != nil || d.Layers[3].MoE != nil {
					t.Fatalf("sparse layers wrong")
				}
				m := d.Layers[1].MoE
				if m.Shared == nil || m.Shared.IntermediateSize != 40 || m.SharedGate != "model.layers.1.mlp.shared_expert_gate.weight" ||
					m.Experts[2].Up != "model.layers.1.mlp.experts.2.up_proj.weight" || m.Experts[2].IntermediateSize != 24 || m.NormTopKProb {
					t.Errorf("qwen2moe: %+v", m)
				}
				if d.Layers[0].MLP.IntermediateSize != 48 || d.Layers[1].Attn.KBias == "" {
					t.Errorf("qwen2moe dense/bias")
				}
			}},
		{"qwen3moe", `{"architectures":["Qwen3MoeForCausalLM"],` + base + `, "head_dim": 8, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "norm_topk_prob": true}`,
			func(t *testing.T, d *Description) {
				m := d.Layers[3].MoE
				if m == nil || m.Shared != nil || !m.NormTopKProb || len(m.Experts) != 8 || d.Layers[0].Attn.QNorm == "" {
					t.Errorf("qwen3moe: %+v", m)
				}
			}},
		{"layer_configs", `{"architectures":["LlamaForCausalLM"],` + base + `, "layer_configs": [
		  {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
		  {"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 20},
		  {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48},
		  {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 8}]}`,
			func(t *testing.T, d *Description) {
				if d.Layers[1].NumHeads != 2 || d.Layers[1].NumKVHeads != 1 || d.Layers[1].MLP.IntermediateSize != 20 || d.Layers[3].MLP.IntermediateSize != 8 {
					t.Errorf("layer_configs: %+v", d.Layers[1])
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := Parse([]byte(c.json))
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, d)
		})
	}
}

func TestErrors(t *testing.T) {
	cases := []struct{ json, want string }{
		{`{"architectures":["GPT2LMHeadModel"],` + base + `}`, "GPT2LMHeadModel"},
		{`{"architectures":[]}`, "no \"architectures\""},
		{`{"architectures":["LlamaForCausalLM"],` + base + `, "hidden_act": "gelu"}`, "hidden_act"},
		{`{"architectures":["LlamaForCausalLM"],` + base + `, "num_key_value_heads": 3}`, "not a multiple"},
		{`{"architectures":["LlamaForCausalLM"],` + base + `, "rope_scaling": {"type": "yarn", "factor": 4}}`, "yarn"},
		{`{"architectures":["MixtralForCausalLM"],` + base + `, "num_local_experts": 2, "num_experts_per_tok": 3}`, "num_experts_per_tok"},
		{`{"architectures":["LlamaForCausalLM"],` + base + `, "layer_configs": [{}]}`, "layer_configs"},
		{`{"architectures":["LlamaForCausalLM"], "hidden_size": "x"}`, "hidden_size"},
		{`{not json`, "config.json"},
		{`{"architectures":["LlamaForCausalLM"],` + base + `, "quantization_config": {"quant_method": "gptq", "bits": 4}}`, `quant_method "gptq"`},
		{`{"architectures":["LlamaForCausalLM"],` + base + `, "bos_token_id": 100}`, "bos_token_id 100"},
		{`{"architectures":["LlamaForCausalLM"],` + base + `, "max_position_embeddings": -1}`, "max_position_embeddings -1: want > 0"},
		{`[1, 2]`, "the file holds a JSON array, want a JSON object"},
		{`{"architectures": "LlamaForCausalLM"}`, "field architectures: got JSON string, want a list of strings"},
		{`{"architectures":["LlamaForCausalLM"],` + base + `, "eos_token_id": [2, -5]}`, "eos_token_id -5"},
		{`{"architectures":["MistralForCausalLM"], "hidden_size": 32, "num_hidden_layers": 5.5, "num_attention_heads": 4}`, "field num_hidden_layers: got JSON number 5.5, want an integer"},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%.60s...): err %v, want it to mention %q", c.json, err, c.want)
		}
	}
	// config.json's sliding_window ≤ 0 means none (0); a description
	// (an artifact's manifest) with a negative window is refused.
	d, err := Parse([]byte(`{"architectures":["MistralForCausalLM"],` + base + `, "sliding_window": -1}`))
	if err != nil || d.Layers[0].SlidingWindow != 0 {
		t.Fatalf("sliding_window -1 in config.json: %v, window %d, want 0 (none)", err, d.Layers[0].SlidingWindow)
	}
	d.Layers[1].SlidingWindow = -1
	if err := d.Validate(); err == nil || !strings.Contains(err.Error(), "layer 1: sliding_window -1: want > 0") {
		t.Errorf("Validate with a negative window: %v, want layer 1 and sliding_window named", err)
	}
	_, err = Parse([]byte(`{"architectures":["GPT2LMHeadModel"]}`))
	if !errors.Is(err, ErrUnsupportedArch) {
		t.Fatalf("want ErrUnsupportedArch, got %v", err)
	}
	for _, a := range []string{"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"} {
		if !strings.Contains(err.Error(), a) {
			t.Errorf("unsupported-arch error does not list %s: %v", a, err)
		}
	}
	dir := t.TempDir()
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "config.json")) {
		t.Errorf("Load of empty dir: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"architectures":["Foo"]}`), 0o644)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "config.json")) {
		t.Errorf("Load error should name the file: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"architectures":["LlamaForCausalLM"],` + base + `}`))
	f.Add([]byte(`{"architectures":["Qwen2MoeForCausalLM"],` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24, "decoder_sparse_step": 0}`))
	f.Add([]byte(`{"architectures":["MixtralForCausalLM"],` + base + `, "num_local_experts": 4, "num_experts_per_tok": 2}`))
	f.Add([]byte(`{"architectures":["Qwen3ForCausalLM"], "hidden_size": 1, "num_attention_heads": 1, "num_hidden_layers": 1, "head_dim": -2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Parse(b)
		if err == nil {
			if err := d.Validate(); err != nil {
				t.Fatalf("Parse returned an invalid description: %v", err)
			}
			_ = d.TensorNames()
		}
	})
}
