package runtime

import (
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
)

// configCaseTokens is longer than every window the cases use (4), so a
// layer's window changes its output.
var configCaseTokens = []int{1, 5, 90, 33, 33, 7, 64, 2, 0, 96, 12, 45, 45, 45, 3, 80, 11, 19, 23, 29}

// writeConfig replaces dir/config.json with cfg.
func writeConfig(t *testing.T, dir string, cfg map[string]any) {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// without returns a copy of m lacking keys.
func without(m map[string]any, keys ...string) map[string]any {
	out := maps.Clone(m)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

// checkAgainstRef loads dir on the CPU backend and compares its logits
// (one prefill, and decode in chunks of 3) with the float64 reference
// forward of want (a description the test states, not one parsed from
// dir's config.json) on weights w. It returns the prefill logits.
func checkAgainstRef(t *testing.T, dir string, want *arch.Description, w map[string][]float64) []float32 {
	t.Helper()
	ref, _ := refForward(want, w, configCaseTokens)
	exp := flatten(ref)
	var scale float64
	for _, v := range exp {
		scale = math.Max(scale, math.Abs(v))
	}
	tol := 2e-5 * math.Max(1, scale)
	m, _ := loadDir(t, dir, 2)
	got := forwardAll(t, m, configCaseTokens)
	if diff := maxAbsDiff(got, exp); diff > tol {
		t.Errorf("prefill: max abs diff %.3g from the float64 reference > %.3g", diff, tol)
	}
	if diff := maxAbsDiff(forwardSteps(t, m, configCaseTokens, 3), exp); diff > tol {
		t.Errorf("decode in chunks of 3: max abs diff %.3g from the float64 reference > %.3g", diff, tol)
	}
	return got
}

// withWindows sets each layer's sliding window of d (0: full attention).
func withWindows(d *arch.Description, w ...int) *arch.Description {
	for i := range d.Layers {
		d.Layers[i].SlidingWindow = w[i]
	}
	return d
}

// TestRopeParametersV5: transformers v5 configs give RoPE in one
// rope_parameters object. rope_theta 500000 there changes the logits
// exactly as rope_theta 500000 at the top level (v4) does, and both match
// the float64 reference run with theta 500000; the same for llama3
// scaling under rope_parameters and under rope_scaling.
func TestRopeParametersV5(t *testing.T) {
	llama3 := map[string]any{"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
	withType := func(m map[string]any, k, v string, theta float64) map[string]any {
		out := maps.Clone(m)
		out[k] = v
		if theta > 0 {
			out["rope_theta"] = theta
		}
		return out
	}
	cases := []struct {
		name   string
		v4, v5 map[string]any
	}{
		{"theta", with(baseConfig("LlamaForCausalLM"), "rope_theta", 500000.0),
			with(without(baseConfig("LlamaForCausalLM"), "rope_theta"), "rope_parameters", map[string]any{"rope_type": "default", "rope_theta": 500000.0})},
		{"qwen3-theta", with(baseConfig("Qwen3ForCausalLM"), "head_dim", 16, "rope_theta", 500000.0),
			with(without(baseConfig("Qwen3ForCausalLM"), "rope_theta"), "head_dim", 16, "rope_parameters", map[string]any{"rope_type": "default", "rope_theta": 500000.0})},
		{"llama3", with(baseConfig("LlamaForCausalLM"), "rope_theta", 500000.0, "rope_scaling", withType(llama3, "rope_type", "llama3", 0)),
			with(without(baseConfig("LlamaForCausalLM"), "rope_theta"), "rope_parameters", withType(llama3, "rope_type", "llama3", 500000))},
		{"linear", with(baseConfig("LlamaForCausalLM"), "rope_scaling", map[string]any{"type": "linear", "factor": 4.0}),
			with(without(baseConfig("LlamaForCausalLM"), "rope_theta"), "rope_parameters", map[string]any{"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir4, d, w := synthCheckpoint(t, c.v4, uint64(300+i), safetensors.F32)
			if c.name == "theta" && d.RoPE.Theta != 500000 {
				t.Fatalf("v4 rope_theta: %g", d.RoPE.Theta)
			}
			l4 := checkAgainstRef(t, dir4, d, w)
			dir5, _, _ := synthCheckpoint(t, c.v4, uint64(300+i), safetensors.F32)
			writeConfig(t, dir5, c.v5)
			l5 := checkAgainstRef(t, dir5, d, w)
			for j := range l4 {
				if l4[j] != l5[j] {
					t.Fatalf("logit %d: v5 rope_parameters %g, v4 keys %g: want equal", j, l5[j], l4[j])
				}
			}
		})
	}
	// The theta matters: the default-theta model's logits differ.
	dir, d, w := synthCheckpoint(t, baseConfig("LlamaForCausalLM"), 300, safetensors.F32)
	d.RoPE.Theta = 500000
	ref, _ := refForward(d, w, configCaseTokens)
	m, _ := loadDir(t, dir, 1)
	if diff := maxAbsDiff(forwardAll(t, m, configCaseTokens), flatten(ref)); diff < 1e-3 {
		t.Errorf("theta 10000 vs 500000: logits differ by only %.3g; the test cannot tell them apart", diff)
	}
}

// TestQwen3Defaults: a Qwen3 config.json without rope_theta and head_dim
// runs as transformers' Qwen3Config reads it: rope_theta 10000 and
// head_dim 128 (not hidden_size / num_attention_heads).
func TestQwen3Defaults(t *testing.T) {
	explicit := with(baseConfig("Qwen3ForCausalLM"), "num_attention_heads", 2, "num_key_value_heads", 1, "head_dim", 128, "rope_theta", 10000.0)
	dir, d, w := synthCheckpoint(t, explicit, 41, safetensors.F32)
	writeConfig(t, dir, without(explicit, "head_dim", "rope_theta"))
	checkAgainstRef(t, dir, d, w)
}

// TestLayerTypesWindows: which layers slide, as transformers decides it,
// against the float64 reference with the windows stated per layer.
func TestLayerTypesWindows(t *testing.T) {
	qwen2 := func(kv ...any) map[string]any {
		return with(with(baseConfig("Qwen2ForCausalLM"), "use_sliding_window", true, "sliding_window", 4), kv...)
	}
	qwen3moe := func(kv ...any) map[string]any {
		return with(with(baseConfig("Qwen3MoeForCausalLM"), "head_dim", 8, "num_experts", 4, "num_experts_per_tok", 2,
			"moe_intermediate_size", 16, "norm_topk_prob", true), kv...)
	}
	cases := []struct {
		name    string
		cfg     map[string]any
		plain   map[string]any // the same model without windows
		windows []int
	}{
		// layer_types decides, max_window_layers notwithstanding.
		{"qwen2-layer_types", qwen2("max_window_layers", 0, "layer_types", []string{"full_attention", "sliding_attention", "full_attention"}),
			baseConfig("Qwen2ForCausalLM"), []int{0, 4, 0}},
		{"qwen3-layer_types", with(qwen2("layer_types", []string{"sliding_attention", "full_attention", "sliding_attention"}), "architectures", []string{"Qwen3ForCausalLM"}, "head_dim", 8),
			with(baseConfig("Qwen3ForCausalLM"), "head_dim", 8), []int{4, 0, 4}},
		// Without layer_types, max_window_layers keeps its meaning...
		{"qwen2-max_window_layers", qwen2("max_window_layers", 1), baseConfig("Qwen2ForCausalLM"), []int{0, 4, 4}},
		// ... and defaults to 28: no layer of 3 slides.
		{"qwen2-default-max_window_layers", qwen2(), baseConfig("Qwen2ForCausalLM"), []int{0, 0, 0}},
		// Qwen3-MoE windows every layer (max_window_layers is not read).
		{"qwen3moe-every-layer", qwen3moe("use_sliding_window", true, "sliding_window", 4, "max_window_layers", 2), qwen3moe(), []int{4, 4, 4}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, d, w := synthCheckpoint(t, c.plain, uint64(500+i), safetensors.F32)
			writeConfig(t, dir, c.cfg)
			checkAgainstRef(t, dir, withWindows(d, c.windows...), w)
		})
	}
}

// TestUnsupportedConfigRefused: keys that change the forward and that the
// runtime does not implement are refused when the model is opened
// (arch.Load, which every stage and the runtime go through), with an
// error naming the key and its value, under either RoPE spelling.
func TestUnsupportedConfigRefused(t *testing.T) {
	yarn := map[string]any{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}
	cases := []struct {
		name string
		cfg  map[string]any
		want []string
	}{
		{"yarn-rope_parameters", with(baseConfig("LlamaForCausalLM"), "rope_parameters", yarn), []string{"rope_parameters", `"yarn"`}},
		{"yarn-rope_scaling", with(baseConfig("LlamaForCausalLM"), "rope_scaling", yarn), []string{"rope_scaling", `"yarn"`}},
		{"dynamic-rope_parameters", with(baseConfig("Qwen2ForCausalLM"), "rope_parameters", map[string]any{"rope_type": "dynamic", "factor": 2.0}), []string{"rope_parameters", `"dynamic"`}},
		{"partial_rotary_factor", with(baseConfig("LlamaForCausalLM"), "partial_rotary_factor", 0.5), []string{"partial_rotary_factor 0.5"}},
		{"partial_rotary_factor-rope_parameters", with(baseConfig("Qwen3ForCausalLM"), "head_dim", 8, "rope_parameters", map[string]any{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
			[]string{"rope_parameters.partial_rotary_factor 0.25"}},
		{"rope_theta-twice", with(baseConfig("LlamaForCausalLM"), "rope_parameters", map[string]any{"rope_type": "default", "rope_theta": 1e6}),
			[]string{"rope_parameters.rope_theta 1e+06", "rope_theta 10000", "disagree"}},
		{"mrope_section", with(baseConfig("Qwen2ForCausalLM"), "rope_parameters", map[string]any{"rope_type": "default", "mrope_section": []int{2, 1, 1}}), []string{"rope_parameters.mrope_section", "[2,1,1]"}},
		{"sliding-without-window", with(baseConfig("Qwen2ForCausalLM"), "layer_types", []string{"full_attention", "sliding_attention", "full_attention"}),
			[]string{"layer_types[1]", "use_sliding_window is false"}},
		{"chunked-layer-type", with(baseConfig("Qwen3ForCausalLM"), "head_dim", 8, "layer_types", []string{"full_attention", "chunked_attention", "full_attention"}),
			[]string{"layer_types[1]", `"chunked_attention"`}},
		{"mistral-layer_types", with(baseConfig("MistralForCausalLM"), "sliding_window", 4, "layer_types", []string{"full_attention", "sliding_attention", "sliding_attention"}),
			[]string{"layer_types[0]", `"full_attention"`, "every layer slides"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeConfig(t, dir, c.cfg)
			_, err := arch.Load(dir)
			if err == nil {
				t.Fatalf("loaded; want an error naming %q", c.want)
			}
			for _, s := range c.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not name %q", err, s)
				}
			}
		})
	}
}
