package runtime_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
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

// longKVMHAConfig is the serving-like long-context model: longKVConfig's
// shapes with multi-head attention (num_key_value_heads 8 =
// num_attention_heads, head_dim 64), its linear weights RTN-quantized to
// 4 bits in groups of 32 (packed, as lmpack serves a quantized checkpoint).
func longKVMHAConfig() map[string]any {
	c := longKVConfig()
	c["num_key_value_heads"] = 8
	return c
}

// longKVKinds are the KV kinds BenchmarkDecodeLongKV measures.
var longKVKinds = []string{"fp16", "int8", "int4", "oscar2", "kivi2", "q8_0", "q4_0"}

// BenchmarkDecodeLongKV measures one decode step at 8,192 tokens of
// context, one thread, for each of longKVKinds, on two models:
//
//   - gqa-f32: longKVConfig (GQA, 2 KV heads, F32 weights). Linear
//     weights 90.2 MB (22.5M weights, runtime.LinearWeightBytes; plus the
//     1 MB tied embedding) are read per token; fp16 KV holds
//     2·8 layers·2 heads·64·2 B = 4,096 B per token of context (33.5 MB
//     at 8,192), so the weights dominate and even free attention could
//     not make decode 2× faster.
//   - mha-4bit: longKVMHAConfig (MHA, 8 KV heads, 4-bit g32 weights).
//     Linear weights 16.1 MB (25.7M weights at 0.625 B: codes, F16 scale
//     and zero), embedding 1 MB; fp16 KV holds 16,384 B per token of
//     context (134 MB at 8,192): the KV cache is most of the bytes read,
//     as in serving.
//
// KV_MB at 8,192 tokens (gqa-f32 / mha-4bit; ×4 between them): fp16
// 33.6 / 134.2, int8 18.4 / 73.8, int4 10.4 / 41.5, oscar2 6.35 / 25.4,
// kivi2 7.36 / 29.4, q8_0 18.4 / 73.8, q4_0 10.4 / 41.5.
//
// The KV bytes of each kind (its Bytes(), all of it read per step:
// codes, scales, zeros and the fp16 windows) are reported as KV_MB.
// oscar2 uses random orthogonal rotations with clipping 0.96/0.92 and
// OSCAR's windows sink 64 and recent 256; every quantized kind the same
// windows (kivi2 quantizes 32-token blocks, so up to 31 more are fp16);
// fp16 none. Each kind runs through the cache's KVAttender ("fused") and
// through Read ("read", the path before it). The history is 8,192
// tokens of random keys and values written directly; each step decodes
// one token at position 8,192 and truncates back, and the rates count the
// decode (Forward) alone, not the truncation. Reports tokens/s and
// KV_GB/s (KV_MB read per second) by the wall clock and by the process
// CPU time (tokens/cpu-s, KV_GB/cpu-s; one thread, so other processes'
// load does not dilute them), weight_MB (runtime.LinearWeightBytes) and
// KV_MB. A kind's cache is filled only when one of its sub-benchmarks
// runs, so a -bench filter on kind runs in less time.
//
// AMD EPYC without AVX-512 (2026-12-04, after the AVX2 int8 attention
// kernels; five interleaved rounds of -benchtime 30x, tokens/cpu-s,
// median and range): mha-4bit fp16 71.0 (61.9–90.8), oscar2 149.2
// (142–167; per-round ratio to fp16 median 2.10×, 1.57–2.40×), int4
// 91.8 (81.9–119; 1.48×), int8 63.9 (60.4–78.7; 0.90×); gqa-f32 fp16
// 98.5, oscar2 110.4 (1.11×), int4 75.9, int8 71.9. With 8-bit keys by
// VPMADDWD (five more rounds, mha-4bit): fp16 67.2 (55.6–72.7), int8 71.9
// (65.6–86.1; per-round ratio median 1.18×, 0.94–1.52×), oscar2 175.5
// (141–197; 2.57×, 2.10–3.09×). Before them (the float
// key and value kernels on this CPU): mha-4bit oscar2 61.4 against fp16
// 76.4.
func BenchmarkDecodeLongKV(b *testing.B) {
	const ctxLen = 8192
	type model struct {
		name  string
		build func() (runtime.Model, *arch.Description)
	}
	models := []model{
		{"gqa-f32", func() (runtime.Model, *arch.Description) {
			dir, d, _ := runtime.SynthCheckpoint(b, longKVConfig(), 3, safetensors.F32)
			m, _ := runtime.LoadDir(b, dir, 1)
			return m, d
		}},
		{"mha-4bit", func() (runtime.Model, *arch.Description) {
			d, src := runtime.BuildQuantLlama(longKVMHAConfig(), weights.Options{Bits: 4, GroupSize: 32})
			m, err := runtime.NewCPU().Load(context.Background(), d, src, runtime.LoadOptions{Threads: 1})
			if err != nil {
				b.Fatal(err)
			}
			return m, d
		}},
	}
	for _, mo := range models {
		b.Run(mo.name, func(b *testing.B) {
			m, d := mo.build()
			defer m.Close()
			layers := kvcache.LayersOf(d)
			for _, kind := range longKVKinds {
				b.Run(kind, func(b *testing.B) {
					c := newLongKVCache(b, kind, layers, ctxLen+1)
					fillKV(b, c, d, ctxLen)
					for _, path := range []string{"read", "fused"} {
						b.Run(path, func(b *testing.B) {
							benchDecodeStep(b, m, d, c, path == "read", ctxLen)
						})
					}
				})
			}
		})
	}
}

// newLongKVCache returns BenchmarkDecodeLongKV's cache of kind.
func newLongKVCache(b *testing.B, kind string, layers []kvcache.Layer, capacity int) runtime.KVCache {
	b.Helper()
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
	c, err := kvcache.New(kind, layers, capacity, opt)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// benchDecodeStep times decode steps at position ctxLen over c (through
// Read when read), truncating back after each.
func benchDecodeStep(b *testing.B, m runtime.Model, d *arch.Description, c runtime.KVCache, read bool, ctxLen int) {
	var cc runtime.KVCache = c
	if read {
		cc = readKV{c, c.(runtime.QuantizedKV)}
	}
	logits := make([]float32, d.VocabSize)
	tok := []int{1}
	ctx := context.Background()
	kvBytes := float64(c.Bytes())
	// The wall clock and the CPU time are summed over Forward alone: the
	// Truncate that drops the new token again after each step is the
	// benchmark's scaffolding, not decode (for oscar2 it re-reads and
	// re-quantises the recent window: about 0.15 ms of a 4 ms step), and
	// it stays out of both. ns/op still counts it.
	var wall time.Duration
	var cpu float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0, c0 := time.Now(), cpuSeconds()
		if err := m.Forward(ctx, tok, cc, logits, false); err != nil {
			b.Fatal(err)
		}
		wall += time.Since(t0)
		cpu += cpuSeconds() - c0
		cc.Truncate(ctxLen)
	}
	cpu /= float64(b.N)
	sec := wall.Seconds() / float64(b.N)
	b.ReportMetric(1/sec, "tokens/s")
	b.ReportMetric(kvBytes/sec/1e9, "KV_GB/s")
	// On a shared machine the wall clock counts other processes' time:
	// the process CPU time per token (one thread) does not.
	b.ReportMetric(1/cpu, "tokens/cpu-s")
	b.ReportMetric(kvBytes/cpu/1e9, "KV_GB/cpu-s")
	b.ReportMetric(float64(runtime.LinearWeightBytes(m))/1e6, "weight_MB")
	b.ReportMetric(kvBytes/1e6, "KV_MB")
}
