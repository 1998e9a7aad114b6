package kernels

import "testing"

func BenchmarkZZDotBig(b *testing.B) {
	n := 32 << 20 // 128 MB per vector
	a := make([]float32, n)
	c := make([]float32, n)
	for i := range a {
		a[i] = 1
		c[i] = 1
	}
	for b.Loop() {
		Dot(a, c)
	}
	b.ReportMetric(8*float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}
