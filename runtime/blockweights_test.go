package runtime

import (
	"context"
	"math"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
)

// loadDirOpts is loadDir with load options lo.
func loadDirOpts(t testing.TB, dir string, lo LoadOptions) Model {
	t.Helper()
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck := loadCheckpoint(t, dir)
	m, err := NewCPU().Load(context.Background(), d, ck, lo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// bitsEqual reports the first index where a and b differ bit for bit, or
// -1.
func bitsEqual(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// TestConvertPerBlockBitIdentical: a model loaded with ConvertPerBlock
// gives the same logits, bit for bit, as the default load, in one prefill,
// token by token and in chunks, on one and two threads, and ForwardHidden
// gives the same hidden states; dense, MoE (routed and shared experts),
// biased, windowed, and BF16/F16/F32 checkpoints.
func TestConvertPerBlockBitIdentical(t *testing.T) {
	cases := []struct {
		name  string
		cfg   map[string]any
		dtype safetensors.DType
	}{
		{"llama-bf16", baseConfig("LlamaForCausalLM"), safetensors.BF16},
		{"qwen2-biases-tied", with(baseConfig("Qwen2ForCausalLM"), "tie_word_embeddings", true), safetensors.F32},
		{"qwen2moe-shared", with(baseConfig("Qwen2MoeForCausalLM"), "num_experts", 6, "num_experts_per_tok", 2,
			"moe_intermediate_size", 24, "shared_expert_intermediate_size", 40, "decoder_sparse_step", 1, "mlp_only_layers", []int{1}), safetensors.BF16},
		{"mixtral-bf16", with(baseConfig("MixtralForCausalLM"), "num_local_experts", 4, "num_experts_per_tok", 2), safetensors.BF16},
		{"mistral-window-f16", with(baseConfig("MistralForCausalLM"), "sliding_window", 5), safetensors.F16},
	}
	tokens := []int{1, 5, 90, 33, 33, 7, 64, 2, 0, 96, 12, 45, 45, 45, 3, 80, 11, 19, 23, 29}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, d, _ := synthCheckpoint(t, c.cfg, uint64(300+i), c.dtype)
			for _, threads := range []int{1, 2} {
				def := loadDirOpts(t, dir, LoadOptions{Threads: threads})
				per := loadDirOpts(t, dir, LoadOptions{Threads: threads, ConvertPerBlock: true})
				for _, run := range []struct {
					what string
					f    func(Model) []float32
				}{
					{"prefill", func(m Model) []float32 { return forwardAll(t, m, tokens) }},
					{"decode", func(m Model) []float32 { return forwardSteps(t, m, tokens, 1) }},
					{"chunks of 7", func(m Model) []float32 { return forwardSteps(t, m, tokens, 7) }},
					{"ForwardHidden", func(m Model) []float32 {
						H := d.HiddenSize
						x := make([]float32, len(tokens)*H)
						for j := range x {
							x[j] = float32(math.Sin(float64(j)))
						}
						if err := m.(HiddenForwarder).ForwardHidden(context.Background(), x, len(tokens), m.NewCache(len(tokens))); err != nil {
							t.Fatal(err)
						}
						return x
					}},
				} {
					a, b := run.f(def), run.f(per)
					if j := bitsEqual(a, b); j >= 0 {
						t.Errorf("threads %d %s: element %d differs: %v (default) vs %v (ConvertPerBlock)", threads, run.what, j, a[j], b[j])
					}
				}
			}
		})
	}
}

// TestConvertPerBlockWeightBytes: LinearWeightBytes counts the stored
// bytes of weights converted per block: half the float32 bytes for a BF16
// checkpoint with a tied lm_head (every counted weight is in a block).
// The float32 bytes are those of DequantizeWeights: by default BF16
// weights stay in place (halflinear.go), 2 bytes each as well.
func TestConvertPerBlockWeightBytes(t *testing.T) {
	dir, _, _ := synthCheckpoint(t, with(baseConfig("LlamaForCausalLM"), "tie_word_embeddings", true), 9, safetensors.BF16)
	def := LinearWeightBytes(loadDirOpts(t, dir, LoadOptions{Threads: 1, DequantizeWeights: true}))
	per := LinearWeightBytes(loadDirOpts(t, dir, LoadOptions{Threads: 1, ConvertPerBlock: true}))
	if def <= 0 || per != def/2 {
		t.Errorf("LinearWeightBytes: %d with ConvertPerBlock, %d widened (DequantizeWeights); want half", per, def)
	}
}
