package gguf

import (
	"testing"
)

// BenchmarkQuantize and BenchmarkDequantize report throughput in MB/s of
// float32 weights (4 bytes per element) on a [64, 4096] Gaussian tensor,
// one goroutine.
func BenchmarkQuantize(b *testing.B) {
	const rows, n = 64, 4096
	x := gaussian(1, rows, n)
	for _, ty := range Types() {
		b.Run(ty.String(), func(b *testing.B) {
			for b.Loop() {
				if _, err := Quantize(ty, x, n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(4*len(x))*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
		})
	}
}

func BenchmarkDequantize(b *testing.B) {
	const rows, n = 64, 4096
	x := gaussian(1, rows, n)
	for _, ty := range Types() {
		data, err := Quantize(ty, x, n)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(ty.String(), func(b *testing.B) {
			for b.Loop() {
				if _, err := Dequantize(ty, data, n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(4*len(x))*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
		})
	}
}
