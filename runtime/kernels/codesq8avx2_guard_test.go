//go:build linux

package kernels

import (
	"fmt"
	"math"
	"testing"
)

// TestBreakAVX2Guarded calls the AVX2 key kernels with every buffer ending
// at a PROT_NONE page and compares exact against the Go path (integer sums
// exact; epilogue allowed to differ by fused rounding only).
func TestBreakAVX2Guarded(t *testing.T) {
	if !hasQ8AVX2 || hasVNNI512 {
		t.Skip("need AVX2 path")
	}
	r := newRand(777)
	shapes := [][2]int{{2, 64}, {2, 128}, {2, 192}, {2, 256}, {4, 32}, {4, 64}, {4, 96}, {4, 128}, {8, 16}, {8, 32}, {8, 48}, {8, 64}, {8, 128}, {8, 256}, {8, 272}}
	for _, sh := range shapes {
		bits, hd := sh[0], sh[1]
		R := hd * bits / 8
		for _, pad := range []int{0, 1, 5, 16, 48} {
			rb := R + pad
			for n := 1; n <= 70; n++ {
				name := fmt.Sprintf("b%d/hd%d/rb%d/n%d", bits, hd, rb, n)
				t.Run(name, func(t *testing.T) {
					nc := (n-1)*rb + R // the last row without its padding, as checkCodes allows
					codes := guardedBytes(t, nc)
					for i := range codes {
						codes[i] = byte(r.IntN(256))
					}
					q := make([]float32, 4*hd)
					for i := range q {
						q[i] = float32(r.NormFloat64())
					}
					qb := guardedBytes(t, CodeQ8Len(hd))
					scale, sum := CodeQ8Query(qb, q[:hd], bits)
					qb4 := guardedBytes(t, 4*CodeQ8Len(hd))
					coef := guarded(t, 8)
					CodeQ8Query4(qb4, q, bits, coef)
					sz := guarded(t, 2*n)
					params := guardedU16(t, 2*n)
					for j := 0; j < n; j++ {
						s := float32(0.01 + 0.1*r.Float64())
						z := float32(r.Float64() * float64(int(1)<<bits))
						params[2*j], params[2*j+1] = halfBits(F16, s), halfBits(F16, z)
						sz[2*j], sz[2*j+1] = F16.Widen(params[2*j]), F16.Widen(params[2*j+1])
					}
					out := guarded(t, n)
					outF := guarded(t, n)
					out4 := guarded(t, 3*n+n)
					CodeDotsQ8(out, qb, scale, sum, codes, bits, rb, n, sz)
					CodeDotsQ8F16(outF, qb, scale, sum, codes, bits, rb, n, params)
					CodeDotsQ8F16x4(out4, n, qb4, coef, codes, bits, rb, n, params)
					// ldo > n
					ldo := n + 3
					out4b := guarded(t, 3*ldo+n)
					CodeDotsQ8F16x4(out4b, ldo, qb4, coef, codes, bits, rb, n, params)
					if n%4 == 0 && pad > 0 {
						// the asm alone on the exact (n−1)·rb + R bytes, guarded
						ex := guardedBytes(t, (n-1)*rb+R)
						copy(ex, codes)
						u := hd * bits / 128
						o1, o2 := guarded(t, n), guarded(t, n)
						c2 := [2]float32{scale, sum}
						switch {
						case bits == 2:
							codeDotsQ8b2AVX2(&o1[0], &qb[0], &ex[0], n/4, u, rb, 64, &sz[0], &c2[0], &q8Consts)
						case bits == 4:
							codeDotsQ8b4AVX2(&o1[0], &qb[0], &ex[0], n/4, u, rb, 64, &sz[0], &c2[0], &q8Consts)
						case u <= q8WideUnits:
							codeDotsQ8b8WAVX2(&o1[0], &qb[0], &ex[0], n/4, u, rb, 64, &sz[0], &c2[0], &q8Consts)
						default:
							codeDotsQ8b8AVX2(&o1[0], &qb[0], &ex[0], n/4, u, rb, 64, &sz[0], &c2[0], &q8Consts)
						}
						codeDotsQ8F16AVX2(bits, &o2[0], &qb[0], &ex[0], n/4, u, rb, 64, &params[0], &c2[0])
						for j := 0; j < n; j++ {
							if o1[j] != out[j] || o2[j] != outF[j] {
								t.Fatalf("%s: exact-length asm row %d: %g %g vs %g %g", name, j, o1[j], o2[j], out[j], outF[j])
							}
						}
						if bits == 8 && u <= q8WideUnits {
							codeDotsQ8b8AVX2(&o1[0], &qb[0], &ex[0], n/4, u, rb, 64, &sz[0], &c2[0], &q8Consts)
							codeDotsQ8F16b8AVX2(&o2[0], &qb[0], &ex[0], n/4, u, rb, 64, &params[0], &c2[0], &q8Consts)
							for j := 0; j < n; j++ {
								if o1[j] != out[j] || o2[j] != outF[j] {
									t.Fatalf("%s: nibble kernel row %d: %g %g vs %g %g", name, j, o1[j], o2[j], out[j], outF[j])
								}
							}
						}
					}
					for j := 0; j < n; j++ {
						tj := float64(q8RowDot(codes[j*rb:], qb, 1, 0, bits))
						ref := float64(sz[2*j]) * (float64(scale)*tj - float64(sz[2*j+1])*float64(sum))
						mag := math.Abs(float64(sz[2*j])) * (math.Abs(float64(scale)*tj) + math.Abs(float64(sz[2*j+1])*float64(sum)))
						tol := 4*0x1p-24*mag + 1e-30
						if d := math.Abs(float64(out[j]) - ref); !(d <= tol) {
							t.Fatalf("%s row %d: CodeDotsQ8 %g want %g", name, j, out[j], ref)
						}
						if math.Float32bits(out[j]) != math.Float32bits(outF[j]) && 4*(n/4) > j {
							t.Fatalf("%s row %d: CodeDotsQ8 %g != F16 %g", name, j, out[j], outF[j])
						}
						for qq := 0; qq < 4; qq++ {
							// one-query result for row qq
							one := make([]float32, n)
							qbq := make([]byte, CodeQ8Len(hd))
							sc, sm := CodeQ8Query(qbq, q[qq*hd:(qq+1)*hd], bits)
							if sc != coef[2*qq] || sm != coef[2*qq+1] {
								t.Fatalf("%s: query %d coef %g %g vs %g %g", name, qq, coef[2*qq], coef[2*qq+1], sc, sm)
							}
							CodeDotsQ8F16(one, qbq, sc, sm, codes, bits, rb, n, params)
							if math.Float32bits(out4[qq*n+j]) != math.Float32bits(one[j]) || math.Float32bits(out4b[qq*ldo+j]) != math.Float32bits(one[j]) {
								t.Fatalf("%s: x4 query %d row %d: %g / %g, one-query %g", name, qq, j, out4[qq*n+j], out4b[qq*ldo+j], one[j])
							}
						}
					}
				})
			}
		}
	}
}

// TestBreakAVX2AccumGuarded: CodeAccumQ8 with guarded buffers, n 1..70,
// hd 64/128, against float64 with the doc bound.
func TestBreakAVX2AccumGuarded(t *testing.T) {
	if !hasQ8AVX2 || hasVBMI {
		t.Skip("need AVX2 path")
	}
	for _, hd := range []int{64, 128} {
		rb := hd / 4
		for n := 1; n <= 70; n++ {
			t.Run(fmt.Sprintf("hd%d/n%d", hd, n), func(t *testing.T) {
				codesU, vals := codeRowsCase(uint64(n+hd), 2, hd, n, rb)
				codes := guardedBytes(t, len(codesU))
				copy(codes, codesU)
				r := newRand(uint64(3*n + hd))
				p := guarded(t, n)
				params := guardedU16(t, 2*n)
				for j := range p {
					p[j] = float32(r.Float64() * math.Exp(-8*r.Float64()))
					params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
					params[2*j+1] = halfBits(F16, float32(r.Float64()*4))
				}
				acc := guarded(t, hd)
				fillRand(r, acc)
				base := append([]float32(nil), acc...)
				tmp := guarded(t, hd)
				CodeAccumQ8(acc, p, params, codes, 2, rb, n, tmp)
				for c := 0; c < hd; c++ {
					ref, mag, rnd := accumRef(float64(base[c]), p, params, vals, c, 16)
					fp := 2*(float64(n+4)*0x1p-24*mag) + 0x1p-23*math.Abs(ref)
					if d := math.Abs(float64(acc[c]) - ref); !(d <= rnd+fp) {
						t.Fatalf("hd%d n%d: acc[%d] = %g, ref %g", hd, n, c, acc[c], ref)
					}
				}
			})
		}
	}
}

// TestBreakAVX2AccumKernelPadded calls codeAccumQ8b2AVX2 directly with
// padded row strides (the kernel claims any rb ≥ 16·nc), guarded, and
// n16 from 1 to 20 (the 8-block super loop), against the Go path with
// the same rounding on an unpadded copy.
func TestBreakAVX2AccumKernelPadded(t *testing.T) {
	if !hasQ8AVX2 {
		t.Skip("need AVX2")
	}
	for _, nc := range []int{1, 2, 3} {
		hd := 64 * nc
		for _, pad := range []int{0, 1, 7, 16} {
			rb := hd/4 + pad
			for n16 := 1; n16 <= 20; n16++ {
				t.Run(fmt.Sprintf("nc%d/pad%d/n16_%d", nc, pad, n16), func(t *testing.T) {
					n := 16 * n16
					codesU, _ := codeRowsCase(uint64(n+hd+pad), 2, hd, n, rb)
					codes := guardedBytes(t, (n-1)*rb+hd/4)
					copy(codes, codesU)
					r := newRand(uint64(n + pad))
					p := guarded(t, n)
					params := guardedU16(t, 2*n)
					for j := range p {
						p[j] = float32(r.Float64() * math.Exp(-8*r.Float64()))
						params[2*j] = halfBits(F16, float32(0.01+0.1*r.Float64()))
						params[2*j+1] = halfBits(F16, float32(r.Float64()*4))
					}
					tmp := guarded(t, hd)
					var cz float32
					codeAccumQ8b2AVX2(&tmp[0], &p[0], &params[0], &codes[0], n16, nc, rb, &q8vConsts, &cz)
					acc := make([]float32, hd)
					for c := 0; c < hd; c += 64 {
						addPlanes(acc[c:c+64], tmp[c:c+64], 2, cz)
					}
					want := make([]float32, hd)
					codeAccumQ8Go(want, p, params, codes, 2, rb)
					for c := range acc {
						if d := math.Abs(float64(acc[c] - want[c])); d > 1e-4*(1+math.Abs(float64(want[c]))) {
							t.Fatalf("nc%d pad%d n16 %d: acc[%d] = %g, Go %g", nc, pad, n16, c, acc[c], want[c])
						}
					}
				})
			}
		}
	}
}
