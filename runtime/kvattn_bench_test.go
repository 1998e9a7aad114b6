package runtime_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// readKV hides a cache's KVAttender ability (keeping QuantizedKV), so
// that Forward dequantizes the history with Read: the path before
// runtime.KVAttender, the reference of the fused one.
type readKV struct {
	runtime.KVCache
	runtime.QuantizedKV
}

// longKVConfig is the wide synthetic Llama (hidden 512, 8 layers,
// 8 heads, 2 KV heads, head_dim 64, FFN 1408, vocab 512, F32) with
// max_position_embeddings 16384.
func longKVConfig() map[string]any {
	return map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
		"num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 512, "rms_norm_eps": 1e-5,
		"max_position_embeddings": 16384, "rope_theta": 10000.0, "tie_word_embeddings": true,
	}
}

// cpuSeconds is the user+system CPU time of the process so far
// (runtime's processCPUSeconds: getrusage where the OS has it, else -1).
func cpuSeconds() float64 { return runtime.ProcessCPUSeconds() }

// fillKV writes n tokens of N(0, 1) keys and values (fixed seed) into
// every layer of c, 512 at a time, as a prefill would.
func fillKV(b *testing.B, c runtime.KVCache, d *arch.Description, n int) {
	b.Helper()
	rng := rand.New(rand.NewPCG(8, 16))
	const chunk = 512
	for p := 0; p < n; p += chunk {
		t := min(chunk, n-p)
		for li := range d.Layers {
			kd := d.Layers[li].KVDim()
			k, v := make([]float32, t*kd), make([]float32, t*kd)
			for i := range k {
				k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
			}
			c.Write(li, p, t, k, v)
		}
		c.Commit(t)
	}
}

// BenchmarkDecodeLongKV measures one decode step at 8,192 tokens of
// context on longKVConfig's model, one thread, for fp16, int8, int4 and
// oscar2 KV (oscar2 with random orthogonal rotations, clipping 0.96/0.92,
// OSCAR's windows sink 64 and recent 256; int8/int4 the same windows;
// fp16 none), each through the cache's KVAttender ("fused") and through
// Read ("read", the path before it). The history is 8,192 tokens of
// random keys and values written directly; each step decodes one token
// at position 8,192 and truncates back. Reports tokens/s and KV_GB/s, the
// cache's Bytes() (all of it is read per step) per second, by the wall
// clock and by the process CPU time (tokens/cpu-s, KV_GB/cpu-s).
func BenchmarkDecodeLongKV(b *testing.B) {
	const ctxLen = 8192
	dir, d, _ := runtime.SynthCheckpoint(b, longKVConfig(), 3, safetensors.F32)
	m, _ := runtime.LoadDir(b, dir, 1)
	layers := kvcache.LayersOf(d)
	for _, kind := range []string{"fp16", "int8", "int4", "oscar2"} {
		opt := kvcache.Options{Sink: 64, Recent: 256}
		if kind == "oscar2" {
			rng := rand.New(rand.NewPCG(5, 6))
			r := &kvcache.Rotations{}
			for _, l := range layers {
				r.K, r.V = append(r.K, randOrth(rng, l.HeadDim)), append(r.V, randOrth(rng, l.HeadDim))
				r.ClipK, r.ClipV = append(r.ClipK, 0.96), append(r.ClipV, 0.92)
			}
			opt.Rotations = r
		}
		c, err := kvcache.New(kind, layers, ctxLen+1, opt)
		if err != nil {
			b.Fatal(err)
		}
		fillKV(b, c, d, ctxLen)
		for _, path := range []string{"read", "fused"} {
			b.Run(fmt.Sprintf("%s/%s", kind, path), func(b *testing.B) {
				var cc runtime.KVCache = c
				if path == "read" {
					cc = readKV{c, c.(runtime.QuantizedKV)}
				}
				logits := make([]float32, d.VocabSize)
				tok := []int{1}
				ctx := context.Background()
				kvBytes := float64(c.Bytes())
				b.ResetTimer()
				cpu0 := cpuSeconds()
				for i := 0; i < b.N; i++ {
					if err := m.Forward(ctx, tok, cc, logits, false); err != nil {
						b.Fatal(err)
					}
					cc.Truncate(ctxLen)
				}
				cpu := (cpuSeconds() - cpu0) / float64(b.N)
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(1/sec, "tokens/s")
				b.ReportMetric(kvBytes/sec/1e9, "KV_GB/s")
				// On a shared machine the wall clock counts other
				// processes' time: the process CPU time per token (one
				// thread) does not.
				b.ReportMetric(1/cpu, "tokens/cpu-s")
				b.ReportMetric(kvBytes/cpu/1e9, "KV_GB/cpu-s")
			})
		}
	}
}
