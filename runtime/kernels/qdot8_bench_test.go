package kernels

import (
	"fmt"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// BenchmarkQ8GEMV is one decode GEMV y = x·Wᵀ of a packed W at the
// synthetic model's shapes (benchShapes), one thread, asymmetric group
// 32, for every stored width and m = 1, 4 and 16 activation rows: "int8"
// quantises x once (QuantizeActQ8) and runs DotQ8Matrix over W (3 bits:
// DotQ8MatrixU3 over the blocks SplitU3 made once, untimed);
// "float" runs the float fused kernels per row of W and row of x
// (DotU4RowIL on x interleaved once for 4 bits, DotQRow for 1-3 bits; for
// 8 bits, which have no fused float kernel, DequantBitsRow's Go loop into
// a row buffer and Dot, the shape of the runtime's 8-bit tile path). It
// reports GB/s of packed weight bytes (codes, scales, zero-points) read
// per GEMV and rows of W per second.
func BenchmarkQ8GEMV(b *testing.B) {
	const group = 32
	for _, bits := range []int{8, 4, 3, 2, 1} {
		for _, s := range benchShapes {
			for _, m := range []int{1, 4, 16} {
				for _, path := range []string{"int8", "float"} {
					b.Run(fmt.Sprintf("bits=%d/%s/n=%d/k=%d/m=%d/%s", bits, s.name, s.n, s.k, m, path), func(b *testing.B) {
						r := newRand(uint64(7 + bits))
						rb := (s.k*bits + 7) / 8
						ng := s.k / group
						codes := make([]byte, s.n*rb)
						for i := range codes {
							codes[i] = byte(r.IntN(256))
						}
						scales, zeros := make([]uint16, s.n*ng), make([]uint16, s.n*ng)
						for i := range scales {
							scales[i] = safetensors.F16FromFloat32(0.01 + 0.01*r.Float32())
							zeros[i] = safetensors.F16FromFloat32(float32(r.IntN(1 << uint(bits))))
						}
						x := randSlice(r, m*s.k)
						y := make([]float32, m*s.n)
						xi := make([]float32, s.k)
						row := make([]float32, s.k)
						zsym := float32(int(1) << uint(bits-1))
						var a Q8Act
						var split []byte
						if bits == 3 { // DotQ8MatrixU3's blocks, split at load
							split = make([]byte, s.n*rb)
							SplitU3(split, codes, rb, s.n, s.k)
						}
						for b.Loop() {
							if path == "int8" {
								QuantizeActQ8(&a, x, s.k, m, s.k, ActBlock(group))
								a.Prepare(bits)
								if bits == 3 {
									DotQ8MatrixU3(y, s.n, &a, split, s.n, scales, zeros, group, zsym)
									continue
								}
								DotQ8Matrix(y, s.n, &a, codes, rb, s.n, bits, scales, zeros, group, zsym)
								continue
							}
							for i := 0; i < m; i++ {
								xr := x[i*s.k : (i+1)*s.k]
								if bits == 4 {
									InterleaveU4(xi, xr)
								}
								for n := 0; n < s.n; n++ {
									src, sc, zs := codes[n*rb:], scales[n*ng:(n+1)*ng], zeros[n*ng:(n+1)*ng]
									switch bits {
									case 8:
										for g := 0; g < ng; g++ {
											sg, zg := f16ToF32(sc[g]), f16ToF32(zs[g])
											for j := g * group; j < (g+1)*group; j++ {
												row[j] = (float32(src[j]) - zg) * sg
											}
										}
										y[i*s.n+n] = Dot(xr, row)
									case 4:
										y[i*s.n+n] = DotU4RowIL(xi, src, sc, zs, group, zsym)
									default:
										y[i*s.n+n] = DotQRow(xr, src, bits, sc, zs, group, zsym)
									}
								}
							}
						}
						per := float64(len(codes) + 2*len(scales) + 2*len(zeros))
						b.ReportMetric(per*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
						b.ReportMetric(float64(s.n*b.N)/b.Elapsed().Seconds(), "rows/s")
					})
				}
			}
		}
	}
}

// BenchmarkQ8GEMM is the prefill shape of the int8-activation kernels: 16
// activation rows (the four-row kernels, four at a time) against a packed
// W [1408, 2048] (the FFN's gate/up shape of the synthetic model at four
// times its width), one thread, asymmetric, at 8, 4 and 3 bits and groups
// 32, 128 and per channel (the one-block runs and the group loop of the
// kernels). It reports GMAC/s (multiply-adds of x·Wᵀ per second, 1e9).
func BenchmarkQ8GEMM(b *testing.B) {
	const n, k, m = 1408, 2048, 16
	for _, bits := range []int{8, 4, 3} {
		for _, group := range []int{32, 128, k} {
			b.Run(fmt.Sprintf("bits=%d/group=%d", bits, group), func(b *testing.B) {
				r := newRand(uint64(17 + bits))
				rb, ng := k*bits/8, k/group
				codes := make([]byte, n*rb)
				for i := range codes {
					codes[i] = byte(r.IntN(256))
				}
				if bits == 3 {
					split := make([]byte, len(codes))
					SplitU3(split, codes, rb, n, k)
					codes = split
				}
				scales, zeros := make([]uint16, n*ng), make([]uint16, n*ng)
				for i := range scales {
					scales[i] = safetensors.F16FromFloat32(0.01 + 0.01*r.Float32())
					zeros[i] = safetensors.F16FromFloat32(float32(r.IntN(1 << uint(bits))))
				}
				x := randSlice(r, m*k)
				y := make([]float32, m*n)
				var a Q8Act
				QuantizeActQ8(&a, x, k, m, k, 32)
				a.Prepare(bits)
				for b.Loop() {
					if bits == 3 {
						DotQ8MatrixU3(y, n, &a, codes, n, scales, zeros, group, 4)
					} else {
						DotQ8Matrix(y, n, &a, codes, rb, n, bits, scales, zeros, group, 2)
					}
				}
				b.ReportMetric(float64(n*k*m)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
			})
		}
	}
}

// BenchmarkQ8GEMVPerChannel is one decode GEMV (m = 1) of a 4-bit (and
// 8-, 2- and 1-bit) asymmetric weight of the big bandwidth model's FFN shape [5632, 2048],
// one thread, in groups of 32, 64 and 128 columns and per channel (one
// group of 2048 a row), the groups of several blocks on the two-row
// kernels ("pairs": dotQ8Pairs, dotQ8x4p2AVX2 without VNNI) and on the
// one-row kernel ("one-row"). It reports GB/s of packed bytes read (codes, fp16 scales
// and zero-points).
func BenchmarkQ8GEMVPerChannel(b *testing.B) {
	const n, k = 5632, 2048
	for _, c := range []struct {
		name  string
		bits  int
		group int
		pairs bool
	}{{"g32", 4, 32, true}, {"g64/pairs", 4, 64, true}, {"g64/one-row", 4, 64, false}, {"g128/pairs", 4, 128, true}, {"g128/one-row", 4, 128, false},
		{"perchannel/pairs", 4, k, true}, {"perchannel/one-row", 4, k, false},
		{"8bit/g32", 8, 32, true}, {"8bit/g128/pairs", 8, 128, true}, {"8bit/g128/one-row", 8, 128, false},
		{"8bit/perchannel/pairs", 8, k, true}, {"8bit/perchannel/one-row", 8, k, false},
		{"2bit/g128/pairs", 2, 128, true}, {"2bit/g128/one-row", 2, 128, false},
		{"1bit/g128/pairs", 1, 128, true}, {"1bit/g128/one-row", 1, 128, false}} {
		bits := c.bits
		b.Run(c.name, func(b *testing.B) {
			if !Q8Asm(bits, 32) {
				b.Skip("no assembly")
			}
			defer func(p bool) { usePairs = p }(usePairs)
			usePairs = c.pairs
			r := newRand(7)
			rb, ng := k*bits/8, k/c.group
			codes := make([]byte, n*rb)
			for i := range codes {
				codes[i] = byte(r.IntN(256))
			}
			scales, zeros := make([]uint16, n*ng), make([]uint16, n*ng)
			for i := range scales {
				scales[i] = safetensors.F16FromFloat32(0.01 + 0.01*r.Float32())
				zeros[i] = safetensors.F16FromFloat32(float32(r.IntN(1 << bits)))
			}
			x := randSlice(r, k)
			y := make([]float32, n)
			var a Q8Act
			QuantizeActQ8(&a, x, k, 1, k, 32)
			a.Prepare(bits)
			for b.Loop() {
				DotQ8Matrix(y, n, &a, codes, rb, n, bits, scales, zeros, c.group, 0)
			}
			bytes := float64(len(codes) + 2*len(scales) + 2*len(zeros))
			b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
