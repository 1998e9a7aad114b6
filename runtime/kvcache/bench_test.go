package kvcache

import (
	"context"
	"fmt"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/lmpack/lmpack/runtime"
)

// benchOpt returns the options a benchmark uses for a method: OSCAR's
// published windows (sink 64, recent 256) are off so that every token is
// quantized on Write, with Hadamard rotations standing in for calibrated
// ones.
func benchOpt(name string, layers []Layer) Options {
	if name == "oscar2" || name == "oscar4" {
		return Options{Rotations: hadamardRotations(layers, 0.96, 0.92)}
	}
	return Options{}
}

// BenchmarkWrite: one decode step's Write of one token into one layer,
// ns/op, for stories260K's shape (4 kv heads × head_dim 8) and a
// Llama-3-8B-like layer (8 kv heads × head_dim 128). The cache is
// truncated to 0 when full (outside the timing is not possible per op;
// the refill cost is amortized over 4096 writes).
func BenchmarkWrite(b *testing.B) {
	for _, shape := range []Layer{{NumKVHeads: 4, HeadDim: 8}, {NumKVHeads: 8, HeadDim: 128}} {
		layers := []Layer{shape}
		d := shape.NumKVHeads * shape.HeadDim
		rng := newRand(1)
		const capacity = 4096
		k, v := tokens(rng, layers, 64, nil), tokens(rng, layers, 64, nil)
		for _, name := range Methods() {
			if _, err := New(name, layers, 1, benchOpt(name, layers)); err != nil {
				continue // q8_0/q4_0 at head_dim 8
			}
			b.Run(fmt.Sprintf("%dx%d/%s", shape.NumKVHeads, shape.HeadDim, name), func(b *testing.B) {
				c := mustNew(b, name, layers, capacity, benchOpt(name, layers))
				b.SetBytes(int64(2 * 4 * d))
				for b.Loop() {
					pos := c.Len()
					if pos == capacity {
						c.Truncate(0)
						pos = 0
					}
					j := pos % 64
					c.Write(0, pos, 1, k[0][j*d:(j+1)*d], v[0][j*d:(j+1)*d])
					c.Commit(1)
				}
			})
		}
	}
}

// BenchmarkRead: reading 512 tokens of one kv head (what attention does
// per head and layer at every decode step), ns/op.
func BenchmarkRead(b *testing.B) {
	for _, shape := range []Layer{{NumKVHeads: 4, HeadDim: 8}, {NumKVHeads: 8, HeadDim: 128}} {
		layers := []Layer{shape}
		const n = 512
		rng := newRand(2)
		k, v := tokens(rng, layers, n, nil), tokens(rng, layers, n, nil)
		for _, name := range Methods() {
			if name == "fp32" {
				continue // read zero-copy through F32KV
			}
			if _, err := New(name, layers, 1, benchOpt(name, layers)); err != nil {
				continue // q8_0/q4_0 at head_dim 8
			}
			b.Run(fmt.Sprintf("%dx%d/%s", shape.NumKVHeads, shape.HeadDim, name), func(b *testing.B) {
				c := mustNew(b, name, layers, n, benchOpt(name, layers))
				writeSteps(c, layers, k, v, 0, n, n)
				kh, vh := make([]float32, n*shape.HeadDim), make([]float32, n*shape.HeadDim)
				b.SetBytes(int64(2 * 4 * n * shape.HeadDim))
				for b.Loop() {
					c.Read(0, 0, n, kh, vh)
				}
			})
		}
	}
}

// BenchmarkDecodeStories260K: decode tokens/s of stories260K at a full
// 512-token context (511 cached tokens, one new), fp32 (zero-copy) vs the
// quantized caches. Every token of oscar2 is INT2 (no windows; Hadamard
// rotations), so Read dequantizes and un-rotates all 511 at each step.
func BenchmarkDecodeStories260K(b *testing.B) {
	m, d := loadStories(b, 1)
	const ctx = 512
	toks := storyTokens(b, ctx)
	layers := LayersOf(d)
	logits := make([]float32, ctx*d.VocabSize)
	for _, name := range []string{"fp32", "fp16", "int4", "oscar2", "kivi2", "oscars2"} {
		b.Run(name, func(b *testing.B) {
			var c runtime.KVCache
			if name == "fp32" {
				c = m.NewCache(ctx)
			} else {
				c = mustNew(b, name, layers, ctx, benchOpt(name, layers))
			}
			if err := m.Forward(context.Background(), toks[:ctx-1], c, logits, false); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			for b.Loop() {
				if err := m.Forward(context.Background(), toks[ctx-1:], c, logits, false); err != nil {
					b.Fatal(err)
				}
				c.Truncate(ctx - 1)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tokens/s")
			b.ReportMetric(float64(c.Bytes()), "KV-bytes")
		})
	}
}

// BenchmarkCodeKernels measures one head's Scores and AccumV over 2,048
// quantized tokens (head_dim 64, no windows) for nq query rows, by the
// row kernels (rows: the AVX-512 kernels where the CPU has them,
// kernels.CodeDotsQ8 on an int8-rounded query for 2-, 4- and 8-bit keys and
// kernels.CodeAccumF16 for values; rows-avx2: the float AVX2 kernels
// kernels.CodeDots/CodeAxpy on the packed codes) and by the block path (block: codes expanded to float32 per 64-token block,
// then the float32 matrix products), for the per-row code kinds; it
// chose codeRowsMaxNQ and codeRowsMaxNQ2. Reports
// CPU ns per token and query row of the pair (cpu-ns/tok-row; the
// thread's CPU time, so other processes' load does not count) and the
// same by the wall clock (ns/tok-row).
func BenchmarkCodeKernels(b *testing.B) {
	const n, hd = 2048, 64
	layers := []Layer{{NumKVHeads: 1, HeadDim: hd}}
	for _, name := range []string{"oscar2", "int4", "int8"} {
		c := mustNew(b, name, layers, n, benchOpt(name, layers))
		rng := newRand(3)
		k, v := tokens(rng, layers, n, nil), tokens(rng, layers, n, nil)
		c.Write(0, 0, n, k[0], v[0])
		c.Commit(n)
		ka := c.(runtime.KVAttender)
		for _, nq := range []int{1, 2, 4, 8, 16, 32} {
			for _, path := range []string{"rows", "rows-avx2", "block"} {
				b.Run(fmt.Sprintf("%s/nq=%d/%s", name, nq, path), func(b *testing.B) {
					defer func(a, b int, q bool) { codeRowsMaxNQ, codeRowsMaxNQ2, codeQ8 = a, b, q }(codeRowsMaxNQ, codeRowsMaxNQ2, codeQ8)
					codeRowsMaxNQ, codeRowsMaxNQ2 = 0, 0
					codeQ8 = path == "rows" // rows-avx2: the float AVX2 row kernels only
					if path != "block" {
						codeRowsMaxNQ, codeRowsMaxNQ2 = nq, nq
					}
					q, s, o := randRow(rng, nq*hd, 1), make([]float32, nq*n), make([]float32, nq*hd)
					scratch := make([]float32, ka.AttendScratch(0, nq))
					goruntime.LockOSThread()
					defer goruntime.UnlockOSThread()
					b.ResetTimer()
					c0 := threadCPU()
					for i := 0; i < b.N; i++ {
						ka.Scores(0, 0, 0, n, nq, q, hd, s, n, scratch)
						ka.AccumV(0, 0, 0, n, nq, s, n, o, hd, scratch)
					}
					cpu := threadCPU() - c0
					per := float64(b.N) * n * float64(nq)
					b.ReportMetric(cpu*1e9/per, "cpu-ns/tok-row")
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/per, "ns/tok-row")
				})
			}
		}
	}
}
