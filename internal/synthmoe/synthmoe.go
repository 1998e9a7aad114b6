// Package synthmoe writes a small random Qwen2-MoE checkpoint (routed
// experts plus a gated shared expert) for tests of the stages that handle
// shared experts. It is test support: the weights carry no language.
package synthmoe

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
)

// Sizes of the checkpoint Write creates.
const (
	Hidden       = 64  // hidden_size
	Layers       = 2   // num_hidden_layers, every one sparse
	Experts      = 4   // num_experts (routed), top 2, not renormalised
	ExpertInter  = 32  // moe_intermediate_size
	SharedInter  = 96  // shared_expert_intermediate_size
	Vocab        = 512 // vocab_size: stories260K's tokenizer
	MaxPositions = 512 // max_position_embeddings
)

// Config returns the config.json of the checkpoint: Qwen2MoeForCausalLM
// (model_type qwen2_moe), Layers layers of hidden Hidden with 4 query heads
// and 2 KV heads of 16 (q/k/v biases), every layer sparse
// (decoder_sparse_step 1, mlp_only_layers []) with Experts routed experts
// of ExpertInter, top 2, and a shared expert of SharedInter with its
// sigmoid gate; untied lm_head; bos 1, eos 2 (stories260K's tokenizer).
func Config() map[string]any {
	return map[string]any{
		"architectures": []string{"Qwen2MoeForCausalLM"}, "model_type": "qwen2_moe",
		"hidden_size": Hidden, "intermediate_size": 128, "num_hidden_layers": Layers,
		"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": Vocab,
		"max_position_embeddings": MaxPositions, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
		"tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
		"num_experts": Experts, "num_experts_per_tok": 2, "moe_intermediate_size": ExpertInter,
		"shared_expert_intermediate_size": SharedInter, "norm_topk_prob": false,
		"decoder_sparse_step": 1, "mlp_only_layers": []int{},
	}
}

// tokenizerFiles are copied from the tokenizer directory when present.
var tokenizerFiles = []string{"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"}

// Write creates dir (which must not exist or be empty) holding
// config.json (Config), model.safetensors with F32 random weights drawn
// from seed (norms 1 + N(0, 0.1²), biases N(0, 0.1²), the routers
// N(0, 16/hidden), the embedding N(0, 1), every other matrix, the shared
// expert's [1, hidden] gate included, N(0, 1/in_features)) and the
// tokenizer files of tokDir (stories260K-hf, vocabulary 512). It returns
// the parsed description. Errors: I/O errors naming the file.
func Write(dir string, seed uint64, tokDir string) (*arch.Description, error) {
	raw, err := json.MarshalIndent(Config(), "", "  ")
	if err != nil {
		return nil, err
	}
	d, err := arch.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("synthmoe: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("synthmoe: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		return nil, fmt.Errorf("synthmoe: %w", err)
	}
	shapes := d.TensorShapes()
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		names = append(names, n)
	}
	slices.Sort(names) // a deterministic order for the generator
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	var ws []safetensors.WriteTensor
	for _, name := range names {
		shape := shapes[name]
		n := 1
		for _, s := range shape {
			n *= s
		}
		v := make([]float32, n)
		for i := range v {
			switch {
			case strings.HasSuffix(name, ".bias"):
				v[i] = float32(0.1 * r.NormFloat64())
			case len(shape) == 1:
				v[i] = float32(1 + 0.1*r.NormFloat64())
			case name == d.Embedding:
				v[i] = float32(r.NormFloat64())
			case strings.HasSuffix(name, ".mlp.gate.weight"):
				v[i] = float32(4 * r.NormFloat64() / math.Sqrt(float64(shape[1])))
			default:
				v[i] = float32(r.NormFloat64() / math.Sqrt(float64(shape[len(shape)-1])))
			}
		}
		ws = append(ws, safetensors.FromFloat32(name, shape, v))
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ws, map[string]string{"format": "pt"}); err != nil {
		return nil, fmt.Errorf("synthmoe: %w", err)
	}
	for _, f := range tokenizerFiles {
		b, err := os.ReadFile(filepath.Join(tokDir, f))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("synthmoe: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return nil, fmt.Errorf("synthmoe: %w", err)
		}
	}
	return d, nil
}
