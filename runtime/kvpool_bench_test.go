package runtime_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// BenchmarkBatchDecodePool measures aggregate decode tokens/s through
// runtime.ForwardBatch on tiny1m-hf (4 layers, 2 heads, head_dim 64,
// max_position_embeddings 256), one thread, at B = 1, 4, 16, 64
// concurrent sequences near full context: each sequence holds 254
// prompt tokens (random, fixed seed, prefilled in one ForwardBatch) in a
// 255-token cache from a kvcache.Pool (16-token pages; fp16, and oscar2
// with random orthogonal rotations, clipping 0.96/0.92, sink 64, recent
// 256, i.e. all tokens fp16 windowed, and sink 0, recent 0: "oscar2-q",
// every earlier token quantized), and every step decodes one token per
// sequence at position 254 and truncates back. Reports tokens/s (B
// tokens per call) by the wall clock and per CPU second of the process.
func BenchmarkBatchDecodePool(b *testing.B) {
	dir := shared.Path(b, "tiny1m-hf")
	m, d := runtime.LoadDir(b, dir, 1)
	layers := kvcache.LayersOf(d)
	const ctxLen = 254
	for _, kind := range []string{"fp16", "oscar2", "oscar2-q"} {
		method := kind
		opt := kvcache.Options{Sink: 64, Recent: 256}
		if kind != "fp16" {
			method = "oscar2"
			rng := rand.New(rand.NewPCG(5, 6))
			r := &kvcache.Rotations{}
			for _, l := range layers {
				r.K, r.V = append(r.K, randOrth(rng, l.HeadDim)), append(r.V, randOrth(rng, l.HeadDim))
				r.ClipK, r.ClipV = append(r.ClipK, 0.96), append(r.ClipV, 0.92)
			}
			opt.Rotations = r
			if kind == "oscar2-q" {
				opt.Sink, opt.Recent = 0, 0
			}
		}
		for _, B := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("%s/B=%d", kind, B), func(b *testing.B) {
				pool, err := kvcache.NewPool(method, layers, opt, 1<<30, 16)
				if err != nil {
					b.Fatal(err)
				}
				V := d.VocabSize
				rng := rand.New(rand.NewPCG(5, 9))
				seqs := make([]runtime.Seq, B)
				for s := range seqs {
					prompt := make([]int, ctxLen)
					for i := range prompt {
						prompt[i] = rng.IntN(V)
					}
					c, err := pool.NewCache(ctxLen + 1)
					if err != nil {
						b.Fatal(err)
					}
					seqs[s] = runtime.Seq{Tokens: prompt, Cache: c, Logits: make([]float32, V)}
				}
				ctx := context.Background()
				if err := runtime.ForwardBatch(ctx, m, seqs); err != nil {
					b.Fatal(err)
				}
				for s := range seqs {
					seqs[s].Tokens = []int{runtime.Argmax(seqs[s].Logits)}
				}
				b.ResetTimer()
				cpu0 := cpuSeconds()
				for i := 0; i < b.N; i++ {
					if err := runtime.ForwardBatch(ctx, m, seqs); err != nil {
						b.Fatal(err)
					}
					for s := range seqs {
						seqs[s].Cache.Truncate(ctxLen)
						seqs[s].Tokens[0] = runtime.Argmax(seqs[s].Logits)
					}
				}
				cpu := cpuSeconds() - cpu0
				b.ReportMetric(float64(b.N*B)/b.Elapsed().Seconds(), "tokens/s")
				b.ReportMetric(float64(b.N*B)/cpu, "tokens/cpu-s")
			})
		}
	}
}
