package kernels

import (
	"fmt"
	"testing"
)

// BenchmarkKVDecodeDRAM measures the one-query decode kernels of a KV
// cache at head_dim 64 as a long-context decode step runs them, over rows
// in cache and rows streamed from DRAM:
//
//   - keys2, values2: oscar2's 2-bit rows, CodeDotsQ8F16 (16 code bytes
//     and 4 param bytes read, a float32 score written per row) and
//     CodeAccumQ8 (the same bytes, and a float32 weight read per row);
//   - keys2x4: the same rows scored for a GQA group of four query heads
//     at once, CodeDotsQ8F16x4 (the same bytes per row, four scores);
//   - values2x4: the same rows accumulated for four query heads,
//     CodeAccumF16x4 (four weights read per row; counted as values2);
//   - keys16, values16: fp16 rows (an fp16 cache, and the sink and recent
//     windows of the quantised ones), HalfScores (128 bytes read and a
//     score written per row) and HalfAccum (128 bytes and a weight read).
//
// Layouts: "l2" repeats one call over the same 2,048 rows; "dram" walks
// calls of 8,192 rows (one kv head at 8,192 tokens of context) over
// 72 MiB of rows, more than twice a 32 MiB last-level cache; "win256"
// walks calls of 256 rows (a recent window) over the same 72 MiB. Reports
// ns/row and GB/s (the bytes above, 1e9 B).
//
// The 2-bit kernels gained from a software prefetch 2 KB ahead (see
// codesq8_amd64.s and codesvq8_amd64.s); the fp16 ones did not: the same
// prefetch (16 rows ahead, two lines per row) in halfScoresAVX2 and
// halfAccumAVX2 took keys16/dram from 17.6–24.3 to 18.6–21.2 GB/s and
// values16/dram from 26.2–28.3 to 17.2–21.0 (three interleaved runs), so
// they stream on the hardware prefetcher alone. values2x4 is
// compute-bound (3.3–3.6 GB/s in l2 and dram alike, about 1.2 ns per row
// and query head); a PREFETCHT0 2 KB ahead per row in it changed nothing,
// and neither did four CodeAccumQ8 calls (int8-rounded weights, one per
// query head, over pieces of 256 rows so that the codes stay in L1): 3.3–
// 4.1 GB/s counted the same way, so GQA groups of 4 keep the float kernel
// where AVX-512 runs. (Without AVX-512 CodeAccumF16x4 is portable Go, and
// GQA groups take CodeAccumQ8 once per query head: runtime/kvcache
// accumQ8.)
//
// AVX2 forms (AMD EPYC without AVX-512, 2026-12-04, 20 iterations, two
// runs): keys2 l2 2.3 ns/row (the Go fallback they replaced: 522), dram
// 2.0–2.3 (10.3–11.8 GB/s, about this machine's one-thread DRAM
// stream); values2 l2 2.2–2.6, dram 2.4–2.6 (the Go fallback: 177);
// keys16 4.6–6.2 / 8.3–10.1, values16 4.0–4.8 / 9.1–9.4 in the same
// runs. keys2x4 is four one-query passes on AVX2 (7.3–12.6 ns/row for
// the four); values2x4 times a kernel the AVX2 cache does not call
// (CodeAccumF16x4 is portable Go there).
func BenchmarkKVDecodeDRAM(b *testing.B) {
	const hd, total = 64, 72 << 20
	type kind struct {
		name     string
		rowBytes int // bytes per row the metric counts
		// setup allocates rows rows and returns the call over rows
		// [j, j+n).
		setup func(rows int) func(j, n int)
	}
	r := newRand(2)
	q := randSlice(r, hd)
	codeRows := func(rows int) ([]byte, []uint16, []float32) {
		codes, _ := codeRowsCase(1, 2, hd, 2048, 16)
		big := make([]byte, rows*16)
		for i := 0; i < len(big); i += len(codes) {
			copy(big[i:], codes)
		}
		params, p := make([]uint16, 2*rows), make([]float32, rows)
		for j := range p {
			p[j] = float32(r.Float64())
			params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
			params[2*j+1] = halfBits(F16, float32(r.Float64()*4))
		}
		return big, params, p
	}
	halfRows := func(rows int) ([]uint16, []float32) {
		v, p := make([]uint16, rows*hd), make([]float32, rows)
		for i := range v {
			v[i] = halfBits(F16, float32(r.NormFloat64()))
		}
		for j := range p {
			p[j] = float32(r.Float64())
		}
		return v, p
	}
	kinds := []kind{
		{"keys2", 24, func(rows int) func(j, n int) {
			codes, params, _ := codeRows(rows)
			qb := make([]byte, CodeQ8Len(hd))
			scale, sum := CodeQ8Query(qb, q, 2)
			out := make([]float32, rows)
			return func(j, n int) { CodeDotsQ8F16(out[j:], qb, scale, sum, codes[j*16:], 2, 16, n, params[2*j:]) }
		}},
		{"keys2x4", 24, func(rows int) func(j, n int) {
			codes, params, _ := codeRows(rows)
			qb, coef := make([]byte, 4*CodeQ8Len(hd)), make([]float32, 8)
			CodeQ8Query4(qb, randSlice(r, 4*hd), 2, coef)
			out := make([]float32, 3*rows+rows)
			return func(j, n int) { CodeDotsQ8F16x4(out[j:], rows, qb, coef, codes[j*16:], 2, 16, n, params[2*j:]) }
		}},
		{"values2", 24, func(rows int) func(j, n int) {
			codes, params, p := codeRows(rows)
			acc, tmp := make([]float32, hd), make([]float32, hd)
			return func(j, n int) { CodeAccumQ8(acc, p[j:], params[2*j:], codes[j*16:], 2, 16, n, tmp) }
		}},
		{"values2x4", 24, func(rows int) func(j, n int) {
			codes, params, _ := codeRows(rows)
			p := randSlice(r, 4*rows)
			acc, tmp := make([]float32, 4*hd), make([]float32, 4*hd)
			return func(j, n int) { CodeAccumF16x4(acc, p[j:], rows, params[2*j:], codes[j*16:], 2, 16, n, tmp) }
		}},
		{"keys16", 2*hd + 4, func(rows int) func(j, n int) {
			k, _ := halfRows(rows)
			s := make([]float32, rows)
			return func(j, n int) { HalfScores(1, n, hd, q, hd, k[j*hd:], hd, s[j:], n) }
		}},
		{"values16", 2*hd + 4, func(rows int) func(j, n int) {
			v, p := halfRows(rows)
			out := make([]float32, hd)
			return func(j, n int) { HalfAccum(1, n, hd, p[j:], n, v[j*hd:], hd, out, hd) }
		}},
	}
	for _, k := range kinds {
		for _, l := range []struct {
			name       string
			call, rows int
		}{{"l2", 2048, 2048}, {"dram", 8192, 0}, {"win256", 256, 0}} {
			b.Run(fmt.Sprintf("%s/%s", k.name, l.name), func(b *testing.B) {
				rows := l.rows
				if rows == 0 {
					rows = total / k.rowBytes / l.call * l.call
				}
				f := k.setup(rows)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					for j := 0; j < rows; j += l.call {
						f(j, l.call)
					}
				}
				n := float64(b.N) * float64(rows)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/row")
				b.ReportMetric(n*float64(k.rowBytes)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}
