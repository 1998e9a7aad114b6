package safetensors

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkFloat32Into measures dtype→float32 conversion of 1M elements;
// b.SetBytes counts the input bytes, and GB/s-in is reported as a metric.
func BenchmarkFloat32Into(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []DType{BF16, F16, F32, F8E4M3} {
		data := make([]byte, n*dt.Size())
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		tn := &Tensor{Name: "bench", File: "mem", DType: dt, Shape: []int{n}, Data: data}
		dst := make([]float32, n)
		b.Run(string(dt), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if err := tn.Float32Into(dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(data))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s-in")
		})
	}
}
