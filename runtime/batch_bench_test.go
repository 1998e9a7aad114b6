package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/quantize/weights"
)

// BenchmarkBatchDecode measures aggregate decode tokens/s of a ragged
// batch (ForwardBatch) on the synthetic model (writeSyntheticLlama:
// hidden 512, 8 layers, 22M weights), one thread: B sequences each at
// context 64 take one decode step per call (each cache truncated back to
// 64 after the step, so every step runs at position 64). Weights: F32, and
// packed 4-bit g32 (RTN, asymmetric; tiles dequantized once per call), and
// for B = 1 the packed weights through the fused decode GEMV (qFusedMaxM
// 1: faster alone, but not row-independent, so off by default). Reports
// tokens/s (B tokens per call) and x_batch1, the ratio to B = 1 with the
// same weights.
func BenchmarkBatchDecode(b *testing.B) {
	dir := writeSyntheticLlama(b)
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		b.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		b.Fatal(err)
	}
	const ctxLen = 64
	base := map[string]float64{}
	packed := sync.OnceValues(func() (*arch.Description, memSource) {
		return packedSource(b, cfg, 22, weights.Options{Bits: 4, GroupSize: 32})
	})
	for _, wts := range []string{"f32", "4bit-g32", "4bit-g32-fused"} {
		for _, B := range []int{1, 4, 16, 64} {
			if wts == "4bit-g32-fused" && B > 1 {
				continue
			}
			b.Run(fmt.Sprintf("%s/B=%d", wts, B), func(b *testing.B) {
				var m Model
				if wts == "f32" {
					m, _ = loadDir(b, dir, 1)
				} else {
					defer func(old int) { qFusedMaxM = old }(qFusedMaxM)
					if wts == "4bit-g32-fused" {
						qFusedMaxM = 1
					}
					d, src := packed()
					m, err = NewCPU().Load(context.Background(), d, src, LoadOptions{Threads: 1})
					if err != nil {
						b.Fatal(err)
					}
					defer m.Close()
				}
				V := m.Description().VocabSize
				rng := rand.New(rand.NewPCG(5, 9))
				ctx := context.Background()
				seqs := make([]Seq, B)
				for s := range seqs {
					prompt := make([]int, ctxLen)
					for i := range prompt {
						prompt[i] = rng.IntN(V)
					}
					seqs[s] = Seq{Tokens: prompt, Cache: m.NewCache(ctxLen + 1), Logits: make([]float32, V)}
				}
				if err := ForwardBatch(ctx, m, seqs); err != nil { // the prompts, in one call
					b.Fatal(err)
				}
				for s := range seqs {
					seqs[s].Tokens = []int{Argmax(seqs[s].Logits)}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := ForwardBatch(ctx, m, seqs); err != nil {
						b.Fatal(err)
					}
					for s := range seqs {
						seqs[s].Cache.Truncate(ctxLen)
						seqs[s].Tokens[0] = Argmax(seqs[s].Logits)
					}
				}
				tps := float64(b.N*B) / b.Elapsed().Seconds()
				b.ReportMetric(tps, "tokens/s")
				key := wts
				if wts == "4bit-g32-fused" {
					key = "4bit-g32"
				}
				if B == 1 && wts != "4bit-g32-fused" {
					base[key] = tps
				}
				if r := base[key]; r > 0 {
					b.ReportMetric(tps/r, "x_batch1")
				}
			})
		}
	}
}
