package kernels

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// dramBenchBytes is the packed weight bytes of every matrix of
// BenchmarkGEMVDRAM: 96 MiB, three times a 32 MiB last-level cache, so
// that every GEMV streams its weights from DRAM.
const dramBenchBytes = 96 << 20

// BenchmarkGEMVDRAM is one-thread decode (m = 1) GEMV y = x·Wᵀ of one
// weight matrix of dramBenchBytes, k = 2048 columns, in every weight
// format the runtime decodes (f32 MatMulNTRows, bf16 MatMulNTHalf,
// asymmetric group-32 DotQ8Matrix at 8, 4 and 2 bits, 4 bits per channel,
// 3 bits DotQ8MatrixU3 on its planes), against the copy bandwidth
// measured in the same loop: before every GEMV, untimed, one copy of a
// 64 MiB buffer into another (Go's copy). It is the kernel-level view of
// runtime BenchmarkDecodeBandwidthBig without the rest of the model. It
// runs only with LMPACK_BIG_BENCH set (it allocates about 350 MB).
//
// Metrics: weight_GB/s, packed bytes (codes, scales, zero-points) of W
// read per second of GEMV (1e9 B); copy_GB/s, bytes read + written per
// second of the copy passes (STREAM's convention); ratio_to_copy, their
// ratio (issue #16's goal: ≥ 0.8).
func BenchmarkGEMVDRAM(b *testing.B) {
	if os.Getenv("LMPACK_BIG_BENCH") == "" {
		b.Skip("LMPACK_BIG_BENCH is not set: this benchmark allocates about 350 MB")
	}
	const k = 2048
	cpA, cpB := make([]byte, 64<<20), make([]byte, 64<<20)
	for i := range cpA {
		cpA[i] = byte(i)
	}
	copy(cpB, cpA)
	type format struct {
		name        string
		bits, group int // 0 bits: float
		half        bool
	}
	formats := []format{
		{name: "f32"}, {name: "bf16", half: true},
		{name: "8bit-g32", bits: 8, group: 32}, {name: "4bit-g32", bits: 4, group: 32},
		{name: "4bit-perchannel", bits: 4, group: k}, {name: "3bit-g32", bits: 3, group: 32},
		{name: "2bit-g32", bits: 2, group: 32},
	}
	for _, f := range formats {
		b.Run(f.name, func(b *testing.B) {
			r := newRand(11)
			x := randSlice(r, k)
			var run func(y []float32)
			var perRow int
			switch {
			case f.bits == 0 && !f.half:
				perRow = 4 * k
				n := dramBenchBytes / perRow
				w := randSlice(r, n*k)
				run = func(y []float32) { MatMulNTRows(1, n, k, x, k, w, k, y, n) }
			case f.half:
				perRow = 2 * k
				n := dramBenchBytes / perRow
				w := make([]uint16, n*k)
				for i := range w {
					w[i] = uint16(safetensors.BF16FromFloat32(float32(2*r.Float64() - 1)))
				}
				run = func(y []float32) { MatMulNTHalf(BF16, 1, n, k, x, k, w, k, y, n) }
			default:
				ng := k / f.group
				rb := k * f.bits / 8
				perRow = rb + 4*ng
				n := dramBenchBytes / perRow
				codes := make([]byte, n*rb)
				for i := range codes {
					codes[i] = byte(r.IntN(256))
				}
				scales, zeros := make([]uint16, n*ng), make([]uint16, n*ng)
				for i := range scales {
					scales[i] = safetensors.F16FromFloat32(0.01 + 0.01*r.Float32())
					zeros[i] = safetensors.F16FromFloat32(float32(r.IntN(1 << uint(f.bits))))
				}
				zsym := float32(int(1) << uint(f.bits-1))
				var a Q8Act
				if f.bits == 3 {
					lb, hb := U3PlaneBytes(k)
					lo, hi, tmp := make([]byte, n*lb), make([]byte, n*hb), make([]float32, n)
					SplitU3(lo, hi, codes, rb, n, k)
					codes = nil
					run = func(y []float32) {
						QuantizeActQ8(&a, x, k, 1, k, 32)
						a.Prepare(3)
						DotQ8MatrixU3(y, n, &a, lo, hi, n, scales, zeros, f.group, zsym, tmp)
					}
				} else {
					run = func(y []float32) {
						QuantizeActQ8(&a, x, k, 1, k, 32)
						a.Prepare(f.bits)
						DotQ8Matrix(y, n, &a, codes, rb, n, f.bits, scales, zeros, f.group, zsym)
					}
				}
			}
			n := dramBenchBytes / perRow
			y := make([]float32, n)
			run(y) // first touch
			var cpSecs, secs float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				t0 := time.Now()
				copy(cpB, cpA)
				cpSecs += time.Since(t0).Seconds()
				b.StartTimer()
				t0 = time.Now()
				run(y)
				secs += time.Since(t0).Seconds()
			}
			wGB := float64(n*perRow) * float64(b.N) / secs / 1e9
			cGB := 2 * float64(len(cpA)) * float64(b.N) / cpSecs / 1e9
			b.ReportMetric(wGB, "weight_GB/s")
			b.ReportMetric(cGB, "copy_GB/s")
			b.ReportMetric(wGB/cGB, "ratio_to_copy")
			if y[0] != y[0] {
				b.Fatal(fmt.Sprint("NaN output"))
			}
		})
	}
}
