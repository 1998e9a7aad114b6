package export

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/gguf"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

// writeSynthetic writes a checkpoint for cfg (merged over a small
// decoder: hidden 64, 2 layers, 4 heads, 2 KV heads, FFN 96, vocab 512
// with stories260K's tokenizer) with seeded N(0, 0.02) weights and unit
// norms.
func writeSynthetic(t *testing.T, cfg map[string]any) string {
	base := map[string]any{
		"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
		"rope_theta": 10000.0, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
	}
	for k, v := range cfg {
		base[k] = v
	}
	raw, _ := json.Marshal(base)
	d, err := arch.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644)
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, _ := os.ReadFile(shared.Path(t, "stories260K-hf", f))
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	sh := d.TensorShapes()
	names := make([]string, 0, len(sh))
	for n := range sh {
		names = append(names, n)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewPCG(3, 4))
	var ts []safetensors.WriteTensor
	for _, n := range names {
		s := sh[n]
		size := 1
		for _, x := range s {
			size *= x
		}
		v := make([]float32, size)
		for i := range v {
			if strings.HasSuffix(n, "norm.weight") {
				v[i] = 1
			} else {
				v[i] = float32(rng.NormFloat64() * 0.02)
			}
		}
		ts = append(ts, safetensors.FromFloat32(n, s, v))
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestGGUFArchitectures: Qwen2 with q/k/v biases (not permuted), Mistral
// with a sliding window (the key and the warning), Llama 3.1 RoPE scaling
// (rope_freqs from the scaling parameters).
func TestGGUFArchitectures(t *testing.T) {
	t.Run("qwen2", func(t *testing.T) {
		dir := writeSynthetic(t, map[string]any{"architectures": []string{"Qwen2ForCausalLM"}, "model_type": "qwen2", "rope_theta": 1e6})
		_, out := exportGGUF(t, dir, GGUFOptions{})
		f := openGGUF(t, out)
		if a := kv(t, f, "general.architecture"); a != "qwen2" {
			t.Fatalf("architecture %v", a)
		}
		if v := kv(t, f, "qwen2.rope.freq_base"); v != float32(1e6) {
			t.Errorf("rope.freq_base %v", v)
		}
		ck, _ := safetensors.OpenDir(dir)
		defer ck.Close()
		for g, h := range map[string]string{"blk.1.attn_q.bias": "model.layers.1.self_attn.q_proj.bias", "blk.1.attn_k.bias": "model.layers.1.self_attn.k_proj.bias",
			"blk.1.attn_v.bias": "model.layers.1.self_attn.v_proj.bias", "blk.1.attn_q.weight": "model.layers.1.self_attn.q_proj.weight", "output.weight": "lm_head.weight"} {
			gb, err := f.TensorData(g)
			if err != nil {
				t.Fatal(err)
			}
			ht, err := ck.Tensor(h)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(gb, ht.Data) {
				t.Errorf("%s differs from %s (qwen2: no permutation)", g, h)
			}
		}
	})
	t.Run("qwen2moe", func(t *testing.T) {
		dir := writeSynthetic(t, map[string]any{"architectures": []string{"Qwen2MoeForCausalLM"}, "model_type": "qwen2_moe", "qkv_bias": true,
			"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "norm_topk_prob": false})
		rep, out := exportGGUF(t, dir, GGUFOptions{})
		f := openGGUF(t, out)
		for k, v := range map[string]any{"general.architecture": "qwen2moe", "qwen2moe.expert_count": uint32(4), "qwen2moe.expert_used_count": uint32(2),
			"qwen2moe.expert_feed_forward_length": uint32(32), "qwen2moe.expert_shared_feed_forward_length": uint32(48), "qwen2moe.feed_forward_length": uint32(96)} {
			if got := kv(t, f, k); !reflect.DeepEqual(got, v) {
				t.Errorf("%s = %#v, want %#v", k, got, v)
			}
		}
		for n, dims := range map[string][]uint64{"blk.1.ffn_gate_exps.weight": {64, 32, 4}, "blk.1.ffn_down_exps.weight": {32, 64, 4}, "blk.1.ffn_gate_inp.weight": {64, 4},
			"blk.1.ffn_up_shexp.weight": {64, 48}, "blk.1.ffn_down_shexp.weight": {48, 64}, "blk.1.ffn_gate_inp_shexp.weight": {64}, "blk.1.attn_k.bias": {32}} {
			if ti, _ := f.Tensor(n); ti == nil || !slices.Equal(ti.Dims, dims) {
				t.Errorf("%s: %+v, want dims %v", n, ti, dims)
			}
		}
		if len(rep.Warnings) != 0 {
			t.Errorf("warnings %q (norm_topk_prob false is what llama.cpp's qwen2moe does)", rep.Warnings)
		}
	})
	t.Run("mistral", func(t *testing.T) {
		dir := writeSynthetic(t, map[string]any{"architectures": []string{"MistralForCausalLM"}, "model_type": "mistral", "sliding_window": 128})
		rep, out := exportGGUF(t, dir, GGUFOptions{})
		f := openGGUF(t, out)
		if a, w := kv(t, f, "general.architecture"), kv(t, f, "llama.attention.sliding_window"); a != "llama" || w != uint32(128) {
			t.Errorf("architecture %v, sliding_window %v; want llama, 128", a, w)
		}
		if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "--ctx-size 128") {
			t.Errorf("warnings %q, want the window note", rep.Warnings)
		}
		ck, _ := safetensors.OpenDir(dir)
		defer ck.Close()
		gb, _ := f.TensorData("blk.0.attn_q.weight")
		ht, _ := ck.Tensor("model.layers.0.self_attn.q_proj.weight")
		if bytes.Equal(gb, ht.Data) {
			t.Error("mistral q_proj not permuted")
		}
	})
	t.Run("llama3-rope", func(t *testing.T) {
		dir := writeSynthetic(t, map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "rope_theta": 500000.0, "max_position_embeddings": 8192,
			"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})
		_, out := exportGGUF(t, dir, GGUFOptions{})
		f := openGGUF(t, out)
		ti, ok := f.Tensor("rope_freqs.weight")
		if !ok || ti.Type != gguf.TypeF32 || !slices.Equal(ti.Dims, []uint64{8}) {
			t.Fatalf("rope_freqs.weight: %+v, want F32 [8] (head_dim 16 / 2)", ti)
		}
		b, _ := f.TensorData("rope_freqs.weight")
		got := f32s(b)
		// Llama 3.1: wavelength 2π/θ_i against 64/4 and 64/1 tokens.
		for i, g := range got {
			wl := 2 * math.Pi * math.Pow(500000, float64(2*i)/16)
			var want float64
			switch {
			case wl < 16:
				want = 1
			case wl > 64:
				want = 8
			default:
				s := (64/wl - 1) / 3
				want = 1 / ((1-s)/8 + s)
			}
			if math.Abs(float64(g)-want) > 1e-6*want {
				t.Errorf("rope factor %d: %v, want %v", i, g, want)
			}
		}
		if got[0] != 1 || got[7] != 8 {
			t.Errorf("factors %v: want 1 for the fastest pair and 8 for the slowest", got)
		}
		if _, ok := f.Get("llama.rope.scaling.type"); ok {
			t.Error("llama3 scaling written as rope.scaling.type")
		}
		if !reflect.DeepEqual(kv(t, f, "llama.context_length"), uint32(8192)) {
			t.Error("context_length")
		}
	})
}
