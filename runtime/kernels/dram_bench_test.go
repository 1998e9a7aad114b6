package kernels

import (
	"cmp"
	"math/rand/v2"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// dramBenchBytes is the least packed weight bytes of every format of
// BenchmarkGEMVDRAM: 96 MiB, three times a 32 MiB last-level cache, so
// that every GEMV streams its weights from DRAM.
const dramBenchBytes = 96 << 20

// BenchmarkGEMVDRAM is one-thread decode (m = 1) GEMVs y = x·Wᵀ over
// whole layers of the big benchmark model (dramLayer: q, k, v, o, gate,
// up, down), as many layers as make dramBenchBytes, in every weight
// format the runtime decodes (f32 MatMulNTRows, bf16 MatMulNTHalf,
// asymmetric group-32 DotQ8Matrix at 8, 4 and 2 bits, 4 bits per channel,
// 3 bits DotQ8MatrixU3 on SplitU3's blocks at group 32 and 128, GPTQ's
// usual group), against the copy bandwidth
// measured in the same loop: before every pass over the layers, untimed, one copy of a
// 64 MiB buffer into another (Go's copy), and one read of a third 64 MiB
// buffer by streamReadAVX2 (32-byte loads and nothing else: what one core
// can read at most, the ceiling a GEMV, which only reads, can reach). It is
// the kernel-level view of runtime BenchmarkDecodeBandwidthBig without the
// rest of the model. It runs only with LMPACK_BIG_BENCH set (it allocates
// about 520 MB).
//
// Metrics (medians over the iterations, each pass against the copy pass
// just before it, so that a shared machine's changing load is seen by
// both): weight_GB/s, packed bytes (codes, scales, zero-points) of W
// read per second of GEMVs (1e9 B); copy_GB/s, bytes read + written per
// second of the copy passes (STREAM's convention); ratio_to_copy, their
// ratio (issue #16's goal: ≥ 0.8), the median of the per-iteration ratios;
// read_GB/s, bytes per second of the read passes, and ratio_to_read, the
// median of weight_GB/s over the read pass just before (with the assembly
// kernels only). A copy writes as many bytes as it reads, so one core's
// copy_GB/s can exceed what it can read alone: on the development machine
// (AMD EPYC, one thread) read_GB/s measured 29–34 against copy_GB/s
// 31–44 in the same runs.
func BenchmarkGEMVDRAM(b *testing.B) {
	if os.Getenv("LMPACK_BIG_BENCH") == "" {
		b.Skip("LMPACK_BIG_BENCH is not set: this benchmark allocates about 450 MB")
	}
	cpA, cpB := make([]byte, 64<<20), make([]byte, 64<<20)
	for i := range cpA {
		cpA[i] = byte(i)
	}
	copy(cpB, cpA)
	rd := make([]byte, 64<<20)
	for i := range rd {
		rd[i] = byte(i)
	}
	type format struct {
		name        string
		bits, group int // 0 bits: float; 0 group: per channel
		half        bool
	}
	formats := []format{
		{name: "f32"}, {name: "bf16", half: true},
		{name: "8bit-g32", bits: 8, group: 32}, {name: "4bit-g32", bits: 4, group: 32},
		{name: "4bit-perchannel", bits: 4, group: 0}, {name: "3bit-g32", bits: 3, group: 32}, {name: "3bit-g128", bits: 3, group: 128},
		{name: "2bit-g32", bits: 2, group: 32},
	}
	for _, f := range formats {
		b.Run(f.name, func(b *testing.B) {
			r := newRand(11)
			x := randSlice(r, dramLayer[len(dramLayer)-1].k)
			var runs []func()
			var layerBytes, total int
			for _, s := range dramLayer {
				layerBytes += s.n * dramRowBytes(f.bits, cmp.Or(f.group, s.k), f.half, s.k)
			}
			for total < dramBenchBytes {
				for _, s := range dramLayer {
					runs = append(runs, dramMatrix(r, f.bits, f.group, f.half, s.n, s.k, x))
				}
				total += layerBytes
			}
			run := func() {
				for _, f := range runs {
					f()
				}
			}
			run() // first touch
			ws, cs, rs := make([]float64, b.N), make([]float64, b.N), make([]float64, b.N)
			var reads, rr []float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				if hasAsm {
					t0 := time.Now()
					streamReadAVX2(&rd[0], len(rd))
					reads = append(reads, float64(len(rd))/time.Since(t0).Seconds()/1e9)
				}
				t0 := time.Now()
				copy(cpB, cpA)
				cs[i] = 2 * float64(len(cpA)) / time.Since(t0).Seconds() / 1e9
				b.StartTimer()
				t0 = time.Now()
				run()
				ws[i] = float64(total) / time.Since(t0).Seconds() / 1e9
				rs[i] = ws[i] / cs[i]
				if hasAsm {
					rr = append(rr, ws[i]/reads[i])
				}
			}
			b.ReportMetric(median(ws), "weight_GB/s")
			b.ReportMetric(median(cs), "copy_GB/s")
			b.ReportMetric(median(rs), "ratio_to_copy")
			if hasAsm {
				b.ReportMetric(median(reads), "read_GB/s")
				b.ReportMetric(median(rr), "ratio_to_read")
			}
		})
	}
}

// median returns the median of v (the mean of the middle two for an even
// length; 0 for none), sorting v.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	h := len(v) / 2
	if len(v)%2 == 1 {
		return v[h]
	}
	return (v[h-1] + v[h]) / 2
}

// dramLayer is the weight matrices [n, k] of one layer of runtime
// BenchmarkDecodeBandwidthBig's model (hidden 2048, 4 KV heads of 128,
// FFN 5632), in decode order; the last has the widest k.
var dramLayer = []struct{ n, k int }{
	{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048},
	{5632, 2048}, {5632, 2048}, {2048, 5632},
}

// dramRowBytes is the bytes of one weight row of k columns in a format:
// float32, bfloat16 (half), or bits-bit codes with a float16 scale and
// zero-point per group.
func dramRowBytes(bits, group int, half bool, k int) int {
	switch {
	case half:
		return 2 * k
	case bits == 0:
		return 4 * k
	}
	return k*bits/8 + 4*(k/group)
}

// dramMatrix draws one weight matrix [n, k] of the format and returns its
// decode GEMV against x[:k] (the int8 formats quantising x first, as the
// runtime does per matmul), group 0 meaning per channel (k).
func dramMatrix(r *rand.Rand, bits, group int, half bool, n, k int, x []float32) func() {
	x = x[:k]
	y := make([]float32, n)
	switch {
	case half:
		w := make([]uint16, n*k)
		for i := range w {
			w[i] = safetensors.BF16FromFloat32(float32(2*r.Float64() - 1))
		}
		return func() { MatMulNTHalf(BF16, 1, n, k, x, k, w, k, y, n) }
	case bits == 0:
		w := randSlice(r, n*k)
		return func() { MatMulNTRows(1, n, k, x, k, w, k, y, n) }
	}
	group = cmp.Or(group, k)
	ng := k / group
	rb := k * bits / 8
	codes := make([]byte, n*rb)
	for i := range codes {
		codes[i] = byte(r.IntN(256))
	}
	scales, zeros := make([]uint16, n*ng), make([]uint16, n*ng)
	for i := range scales {
		scales[i] = safetensors.F16FromFloat32(0.01 + 0.01*r.Float32())
		zeros[i] = safetensors.F16FromFloat32(float32(r.IntN(1 << uint(bits))))
	}
	zsym := float32(int(1) << uint(bits-1))
	var a Q8Act
	if bits == 3 {
		split := make([]byte, n*rb)
		SplitU3(split, codes, rb, n, k)
		return func() {
			QuantizeActQ8(&a, x, k, 1, k, 32)
			a.Prepare(3)
			DotQ8MatrixU3(y, n, &a, split, n, scales, zeros, group, zsym)
		}
	}
	return func() {
		QuantizeActQ8(&a, x, k, 1, k, 32)
		a.Prepare(bits)
		DotQ8Matrix(y, n, &a, codes, rb, n, bits, scales, zeros, group, zsym)
	}
}
