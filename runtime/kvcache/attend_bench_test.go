package kvcache

import (
	goruntime "runtime"
	"testing"

	"github.com/lmpack/lmpack/runtime"
)

// BenchmarkAttendLongKV times the attention of one decode step in one
// layer at 8,192 tokens of context through KVAttender (Scores then AccumV
// over every position, for every kv head), without the model around it:
// mha (8 kv heads × head_dim 64, one query row each) and gqa (2 kv heads
// × head_dim 64, four query rows each), as BenchmarkDecodeLongKV's two
// models. Kinds fp16, int8, int4 and oscar2 (Hadamard rotations, clipping
// 0.96/0.92) with the windows sink 64 and recent 256 (fp16: none), and
// oscar2-nowin with both windows 0. Reports ns/op, the thread's CPU time
// per step (cpu-µs/step; one thread) and KV_MB (the cache's Bytes()).
func BenchmarkAttendLongKV(b *testing.B) {
	const n, hd = 8192, 64
	for _, shape := range []struct {
		name   string
		nkv, g int
	}{{"mha", 8, 1}, {"gqa", 2, 4}} {
		layers := []Layer{{NumKVHeads: shape.nkv, HeadDim: hd}}
		rng := newRand(5)
		k, v := tokens(rng, layers, n, nil), tokens(rng, layers, n, nil)
		for _, kind := range []string{"fp16", "int8", "int4", "oscar2", "oscar2-nowin"} {
			b.Run(shape.name+"/"+kind, func(b *testing.B) {
				name, opt := kind, Options{Sink: 64, Recent: 256}
				if kind == "oscar2-nowin" {
					name, opt = "oscar2", Options{ExactWindows: true}
				}
				if name == "oscar2" {
					opt.Rotations = hadamardRotations(layers, 0.96, 0.92)
				}
				c := mustNew(b, name, layers, n, opt)
				c.Write(0, 0, n, k[0], v[0])
				c.Commit(n)
				ka := c.(runtime.KVAttender)
				nq := shape.g
				q, s := make([]float32, nq*hd), make([]float32, nq*n)
				out := make([]float32, nq*hd)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				scratch := make([]float32, ka.AttendScratch(0, nq))
				goruntime.LockOSThread()
				defer goruntime.UnlockOSThread()
				b.ResetTimer()
				cpu0 := threadCPU()
				for it := 0; it < b.N; it++ {
					for h := 0; h < shape.nkv; h++ {
						ka.Scores(0, h, 0, n, nq, q, hd, s, n, scratch)
						for i := range s {
							s[i] = 1.0 / n // uniform weights: the values' cost only
						}
						ka.AccumV(0, h, 0, n, nq, s, n, out, hd, scratch)
					}
				}
				b.ReportMetric((threadCPU()-cpu0)/float64(b.N)*1e6, "cpu-µs/step")
				b.ReportMetric(float64(c.Bytes())/1e6, "KV_MB")
			})
		}
	}
}
