package kernels

import (
	"fmt"
	"testing"
)

// The shapes of the synthetic F32 Llama the runtime is measured on (dim
// 512, 8 heads of 64, 2 KV heads, FFN 1408): (n, k) of each Linear layer.
var benchShapes = []struct {
	name string
	n, k int
}{
	{"qo", 512, 512},
	{"kv", 128, 512},
	{"gateup", 1408, 512},
	{"down", 512, 1408},
}

// benchPaths returns the kernel paths to compare: the Go path always, the
// assembly where this build and CPU have it.
func benchPaths() []string {
	if hasAsm {
		return []string{"asm", "go"}
	}
	return []string{"go"}
}

func reportGFLOPs(b *testing.B, flopsPerOp float64) {
	b.ReportMetric(flopsPerOp*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkMatMulNT is the prefill GEMM: 512 tokens through each Linear
// layer, on 1 and 2 threads.
func BenchmarkMatMulNT(b *testing.B) {
	const m = 512
	for _, s := range benchShapes {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/m=%d/n=%d/k=%d/t=%d", s.name, m, s.n, s.k, threads), func(b *testing.B) {
				r := newRand(1)
				x := randSlice(r, m*s.k)
				w := randSlice(r, s.n*s.k)
				y := make([]float32, m*s.n)
				p := NewPool(threads)
				defer p.Close()
				for b.Loop() {
					p.MatMulNT(m, s.n, s.k, x, s.k, w, s.k, y, s.n)
				}
				reportGFLOPs(b, 2*float64(m*s.n*s.k))
			})
		}
	}
}

// BenchmarkGEMV is the decode step's MatMulNT with m = 1. The per-layer
// shapes fit in L2/L3 when repeated, so "sweep" also streams 32 distinct
// gate/up-sized matrices (92 MB, the size of the model's weights) per op,
// which is what a real decode step does to memory.
func BenchmarkGEMV(b *testing.B) {
	type shape struct {
		name    string
		n, k, c int // c distinct weight matrices per op
	}
	shapes := []shape{}
	for _, s := range benchShapes {
		shapes = append(shapes, shape{s.name, s.n, s.k, 1})
	}
	shapes = append(shapes, shape{"sweep92MB", 1408, 512, 32})
	for _, s := range shapes {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/n=%d/k=%d/t=%d", s.name, s.n, s.k, threads), func(b *testing.B) {
				r := newRand(2)
				x := randSlice(r, s.k)
				ws := make([][]float32, s.c)
				for i := range ws {
					ws[i] = randSlice(r, s.n*s.k)
				}
				y := make([]float32, s.n)
				p := NewPool(threads)
				defer p.Close()
				for b.Loop() {
					for _, w := range ws {
						p.MatMulNT(1, s.n, s.k, x, s.k, w, s.k, y, s.n)
					}
				}
				per := float64(s.c * s.n * s.k)
				reportGFLOPs(b, 2*per)
				b.ReportMetric(4*per*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}

// BenchmarkPaths compares the assembly and the portable Go kernels on one
// thread.
func BenchmarkPaths(b *testing.B) {
	r := newRand(3)
	x := randSlice(r, 64*1408)
	w := randSlice(r, 1408*1408)
	y := make([]float32, 64*1408)
	v := randSlice(r, 4096)
	u := randSlice(r, 4096)
	for _, path := range benchPaths() {
		run := func(name string, flops float64, f func()) {
			b.Run(name+"/"+path, func(b *testing.B) {
				setAsm(b, path == "asm")
				for b.Loop() {
					f()
				}
				if flops > 0 {
					reportGFLOPs(b, flops)
				}
			})
		}
		run("MatMulNT/m=64/n=512/k=512", 2*64*512*512, func() { MatMulNT(64, 512, 512, x, 512, w, 512, y, 512) })
		run("GEMV/n=1408/k=512", 2*1408*512, func() { MatMulNT(1, 1408, 512, x, 512, w, 512, y, 1408) })
		run("MatMulNN/m=64/n=64/k=512", 2*64*64*512, func() { MatMulNN(64, 64, 512, x, 512, w, 128, y, 64) })
		run("MatMulNN/m=1/n=64/k=512", 2*64*512, func() { MatMulNN(1, 64, 512, x, 512, w, 128, y, 64) })
		run("Dot/n=4096", 2*4096, func() { Dot(v, u) })
		run("Softmax/n=512", 0, func() { copy(y[:512], v); Softmax(y[:512]) })
		run("SiLUMul/n=1408", 0, func() { copy(y[:1408], v); SiLUMul(y[:1408], u[:1408]) })
		run("RMSNorm/n=512", 0, func() { RMSNorm(y[:512], v[:512], u[:512], 1e-5) })
		run("Exp/n=4096", 0, func() { copy(y[:4096], v); Exp(y[:4096]) })
	}
}

// BenchmarkDot measures Dot at L1-, L2- and memory-resident lengths.
func BenchmarkDot(b *testing.B) {
	for _, n := range []int{64, 512, 4096, 65536, 1 << 22} {
		for _, path := range benchPaths() {
			b.Run(fmt.Sprintf("n=%d/%s", n, path), func(b *testing.B) {
				setAsm(b, path == "asm")
				r := newRand(4)
				a, c := randSlice(r, n), randSlice(r, n)
				var sink float32
				for b.Loop() {
					sink += Dot(a, c)
				}
				_ = sink
				reportGFLOPs(b, 2*float64(n))
				b.ReportMetric(8*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}

type nopTask struct{}

func (*nopTask) Run(lo, hi int) {}

// BenchmarkPoolRun measures the fixed cost of one Pool.Run handoff.
func BenchmarkPoolRun(b *testing.B) {
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("t=%d", threads), func(b *testing.B) {
			p := NewPool(threads)
			defer p.Close()
			t := &nopTask{}
			for b.Loop() {
				p.Run(threads, t)
			}
		})
	}
}

// BenchmarkSoftmaxScaled measures attention's scaled softmax over one
// decode row of 8,193 scores (8,192 tokens of context and the new one) on
// each path, fused (SoftmaxScaled: three passes) and as the two calls
// Scale then Softmax (four passes), in ns per element. Each op first
// restores the row (a copy, included in the time, also reported alone as
// "copy").
func BenchmarkSoftmaxScaled(b *testing.B) {
	const n = 8193
	const alpha = 0.125
	v := randSlice(newRand(3), n)
	for i := range v {
		v[i] *= 8 // raw q·k of 64-channel unit-variance heads
	}
	y := make([]float32, n)
	perElem := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/elem")
	}
	b.Run("copy", func(b *testing.B) {
		for b.Loop() {
			copy(y, v)
		}
		perElem(b)
	})
	defer func(v bool) { hasSoftmax512 = v }(hasSoftmax512)
	have := hasSoftmax512
	for _, path := range []string{"go", "avx2", "avx512"} {
		if (path != "go" && !hasAsm) || (path == "avx512" && !have) {
			continue
		}
		hasSoftmax512 = path == "avx512"
		b.Run("fused/"+path, func(b *testing.B) {
			setAsm(b, path != "go")
			for b.Loop() {
				copy(y, v)
				SoftmaxScaled(alpha, y)
			}
			perElem(b)
		})
		b.Run("scale+softmax/"+path, func(b *testing.B) {
			setAsm(b, path != "go")
			for b.Loop() {
				copy(y, v)
				Scale(alpha, y)
				Softmax(y)
			}
			perElem(b)
		})
	}
}
