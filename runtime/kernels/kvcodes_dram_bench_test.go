package kernels

import (
	"fmt"
	"testing"
)

// BenchmarkKVCodesDRAM measures the decode kernels of a 2-bit KV cache
// (oscar2's) at head_dim 64, one query, as a long-context decode step
// runs them: CodeDotsQ8F16 (keys: 16 code bytes and 4 param bytes read,
// one score written per row) and CodeAccumQ8 (values: 16 code bytes, 4
// param bytes and one float32 weight read per row), in calls of 8,192
// rows (one kv head at 8,192 tokens of context). "l2" repeats one call
// over the same rows (2,048 of them, L2-resident); "dram" walks 384 such
// calls (3.1M rows, 72 MiB: more than twice a 32 MiB last-level cache) so
// every row comes from DRAM. Reports ns/row and GB/s (the bytes above,
// 1e9 B).
func BenchmarkKVCodesDRAM(b *testing.B) {
	const hd, rb, call = 64, 16, 8192
	for _, c := range []struct {
		name        string
		rows, calls int
	}{{"l2", 2048, 1}, {"dram", call, 384}} {
		n := c.rows * c.calls
		codes, _ := codeRowsCase(1, 2, hd, 2048, rb)
		big := make([]byte, n*rb)
		for i := 0; i < len(big); i += len(codes) {
			copy(big[i:], codes)
		}
		r := newRand(2)
		p, out := make([]float32, n), make([]float32, n)
		params := make([]uint16, 2*n)
		for j := range p {
			p[j] = float32(r.Float64())
			params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
			params[2*j+1] = halfBits(F16, float32(r.Float64()*4))
		}
		q := randSlice(r, hd)
		qb := make([]byte, CodeQ8Len(hd))
		scale, sum := CodeQ8Query(qb, q, 2)
		acc, tmp := make([]float32, hd), make([]float32, hd)
		report := func(b *testing.B, bytesPerRow int) {
			rows := float64(b.N) * float64(n)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/rows, "ns/row")
			b.ReportMetric(rows*float64(bytesPerRow)/b.Elapsed().Seconds()/1e9, "GB/s")
		}
		b.Run(fmt.Sprintf("keys/%s", c.name), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				for k := 0; k < c.calls; k++ {
					j := k * c.rows
					CodeDotsQ8F16(out[j:], qb, scale, sum, big[j*rb:], 2, rb, c.rows, params[2*j:])
				}
			}
			report(b, rb+4+4)
		})
		b.Run(fmt.Sprintf("values/%s", c.name), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				for k := 0; k < c.calls; k++ {
					j := k * c.rows
					CodeAccumQ8(acc, p[j:], params[2*j:], big[j*rb:], 2, rb, c.rows, tmp)
				}
			}
			report(b, rb+4+4)
		})
	}
}
