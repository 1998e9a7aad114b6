package runtime

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	goruntime "runtime"
	"sort"
	"sync"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// memSource serves tensors from memory.
type memSource map[string]*safetensors.Tensor

func (s memSource) Tensor(name string) (*safetensors.Tensor, error) {
	if t, ok := s[name]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("memSource: tensor %q: %w", name, safetensors.ErrMissingTensor)
}

// putQuantized adds the lmpack-wq storage tensors of q (docs/QUANT.md)
// for the weight name to s.
func (s memSource) putQuantized(name string, q *weights.Quantized) {
	p := arch.QuantPrefix(name)
	f16 := func(v []uint16) []byte {
		b := make([]byte, 2*len(v))
		for i, h := range v {
			binary.LittleEndian.PutUint16(b[2*i:], h)
		}
		return b
	}
	ng := q.Cols / q.GroupSize
	s[p+arch.SuffixQWeight] = &safetensors.Tensor{Name: p + arch.SuffixQWeight, File: "(mem)", DType: safetensors.U8, Shape: []int{q.Rows, weights.RowBytes(q.Cols, q.Bits)}, Data: q.Codes}
	s[p+arch.SuffixScales] = &safetensors.Tensor{Name: p + arch.SuffixScales, File: "(mem)", DType: safetensors.F16, Shape: []int{q.Rows, ng}, Data: f16(q.Scales)}
	if !q.Symmetric {
		s[p+arch.SuffixQZeros] = &safetensors.Tensor{Name: p + arch.SuffixQZeros, File: "(mem)", DType: safetensors.F16, Shape: []int{q.Rows, ng}, Data: f16(q.Zeros)}
	}
}

// benchQuant is a quantization of the benchmark model's linear weights.
type benchQuant struct {
	name string
	o    weights.Options
}

var benchQuants = []benchQuant{
	{"4bit-g32", weights.Options{Bits: 4, GroupSize: 32}},
	{"3bit-g64-sym", weights.Options{Bits: 3, GroupSize: 64, Symmetric: true}},
}

var benchModelCache = map[string]func() (*arch.Description, memSource){}
var benchModelMu sync.Mutex

// benchQuantModel is a synthetic Llama (hidden 1024, 8 layers, 16 heads,
// 4 KV heads, FFN 2816, vocab 512, tied embeddings: 90.2M linear weights)
// whose linear weights are RTN-quantized with bq.o, built in memory once
// per quantization: N(0, 1/fan_in) weights from a fixed seed, quantized
// tensor by tensor with weights.QuantizeRTN.
func benchQuantModel(bq benchQuant) (*arch.Description, memSource) {
	benchModelMu.Lock()
	f, ok := benchModelCache[bq.name]
	if !ok {
		f = sync.OnceValues(func() (*arch.Description, memSource) { return buildBenchQuantModel(bq.o) })
		benchModelCache[bq.name] = f
	}
	benchModelMu.Unlock()
	return f()
}

func buildBenchQuantModel(o weights.Options) (*arch.Description, memSource) {
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
		"num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 512, "rms_norm_eps": 1e-5,
		"max_position_embeddings": 1024, "rope_theta": 10000.0, "tie_word_embeddings": true,
	}
	return buildQuantLlama(cfg, o)
}

// quant22M is the 22M-parameter synthetic Llama (hidden 512, 8
// layers, 8 heads, 2 KV heads, FFN 1408, vocab 512, tied embeddings; the
// shapes of writeSyntheticLlama) RTN-quantized with o, built once per o.
var quant22M = map[weights.Options]func() (*arch.Description, memSource){}

func buildQuant22M(o weights.Options) (*arch.Description, memSource) {
	benchModelMu.Lock()
	f, ok := quant22M[o]
	if !ok {
		cfg := map[string]any{
			"architectures": []string{"LlamaForCausalLM"}, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8,
			"num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 512, "rms_norm_eps": 1e-5,
			"max_position_embeddings": 1024, "rope_theta": 10000.0, "tie_word_embeddings": true,
		}
		f = sync.OnceValues(func() (*arch.Description, memSource) { return buildQuantLlama(cfg, o) })
		quant22M[o] = f
	}
	benchModelMu.Unlock()
	return f()
}

// buildQuantLlama builds the Llama of config cfg with N(0, 1/fan_in)
// weights from a fixed seed, its linear weights RTN-quantized with o.
func buildQuantLlama(cfg map[string]any, o weights.Options) (*arch.Description, memSource) {
	raw, _ := json.Marshal(cfg)
	d, err := arch.Parse(raw)
	if err != nil {
		panic(err)
	}
	d.Quant = &arch.Quantization{Format: arch.QuantFormat, Version: arch.QuantVersion, Method: "rtn", Tensors: map[string]arch.TensorQuant{}}
	sh := shapes(d)
	names := make([]string, 0, len(sh))
	for n := range sh {
		names = append(names, n)
	}
	sort.Strings(names)
	rng := rand.New(rand.NewPCG(10, 24))
	src := memSource{}
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
		if len(s) == 2 && n != d.Embedding {
			q, err := weights.QuantizeRTN(v, s[0], s[1], o)
			if err != nil {
				panic(err)
			}
			src.putQuantized(n, q)
			d.Quant.Tensors[n] = arch.TensorQuant{Bits: q.Bits, GroupSize: q.GroupSize, Symmetric: q.Symmetric}
			continue
		}
		t := safetensors.FromFloat32(n, s, v)
		src[n] = &safetensors.Tensor{Name: n, File: "(mem)", DType: t.DType, Shape: t.Shape, Data: t.Data}
	}
	return d, src
}

func heapInUse() uint64 {
	goruntime.GC()
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkQuantDecode measures single-token decode (the cache refilled
// from empty every 128 tokens) of the synthetic model at each of
// benchQuants, packed with the fused GEMV for decode (packed; not the
// default since ForwardBatch, see qFusedMaxM), packed with the fused GEMV
// off (packed-tile: tiles dequantized into scratch) and dequantized
// at load, in tokens/s (weights of the widths on int8 activations,
// q8Widths, run on them in both packed modes), and reports the bytes
// of the loaded linear weights (LinearWeightBytes) and the Go heap the
// loaded model holds (HeapAlloc after load minus before, after GC).
func BenchmarkQuantDecode(b *testing.B) {
	for _, bq := range benchQuants {
		for _, mode := range []string{"packed", "packed-tile", "dequantized"} {
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%s/%s/threads=%d", bq.name, mode, threads), func(b *testing.B) {
					defer func(old int) { qFusedMaxM = old }(qFusedMaxM)
					qFusedMaxM = 1 // "packed": the fused GEMV for decode
					if mode == "packed-tile" {
						qFusedMaxM = 0
					}
					d, src := benchQuantModel(bq)
					before := heapInUse()
					m, err := NewCPU().Load(context.Background(), d, src, LoadOptions{Threads: threads, DequantizeWeights: mode == "dequantized"})
					if err != nil {
						b.Fatal(err)
					}
					defer m.Close()
					heap := int64(heapInUse()) - int64(before)
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
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
					b.ReportMetric(float64(LinearWeightBytes(m))/(1<<20), "weight_MiB")
					b.ReportMetric(float64(heap)/(1<<20), "heap_MiB")
				})
			}
		}
	}
}

// BenchmarkQuantPrefill measures a 128-token prompt from an empty cache on
// the synthetic model at each of benchQuants, packed and dequantized, on 2
// threads, in tokens/s.
func BenchmarkQuantPrefill(b *testing.B) {
	for _, bq := range benchQuants {
		for _, mode := range []string{"packed", "dequantized"} {
			b.Run(bq.name+"/"+mode, func(b *testing.B) {
				d, src := benchQuantModel(bq)
				m, err := NewCPU().Load(context.Background(), d, src, LoadOptions{Threads: 2, DequantizeWeights: mode == "dequantized"})
				if err != nil {
					b.Fatal(err)
				}
				defer m.Close()
				const T = 128
				c := m.NewCache(T)
				logits := make([]float32, d.VocabSize)
				toks := make([]int, T)
				for i := range toks {
					toks[i] = (i*31 + 7) % d.VocabSize
				}
				ctx := context.Background()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					c.Truncate(0)
					if err := m.Forward(ctx, toks, c, logits, false); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*T)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

// BenchmarkPackedMatMul measures one packed matmul y = x·Wᵀ, W [1024,
// 1024] 4-bit with groups of 32, x [m, 1024], on one thread, with the
// fused GEMV (int8 activations, kernels.DotQ8Matrix) and with dequantized tiles, in GB/s of
// packed bytes (codes, scales, zero-points) read per matmul.
func BenchmarkPackedMatMul(b *testing.B) {
	const n, k = 1024, 1024
	rng := rand.New(rand.NewPCG(3, 4))
	q := randQuantized(rng, n, k, 4, 32, false, false)
	p := &packedLinear{n: n, k: k, segs: []qseg{{rows: n, q: q, rb: weights.RowBytes(k, 4), ng: k / 32, zsym: 8}}}
	p.setFused()
	w := &linear{p: p}
	cm := &cpuModel{pool: kernels.NewPool(1), layers: []cpuLayer{{wqkv: *w}}}
	cm.allocPacked()
	defer cm.pool.Close()
	for _, m := range []int{1, 2, 4} {
		x := make([]float32, m*k)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		y := make([]float32, m*n)
		for _, path := range []string{"fused", "tile"} {
			b.Run(fmt.Sprintf("m=%d/%s", m, path), func(b *testing.B) {
				defer func(old int) { qFusedMaxM = old }(qFusedMaxM)
				qFusedMaxM = 4 // fused for every m here
				if path == "tile" {
					qFusedMaxM = 0
				}
				for b.Loop() {
					cm.matMul(m, n, k, x, k, w, y, n)
				}
				b.ReportMetric(float64(q.Bytes())*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}

// BenchmarkQuantDecode22M measures single-token decode (cache refilled
// from empty every 128 tokens) of the 22M synthetic Llama (quant22M) at
// 8-bit, 4-bit and 3-bit group 32 (asymmetric): "packed" is the runtime's
// choice per width (q8Widths: int8 activations; 3 bits on
// kernels.DotQ8MatrixU3's blocks), "float" the float fused kernels with 8-bit and
// 3-bit rows on the tile path (q8Widths all false: the decode path before
// the int8 kernels), "f32" the same weights dequantized at load
// (the F32 decode they are compared with). It reports tokens/s (wall),
// tokens per CPU-second of the process (tokens/cpu-s: on one thread the
// decode's own rate, which other load on a shared machine does not
// dilute; GC and the pool's idle spinning count in it) and GB/s of linear
// weights read per wall second.
func BenchmarkQuantDecode22M(b *testing.B) {
	for _, o := range []weights.Options{{Bits: 8, GroupSize: 32}, {Bits: 4, GroupSize: 32}, {Bits: 3, GroupSize: 32}} {
		for _, mode := range []string{"packed", "float", "f32"} {
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("%dbit-g%d/%s/threads=%d", o.Bits, o.GroupSize, mode, threads), func(b *testing.B) {
					if mode == "float" {
						saved := q8Widths
						q8Widths = [9]bool{}
						defer func() { q8Widths = saved }()
					}
					d, src := buildQuant22M(o)
					m, err := NewCPU().Load(context.Background(), d, src, LoadOptions{Threads: threads, DequantizeWeights: mode == "f32"})
					if err != nil {
						b.Fatal(err)
					}
					defer m.Close()
					c := m.NewCache(129)
					logits := make([]float32, d.VocabSize)
					tok := []int{1}
					ctx := context.Background()
					b.ResetTimer()
					cpu0 := processCPUSeconds()
					for i := 0; i < b.N; i++ {
						if c.Len() == 128 {
							c.Truncate(0)
						}
						if err := m.Forward(ctx, tok, c, logits, false); err != nil {
							b.Fatal(err)
						}
						tok[0] = Argmax(logits)
					}
					cpu := processCPUSeconds() - cpu0
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
					if cpu0 >= 0 && cpu > 0 {
						b.ReportMetric(float64(b.N)/cpu, "tokens/cpu-s")
					}
					b.ReportMetric(float64(LinearWeightBytes(m))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// BenchmarkPackedMatMulU3 is the measurement behind q8Widths[3]: one
// packed 3-bit matmul y = x·Wᵀ (cpuModel.matMul, one thread, asymmetric
// group 32, random codes) at the shapes [n, k] of the big bandwidth model
// (bigBWConfig: q/o [2048, 2048], gate+up [11264, 2048], down [2048,
// 5632]) for m = 1 (decode) and m = 64 (prefill) rows of x, on the two
// paths a 3-bit weight can take: "int8" (the codes split into a 2-bit and
// a 1-bit plane at load, x quantized to int8 per block of 32 once per
// matmul, kernels.DotQ8MatrixU3) and "tile" (q8Widths[3] off: tiles of W
// dequantized into float scratch, kernels.MatMulNTRows). It reports GB/s
// of packed weight bytes (codes, scales, zero-points) per wall second and
// per CPU second of the process (cpu_GB/s: what other load on a shared
// machine does not dilute).
func BenchmarkPackedMatMulU3(b *testing.B) {
	rng := rand.New(rand.NewPCG(33, 34))
	for _, s := range []struct{ n, k int }{{2048, 2048}, {11264, 2048}, {2048, 5632}} {
		q := randQuantized(rng, s.n, s.k, 3, 32, false, false)
		for _, m := range []int{1, 64} {
			x := make([]float32, m*s.k)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			y := make([]float32, m*s.n)
			for _, path := range []string{"int8", "tile"} {
				b.Run(fmt.Sprintf("n=%d/k=%d/m=%d/%s", s.n, s.k, m, path), func(b *testing.B) {
					saved := q8Widths
					defer func() { q8Widths = saved }()
					q8Widths[3] = path == "int8"
					p := &packedLinear{n: s.n, k: s.k, segs: []qseg{{rows: s.n, q: q, rb: weights.RowBytes(s.k, 3), ng: s.k / 32, zsym: 4}}}
					p.setFused()
					if p.q8 != (path == "int8") {
						b.Fatalf("path %s: packedLinear.q8 = %v", path, p.q8)
					}
					w := &linear{p: p}
					cm := &cpuModel{pool: kernels.NewPool(1), layers: []cpuLayer{{wqkv: *w}}}
					cm.allocPacked()
					defer cm.pool.Close()
					cm.matMul(m, s.n, s.k, x, s.k, w, y, s.n) // warm
					b.ResetTimer()
					cpu0 := processCPUSeconds()
					for i := 0; i < b.N; i++ {
						cm.matMul(m, s.n, s.k, x, s.k, w, y, s.n)
					}
					cpu := processCPUSeconds() - cpu0
					bytes := float64(q.Bytes()) * float64(b.N)
					b.ReportMetric(bytes/b.Elapsed().Seconds()/1e9, "GB/s")
					if cpu0 >= 0 && cpu > 0 {
						b.ReportMetric(bytes/cpu/1e9, "cpu_GB/s")
					}
				})
			}
		}
	}
}
