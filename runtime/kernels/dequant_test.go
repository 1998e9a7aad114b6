package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// DequantU4 (AVX2 and Go) equals the float64 formula for integer
// zero-points and float16-representable scales, every length and offset.
func TestDequantU4(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, n := range []int{0, 2, 14, 16, 18, 32, 46, 64, 250, 1024} {
		src := make([]byte, n/2+3)
		for i := range src {
			src[i] = byte(rng.IntN(256))
		}
		scale := float32(rng.IntN(2048)+1) / 4096 // 11 significant bits
		zero := float32(rng.IntN(16))
		for _, asm := range []bool{false, true} {
			if asm && !hasAsm {
				continue
			}
			useAsm = asm
			dst := make([]float32, n+1)
			dst[n] = 7
			DequantU4(dst[:n], src, scale, zero)
			useAsm = hasAsm
			for j := 0; j < n; j++ {
				c := src[j/2] >> (4 * uint(j%2)) & 15
				want := float32(float64(scale) * (float64(c) - float64(zero)))
				if dst[j] != want {
					t.Fatalf("n %d asm %v: dst[%d] = %v, want %v (code %d)", n, asm, j, dst[j], want, c)
				}
			}
			if dst[n] != 7 {
				t.Fatalf("n %d asm %v: wrote past len(dst)", n, asm)
			}
		}
	}
}

func TestF16ToF32(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		got, want := f16ToF32(uint16(h)), safetensors.F16ToFloat32(uint16(h))
		if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
			t.Fatalf("f16 %#04x: %v, want %v", h, got, want)
		}
	}
}

// DequantU4Row (AVX2+F16C row loop and the per-group fallback) equals the
// float64 formula with float16 scales (normal and subnormal) and integer
// or implicit zero-points.
func TestDequantU4Row(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, c := range []struct{ n, group int }{{16, 16}, {64, 32}, {1024, 32}, {256, 64}, {96, 96}, {12, 6}, {40, 2}, {48, 48}} {
		src := make([]byte, c.n/2)
		for i := range src {
			src[i] = byte(rng.IntN(256))
		}
		ng := c.n / c.group
		scales, zeros := make([]uint16, ng), make([]uint16, ng)
		for g := range scales {
			scales[g] = uint16(1 + rng.IntN(0x7bff)) // positive, finite, some subnormal
			zeros[g] = safetensors.F16FromFloat32(float32(rng.IntN(16)))
		}
		for _, sym := range []bool{false, true} {
			zs := zeros
			if sym {
				zs = nil
			}
			for _, asm := range []bool{false, true} {
				if asm && !hasAsm {
					continue
				}
				useAsm = asm
				dst := make([]float32, c.n)
				DequantU4Row(dst, src, scales, zs, c.group, 8)
				useAsm = hasAsm
				for j := range dst {
					g := j / c.group
					z := 8.0
					if !sym {
						z = float64(safetensors.F16ToFloat32(zeros[g]))
					}
					code := src[j/2] >> (4 * uint(j%2)) & 15
					want := float32(float64(safetensors.F16ToFloat32(scales[g])) * (float64(code) - z))
					if dst[j] != want {
						t.Fatalf("n %d group %d sym %v asm %v: dst[%d] = %v, want %v", c.n, c.group, sym, asm, j, dst[j], want)
					}
				}
			}
		}
	}
}

// DequantBitsRow (AVX2+F16C, with and without room to read past the row,
// and Go) equals the float64 formula for 1-4 bits.
func TestDequantBitsRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, bits := range []int{1, 2, 3, 4} {
		for _, c := range []struct{ n, group int }{{8, 8}, {64, 32}, {1024, 64}, {96, 96}, {24, 24}, {12, 6}, {30, 10}} {
			need := (c.n*bits + 7) / 8
			buf := make([]byte, need+3)
			for i := range buf {
				buf[i] = byte(rng.IntN(256))
			}
			ng := c.n / c.group
			scales, zeros := make([]uint16, ng), make([]uint16, ng)
			for g := range scales {
				scales[g] = uint16(1 + rng.IntN(0x7bff))
				zeros[g] = safetensors.F16FromFloat32(float32(rng.IntN(1 << bits)))
			}
			for _, sym := range []bool{false, true} {
				zs := zeros
				if sym {
					zs = nil
				}
				for _, variant := range []string{"go", "asm", "asm-tight"} {
					if variant != "go" && !hasAsm {
						continue
					}
					useAsm = variant != "go"
					src := buf[:need]
					if variant == "asm-tight" {
						src = buf[:need:need]
					}
					dst := make([]float32, c.n)
					zsym := float32(int(1) << uint(bits-1))
					DequantBitsRow(dst, src, bits, scales, zs, c.group, zsym)
					useAsm = hasAsm
					for j := range dst {
						g := j / c.group
						z := float64(zsym)
						if !sym {
							z = float64(safetensors.F16ToFloat32(zeros[g]))
						}
						p := j * bits
						code := (uint(buf[p/8]) | uint(buf[p/8+1])<<8) >> uint(p%8) & (1<<uint(bits) - 1)
						want := float32(float64(safetensors.F16ToFloat32(scales[g])) * (float64(code) - z))
						if dst[j] != want {
							t.Fatalf("bits %d n %d group %d sym %v %s: dst[%d] = %v, want %v", bits, c.n, c.group, sym, variant, j, dst[j], want)
						}
					}
				}
			}
		}
	}
}
