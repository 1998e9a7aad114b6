package arch

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestTransformersDefaults: keys absent from config.json take
// transformers' configuration_<family>.py defaults.
func TestTransformersDefaults(t *testing.T) {
	const sizes = `"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100`
	cases := []struct {
		arch, extra string
		theta, eps  float64
		kv, hd      int
		maxPos      int
		window      int
	}{
		{"LlamaForCausalLM", "", 10000, 1e-6, 4, 8, 2048, 0},
		{"MistralForCausalLM", `, "num_attention_heads": 16`, 10000, 1e-6, 8, 2, 4096 * 32, 4096},
		{"MixtralForCausalLM", `, "num_attention_heads": 8`, 1e6, 1e-5, 8, 4, 4096 * 32, 0},
		{"Qwen2ForCausalLM", `, "hidden_size": 64, "num_attention_heads": 32`, 10000, 1e-6, 32, 2, 32768, 0},
		{"Qwen3ForCausalLM", `, "num_attention_heads": 32`, 10000, 1e-6, 32, 128, 32768, 0},
		{"Qwen2MoeForCausalLM", `, "num_attention_heads": 16, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8`, 10000, 1e-6, 16, 2, 32768, 0},
		{"Qwen3MoeForCausalLM", `, "moe_intermediate_size": 8`, 10000, 1e-6, 4, 8, 32768, 0},
	}
	for _, c := range cases {
		d, err := Parse([]byte(`{"architectures": ["` + c.arch + `"], ` + sizes + c.extra + `}`))
		if err != nil {
			t.Errorf("%s: %v", c.arch, err)
			continue
		}
		l := d.Layers[1]
		if d.RoPE.Theta != c.theta || d.RMSNormEps != c.eps || l.NumKVHeads != c.kv || l.HeadDim != c.hd || d.MaxPositionEmbeddings != c.maxPos || l.SlidingWindow != c.window {
			t.Errorf("%s: rope_theta %g rms_norm_eps %g kv %d head_dim %d max_pos %d window %d; want %g %g %d %d %d %d", c.arch,
				d.RoPE.Theta, d.RMSNormEps, l.NumKVHeads, l.HeadDim, d.MaxPositionEmbeddings, l.SlidingWindow, c.theta, c.eps, c.kv, c.hd, c.maxPos, c.window)
		}
	}
	// Explicit nulls: num_key_value_heads null is num_attention_heads,
	// Mistral's sliding_window null is full attention.
	d, err := Parse([]byte(`{"architectures": ["MistralForCausalLM"], ` + sizes + `, "num_key_value_heads": null, "sliding_window": null}`))
	if err != nil || d.Layers[0].NumKVHeads != 4 || d.Layers[0].SlidingWindow != 0 {
		t.Errorf("nulls: %v %+v", err, d)
	}
	// Qwen2-MoE's qkv_bias false drops the q/k/v biases.
	d, err = Parse([]byte(`{"architectures": ["Qwen2MoeForCausalLM"], ` + sizes + `, "num_key_value_heads": 2, "moe_intermediate_size": 8, "qkv_bias": false}`))
	if err != nil || d.Layers[0].Attn.QBias != "" || d.Layers[0].MoE == nil || d.Layers[0].MoE.NumExperts != 60 || d.Layers[0].MoE.Shared.IntermediateSize != 5632 {
		t.Errorf("qwen2moe qkv_bias false: %v %+v", err, d)
	}
}

// TestRopeSpellings: rope_parameters (v5) and rope_theta/rope_scaling (v4)
// give the same RoPE; what lmpack does not run is refused under either.
func TestRopeSpellings(t *testing.T) {
	const llama = `{"architectures":["LlamaForCausalLM"],` + base
	same := [][2]string{
		{`, "rope_theta": 500000}`, `, "rope_parameters": {"rope_type": "default", "rope_theta": 500000}}`},
		{`, "rope_scaling": {"type": "linear", "factor": 2}}`, `, "rope_parameters": {"type": "linear", "factor": 2}}`},
		{`, "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 64}}`,
			`, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000, "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 64}}`},
		// v5 fills llama3's original_max_position_embeddings from max_position_embeddings (128).
		{`, "rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 128}}`,
			`, "rope_parameters": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}}`},
		// Both spellings, agreeing.
		{`, "rope_theta": 1e6}`, `, "rope_theta": 1e6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_scaling": null, "partial_rotary_factor": 1.0}`},
	}
	for _, c := range same {
		a, err := Parse([]byte(llama + c[0]))
		if err != nil {
			t.Fatalf("%s: %v", c[0], err)
		}
		b, err := Parse([]byte(llama + c[1]))
		if err != nil {
			t.Fatalf("%s: %v", c[1], err)
		}
		ja, _ := json.Marshal(a.RoPE)
		jb, _ := json.Marshal(b.RoPE)
		if string(ja) != string(jb) {
			t.Errorf("v4 %s gives %s, v5 %s gives %s", c[0], ja, c[1], jb)
		}
	}
	bad := []struct{ json, want string }{
		{`, "rope_parameters": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 32}}`, `rope_parameters.rope_type "yarn" unsupported`},
		{`, "rope_scaling": {"type": "longrope", "factor": 4}}`, `rope_scaling.type "longrope" unsupported`},
		{`, "rope_parameters": {"rope_type": "default", "attention_factor": 2}}`, `rope_parameters.attention_factor (value 2) unsupported`},
		{`, "rope_parameters": {"full_attention": {"rope_type": "default"}, "sliding_attention": {"rope_type": "default"}}}`, `per layer type ("full_attention")`},
		{`, "partial_rotary_factor": 0.5}`, "partial_rotary_factor 0.5 unsupported"},
		{`, "rope_parameters": {"rope_type": "linear", "factor": 2}, "rope_scaling": {"type": "llama3", "factor": 2}}`, `rope_type "linear" and rope_scaling type "llama3" disagree`},
		{`, "rope_parameters": {"rope_type": "linear", "factor": 2}, "rope_scaling": {"type": "linear", "factor": 3}}`, "rope_parameters.factor 2 and rope_scaling.factor 3 disagree"},
		{`, "rope_theta": 1e4, "rope_parameters": {"rope_theta": 1e6}}`, "rope_parameters.rope_theta 1e+06 and rope_theta 10000 disagree"},
		{`, "rope_parameters": "default"}`, "rope_parameters: want an object"},
		{`, "rope_parameters": {"rope_type": "linear"}}`, "rope_parameters linear: factor 0"},
	}
	for _, c := range bad {
		_, err := Parse([]byte(llama + c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want it to mention %q", c.json, err, c.want)
		}
	}
}

// TestLayerTypes: layer_types decides which layers slide where the family
// reads it, and is refused where it contradicts the family's rule.
func TestLayerTypes(t *testing.T) {
	lt := func(types ...string) string {
		b, _ := json.Marshal(types)
		return `, "layer_types": ` + string(b)
	}
	const f, s = fullAttention, slidingAttention
	cases := []struct {
		arch, extra string
		want        []int
	}{
		{"Qwen2ForCausalLM", `, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 3` + lt(s, f, s, f), []int{16, 0, 16, 0}},
		{"Qwen2ForCausalLM", `, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 1`, []int{0, 16, 16, 16}},
		{"Qwen3ForCausalLM", `, "use_sliding_window": true, "sliding_window": 16` + lt(f, f, f, s), []int{0, 0, 0, 16}},
		{"Qwen2MoeForCausalLM", `, "moe_intermediate_size": 8, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 3`, []int{16, 0, 16, 0}},
		{"Qwen2MoeForCausalLM", `, "moe_intermediate_size": 8, "use_sliding_window": true, "sliding_window": 16` + lt(f, s, s, f), []int{0, 16, 16, 0}},
		{"Qwen3MoeForCausalLM", `, "moe_intermediate_size": 8, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 2`, []int{16, 16, 16, 16}},
		{"MistralForCausalLM", `, "sliding_window": 16` + lt(s, s, s, s), []int{16, 16, 16, 16}},
		{"LlamaForCausalLM", lt(f, f, f, f), []int{0, 0, 0, 0}},
	}
	for _, c := range cases {
		d, err := Parse([]byte(`{"architectures":["` + c.arch + `"],` + base + c.extra + `}`))
		if err != nil {
			t.Errorf("%s%s: %v", c.arch, c.extra, err)
			continue
		}
		for i, w := range c.want {
			if d.Layers[i].SlidingWindow != w {
				t.Errorf("%s%s: layer %d window %d, want %d", c.arch, c.extra, i, d.Layers[i].SlidingWindow, w)
			}
		}
	}
	bad := []struct{ arch, extra, want string }{
		{"Qwen2ForCausalLM", lt(f, s, f, f), `layer_types[1] is "sliding_attention" but use_sliding_window is false`},
		{"Qwen3ForCausalLM", `, "use_sliding_window": true, "sliding_window": null` + lt(f, s, f, f), "sliding_window is <nil>"},
		{"Qwen2ForCausalLM", lt(f, f, f), "layer_types has 3 entries, num_hidden_layers is 4"},
		{"Qwen3ForCausalLM", lt(f, f, "chunked_attention", f), `layer_types[2] "chunked_attention" unsupported`},
		{"LlamaForCausalLM", lt(f, f, s, f), `layer_types[2] is "sliding_attention", but in LlamaForCausalLM no layer slides`},
		{"MixtralForCausalLM", `, "num_local_experts": 2, "sliding_window": 8` + lt(s, f, s, s), `layer_types[1] is "full_attention", but in MixtralForCausalLM every layer slides (window 8)`},
	}
	for _, c := range bad {
		_, err := Parse([]byte(`{"architectures":["` + c.arch + `"],` + base + c.extra + `}`))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s%s: err %v, want it to mention %q", c.arch, c.extra, err, c.want)
		}
	}
}

// TestRewriteConfigDepth: removing layers keeps per-layer lists, indices,
// window thresholds and MoE patterns true for the kept layers.
func TestRewriteConfigDepth(t *testing.T) {
	parseObj := func(b []byte) map[string]any {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	windows := func(d *Description) []int {
		var w []int
		for _, l := range d.Layers {
			w = append(w, l.SlidingWindow)
		}
		return w
	}
	cases := []struct {
		name, cfg string
		keep      []int
		check     func(t *testing.T, m map[string]any, d *Description)
	}{
		{"qwen2-max_window_layers", `{"architectures":["Qwen2ForCausalLM"],` + base + `, "use_sliding_window": true, "sliding_window": 16, "max_window_layers": 2}`, []int{0, 2, 3},
			func(t *testing.T, m map[string]any, d *Description) {
				if m["max_window_layers"].(float64) != 1 || m["layer_types"] != nil || m["num_hidden_layers"].(float64) != 3 {
					t.Errorf("config: %v", m)
				}
				if w := windows(d); w[0] != 0 || w[1] != 16 || w[2] != 16 {
					t.Errorf("windows %v, want [0 16 16]", w)
				}
			}},
		{"qwen2-default-max_window_layers", `{"architectures":["Qwen2ForCausalLM"],` + base + `, "num_hidden_layers": 30, "use_sliding_window": true, "sliding_window": 16}`, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 28, 29},
			func(t *testing.T, m map[string]any, d *Description) {
				// Default max_window_layers 28: layers 28, 29 slide; they are
				// now 27, 28, which layer_types must say.
				lt, _ := m["layer_types"].([]any)
				if len(lt) != 29 || lt[26] != fullAttention || lt[27] != slidingAttention || lt[28] != slidingAttention {
					t.Errorf("layer_types %v", lt)
				}
			}},
		{"layer_types-and-configs", `{"architectures":["Qwen3ForCausalLM"],` + base + `, "head_dim": 8, "use_sliding_window": true, "sliding_window": 16,
			"layer_types": ["sliding_attention", "full_attention", "full_attention", "sliding_attention"],
			"layer_configs": [{"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48}, {"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 20},
			  {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 30}, {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 8}]}`, []int{0, 2, 3},
			func(t *testing.T, m map[string]any, d *Description) {
				if w := windows(d); w[0] != 16 || w[1] != 0 || w[2] != 16 {
					t.Errorf("windows %v", w)
				}
				if d.Layers[1].MLP.IntermediateSize != 30 || d.Layers[2].MLP.IntermediateSize != 8 {
					t.Errorf("layer_configs not sliced: %v", m["layer_configs"])
				}
			}},
		{"qwen2moe-sparse-step", `{"architectures":["Qwen2MoeForCausalLM"],` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
			"shared_expert_intermediate_size": 8, "decoder_sparse_step": 2, "mlp_only_layers": [3]}`, []int{0, 2, 3},
			func(t *testing.T, m map[string]any, d *Description) {
				// Originally sparse: layer 1 only (3 is mlp-only). Kept 0, 2, 3 are all dense.
				if m["decoder_sparse_step"].(float64) != 1 || len(m["mlp_only_layers"].([]any)) != 3 {
					t.Errorf("config: step %v mlp_only_layers %v", m["decoder_sparse_step"], m["mlp_only_layers"])
				}
				for i, l := range d.Layers {
					if l.MoE != nil {
						t.Errorf("layer %d became sparse", i)
					}
				}
			}},
		{"mlp_only_layers", `{"architectures":["Qwen3MoeForCausalLM"],` + base + `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8, "mlp_only_layers": [1, 3]}`, []int{0, 1, 2},
			func(t *testing.T, m map[string]any, d *Description) {
				if o := m["mlp_only_layers"].([]any); len(o) != 1 || o[0].(float64) != 1 || d.Layers[1].MLP == nil || d.Layers[2].MoE == nil {
					t.Errorf("mlp_only_layers %v", o)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, err := Parse([]byte(c.cfg))
			if err != nil {
				t.Fatal(err)
			}
			out, err := RewriteConfig([]byte(c.cfg), ConfigEdit{Layers: len(before.Layers), Keep: c.keep})
			if err != nil {
				t.Fatal(err)
			}
			d, err := Parse(out)
			if err != nil {
				t.Fatalf("rewritten config: %v\n%s", err, out)
			}
			for i, l := range c.keep {
				if msg := layerDiff(&before.Layers[l], &d.Layers[i]); msg != "" {
					t.Errorf("kept layer %d: %s", l, msg)
				}
			}
			c.check(t, parseObj(out), d)
		})
	}
}

// TestRewriteConfigOther: text_config, layer_configs and the quantization
// block, numbers kept verbatim; errors name the field.
func TestRewriteConfigOther(t *testing.T) {
	nested := `{"architectures": ["Foo"], "text_config": {"num_hidden_layers": 3, "no_rope_layers": ["a", "b", "c"], "mlp_only_layers": [2], "max_window_layers": 2}, "x": 1.50}`
	out, err := RewriteConfig([]byte(nested), ConfigEdit{Layers: 3, Keep: []int{0, 2}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{`"num_hidden_layers": 2`, `"no_rope_layers": [` + "\n" + `      "a",` + "\n" + `      "c"`, `"mlp_only_layers": [` + "\n" + `      1`, `"max_window_layers": 1`, `"x": 1.50`} {
		if !strings.Contains(string(out), s) {
			t.Errorf("nested rewrite lacks %q:\n%s", s, out)
		}
	}
	cfg := `{"architectures":["LlamaForCausalLM"],` + base + `}`
	out, err = RewriteConfig([]byte(cfg), ConfigEdit{Layers: 4, LayerConfigs: []LayerConfig{{4, 2, 48}, {2, 1, 20}, {4, 2, 48}, {4, 2, 8}},
		Quant: &Quantization{Format: QuantFormat, Version: 1, Tensors: map[string]TensorQuant{}}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := Parse(out)
	if err != nil || d.Layers[1].NumHeads != 2 || d.Layers[3].MLP.IntermediateSize != 8 || d.Quant == nil {
		t.Errorf("layer_configs + quant: %v %s", err, out)
	}
	for _, c := range []struct {
		cfg  string
		e    ConfigEdit
		want string
	}{
		{`[1]`, ConfigEdit{}, "not a JSON object"},
		{cfg, ConfigEdit{Layers: 5}, "num_hidden_layers 4, the edit is for 5 layers"},
		{cfg, ConfigEdit{Keep: []int{2, 1}}, "want ascending indices in [0, 4)"},
		{cfg, ConfigEdit{Keep: []int{0, 4}}, "want ascending indices in [0, 4)"},
		{`{"num_hidden_layers": 3, "layer_types": ["a"]}`, ConfigEdit{Keep: []int{0}}, "layer_types [a]: want a list of num_hidden_layers (3) entries"},
		{`{"num_hidden_layers": 3, "mlp_only_layers": ["x"]}`, ConfigEdit{Keep: []int{0}}, "mlp_only_layers entry x is not an integer"},
	} {
		_, err := RewriteConfig([]byte(c.cfg), c.e)
		if !errors.Is(err, ErrRewrite) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %+v: %v, want ErrRewrite mentioning %q", c.cfg, c.e, err, c.want)
		}
	}
}
