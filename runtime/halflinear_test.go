package runtime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// halfCases are the synthetic families the in-place tests run: GQA with an
// untied lm_head, biases with a tied one (the embedding read in place as
// lm_head), q/k norms, MoE with a shared expert, odd sizes (k not a
// multiple of 8, n odd), and long rows (k slices of the GEMM).
func halfCases() []struct {
	name string
	cfg  map[string]any
} {
	return []struct {
		name string
		cfg  map[string]any
	}{
		{"llama-gqa", baseConfig("LlamaForCausalLM")},
		{"qwen2-biases-tied", with(baseConfig("Qwen2ForCausalLM"), "tie_word_embeddings", true)},
		{"qwen3-qknorm", with(baseConfig("Qwen3ForCausalLM"), "head_dim", 16)},
		{"qwen2moe-shared", with(baseConfig("Qwen2MoeForCausalLM"), "num_experts", 6, "num_experts_per_tok", 2,
			"moe_intermediate_size", 24, "shared_expert_intermediate_size", 40, "decoder_sparse_step", 1, "mlp_only_layers", []int{1})},
		{"llama-odd", with(baseConfig("LlamaForCausalLM"), "hidden_size", 45, "num_attention_heads", 5, "num_key_value_heads", 1,
			"head_dim", 6, "intermediate_size", 67, "vocab_size", 101, "attention_bias", true)},
		{"llama-long-rows", with(baseConfig("LlamaForCausalLM"), "hidden_size", 96, "intermediate_size", 1601, "num_hidden_layers", 2,
			"num_attention_heads", 4, "num_key_value_heads", 2, "vocab_size", 131)},
	}
}

// linearFileBytes returns the file bytes of the linear weights that
// LinearWeightBytes counts: the 2-d tensors of dir other than the
// embedding and the MoE routers and shared-expert gates.
func linearFileBytes(t *testing.T, dir string, embedding string, routers []string) int64 {
	t.Helper()
	ck := loadCheckpoint(t, dir)
	var b int64
	for _, n := range ck.Names() {
		tt, err := ck.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		if len(tt.Shape) != 2 || n == embedding || slices.Contains(routers, n) {
			continue
		}
		b += int64(len(tt.Data))
	}
	return b
}

// TestHalfWeightsInPlace: BF16 and F16 checkpoints loaded by default keep
// their linear weights and embedding as the file's 16-bit words (no
// float32 copy: LinearWeightBytes equals the file's bytes of those
// tensors, half the widened model's), and give logits bit-identical to
// the float32-widened path (LoadOptions.DequantizeWeights) in one prefill
// and token by token, on one and on three threads. Widening bf16/f16 to
// float32 is exact and kernels.MatMulNTHalf sums every output in
// MatMulNTRows' order, so the bound is zero.
func TestHalfWeightsInPlace(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		for i, c := range halfCases() {
			t.Run(fmt.Sprintf("%s/%s", dt, c.name), func(t *testing.T) {
				dir, d, _ := synthCheckpoint(t, c.cfg, uint64(1600+i), dt)
				wide := loadDirOpts(t, dir, LoadOptions{Threads: 1, DequantizeWeights: true})
				var routers []string
				for _, l := range d.Layers {
					if l.MoE != nil {
						routers = append(routers, l.MoE.Router, l.MoE.SharedGate)
					}
				}
				fileBytes := linearFileBytes(t, dir, d.Embedding, routers)
				toks := make([]int, 13)
				for j := range toks {
					toks[j] = (j*37 + 5) % d.VocabSize
				}
				wantAll, wantSteps := forwardAll(t, wide, toks), forwardSteps(t, wide, toks, 1)
				for _, threads := range []int{1, 3} {
					m := loadDirOpts(t, dir, LoadOptions{Threads: threads})
					cm := m.(*cpuModel)
					if cm.embedH == nil || cm.embed != nil {
						t.Fatalf("threads %d: embedding not kept in place (embedH %v, %d float32)", threads, cm.embedH != nil, len(cm.embed))
					}
					if got := LinearWeightBytes(m); got != fileBytes || 2*got != LinearWeightBytes(wide) {
						t.Fatalf("threads %d: LinearWeightBytes %d, want the file's %d bytes (widened: %d)", threads, got, fileBytes, LinearWeightBytes(wide))
					}
					for _, run := range []struct {
						what      string
						got, want []float32
					}{
						{"prefill", forwardAll(t, m, toks), wantAll},
						{"decode", forwardSteps(t, m, toks, 1), wantSteps},
					} {
						if j := bitsEqual(run.got, run.want); j >= 0 {
							t.Fatalf("threads %d %s: logit %d is %v in place, %v widened", threads, run.what, j, run.got[j], run.want[j])
						}
					}
				}
			})
		}
	}
}

// TestHalfWeightsBatchAlone: with BF16/F16 weights in place, a ragged
// batch on three threads gives every sequence the bits it gets alone on
// one thread, and the bits of the widened model alone.
func TestHalfWeightsBatchAlone(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		for i, c := range halfCases() {
			t.Run(fmt.Sprintf("%s/%s", dt, c.name), func(t *testing.T) {
				dir, _, _ := synthCheckpoint(t, c.cfg, uint64(1700+i), dt)
				ma := loadDirOpts(t, dir, LoadOptions{Threads: 1})
				mb := loadDirOpts(t, dir, LoadOptions{Threads: 3})
				wide := loadDirOpts(t, dir, LoadOptions{Threads: 1, DequantizeWeights: true})
				checkBatchAlone(t, c.name, ma, mb, mixedPlan, f32Caches)
				checkBatchAlone(t, c.name+" vs widened", wide, mb, mixedPlan, f32Caches)
			})
		}
	}
}

// nanSource returns src's tensors, with element 3 of tensor name set to a
// 16-bit NaN.
type nanSource struct {
	TensorSource
	name string
}

func (s nanSource) Tensor(name string) (*safetensors.Tensor, error) {
	t, err := s.TensorSource.Tensor(name)
	if err != nil || name != s.name {
		return t, err
	}
	c := *t
	c.Data = slices.Clone(t.Data)
	c.Data[6], c.Data[7] = 0xc0, 0x7f // bf16 NaN; for f16 0x7fc0 is a NaN too
	return &c, nil
}

// TestHalfWeightsNaN: a NaN in a BF16/F16 weight kept in place, or in the
// embedding, fails Load with ErrBadWeights naming the tensor and element.
func TestHalfWeightsNaN(t *testing.T) {
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		dir, d, _ := synthCheckpoint(t, baseConfig("LlamaForCausalLM"), 1800, dt)
		ck := loadCheckpoint(t, dir)
		for _, name := range []string{d.Layers[1].Attn.K, d.Embedding, d.Layers[0].MLP.Down} {
			_, err := NewCPU().Load(context.Background(), d, nanSource{ck, name}, LoadOptions{Threads: 1})
			if !errors.Is(err, ErrBadWeights) || !strings.Contains(fmt.Sprint(err), fmt.Sprintf("tensor %q: element 3 is NaN", name)) {
				t.Errorf("%s %s: Load error %v, want ErrBadWeights naming the tensor and element 3", dt, name, err)
			}
		}
	}
}
