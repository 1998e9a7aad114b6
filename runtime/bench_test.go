package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

// llama.cpp CPU backend figures on this machine class (issue #2): F32
// weights and KV cache; decode = tg128, prefill = pp512.
var llamaCpp = map[string]map[int][2]float64{ // model -> threads -> {decode, prefill} tokens/s
	"synthetic-22M": {1: {290, 1540}, 2: {530, 2650}},
	"stories260K":   {1: {4900, 4370}},
}

// writeSyntheticLlama writes the benchmark model (dim 512, 8 layers,
// 8 heads, 2 KV heads, FFN 1408, vocab 512, F32, tied embeddings) with
// N(0, 1/fan_in) weights from a fixed seed into a temp dir.
func writeSyntheticLlama(b *testing.B) string {
	b.Helper()
	return writeSyntheticLlamaAs(b, safetensors.F32)
}

// writeSyntheticLlamaAs is writeSyntheticLlama with the tensors stored as
// dtype (the same float32 draws, rounded by safetensors.FromFloat32As).
func writeSyntheticLlamaAs(b *testing.B, dtype safetensors.DType) string {
	b.Helper()
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
		"num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 512, "rms_norm_eps": 1e-5,
		"max_position_embeddings": 1024, "rope_theta": 10000.0, "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2,
	}
	raw, _ := json.Marshal(cfg)
	d, err := arch.Parse(raw)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644)
	sh := shapes(d)
	names := make([]string, 0, len(sh))
	for n := range sh {
		names = append(names, n)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewPCG(22, 6))
	var ws []safetensors.WriteTensor
	for _, n := range names {
		s := sh[n]
		size := 1
		for _, x := range s {
			size *= x
		}
		v := make([]float32, size)
		for i := range v {
			if len(s) == 1 {
				v[i] = 1
			} else {
				v[i] = float32(rng.NormFloat64() / math.Sqrt(float64(s[len(s)-1])))
			}
		}
		wt, err := safetensors.FromFloat32As(n, dtype, s, v)
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, wt)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ws, nil); err != nil {
		b.Fatal(err)
	}
	return dir
}

func benchModels(b *testing.B) map[string]string {
	return map[string]string{
		"stories260K":   shared.Path(b, "stories260K-hf"),
		"synthetic-22M": writeSyntheticLlama(b),
	}
}

// BenchmarkDecode measures single-token decode (llama-bench tg128: the
// cache is refilled from empty every 128 tokens) in tokens/s, on 1 thread
// and on all cores, and reports the ratio to llama.cpp where known.
func BenchmarkDecode(b *testing.B) {
	for _, name := range []string{"stories260K", "synthetic-22M"} {
		dir := benchModels(b)[name]
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/threads=%d", name, threads), func(b *testing.B) {
				m, d := loadDir(b, dir, threads)
				c := m.NewCache(129)
				logits := make([]float32, d.VocabSize)
				tok := []int{1}
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if c.Len() == 128 {
						c.Truncate(0)
					}
					if err := m.Forward(ctx, tok, c, logits, false); err != nil {
						b.Fatal(err)
					}
					tok[0] = Argmax(logits)
				}
				tps := float64(b.N) / b.Elapsed().Seconds()
				b.ReportMetric(tps, "tokens/s")
				if ref, ok := llamaCpp[name][threads]; ok {
					b.ReportMetric(tps/ref[0], "x_llama.cpp")
				}
			})
		}
	}
}

// BenchmarkPrefill measures a 512-token prompt (llama-bench pp512) run
// from an empty cache, in tokens/s.
func BenchmarkPrefill(b *testing.B) {
	for _, name := range []string{"stories260K", "synthetic-22M"} {
		dir := benchModels(b)[name]
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/threads=%d", name, threads), func(b *testing.B) {
				m, d := loadDir(b, dir, threads)
				const T = 512
				c := m.NewCache(T)
				logits := make([]float32, d.VocabSize)
				rng := rand.New(rand.NewPCG(1, 2))
				toks := make([]int, T)
				for i := range toks {
					toks[i] = rng.IntN(d.VocabSize)
				}
				ctx := context.Background()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c.Truncate(0)
					if err := m.Forward(ctx, toks, c, logits, false); err != nil {
						b.Fatal(err)
					}
				}
				tps := float64(b.N*T) / b.Elapsed().Seconds()
				b.ReportMetric(tps, "tokens/s")
				if ref, ok := llamaCpp[name][threads]; ok {
					b.ReportMetric(tps/ref[1], "x_llama.cpp")
				}
			})
		}
	}
}
