package kvcache

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/quantize/kvq"
)

// Tests of the serving-engine kinds (store_turbo.go, store_vllm.go,
// store_ggml.go): per-row error bounds derived from each format, bytes
// against the engines' formulas, and the layer rules.

// ggmlTestLayers are testLayers' counterpart for kinds that need head_dim
// a multiple of 32 (llama.cpp's q8_0/q4_0): head_dim 64 (K and V rotated
// by 64), 32 (no rotation) and 128 (K rotated by 128, V by 64).
var ggmlTestLayers = []Layer{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 1, HeadDim: 32}, {NumKVHeads: 2, HeadDim: 128}}

// layersFor returns testLayers, or ggmlTestLayers for a method that
// refuses testLayers' head_dims.
func layersFor(name string) []Layer {
	if _, err := New(name, testLayers, 1, Options{Rotations: hadamardRotations(testLayers, 0, 0)}); errors.Is(err, ErrBadShape) {
		return ggmlTestLayers
	}
	return testLayers
}

var newKinds = []string{"turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
	"turboquant_k8v4-all", "turboquant_4bit_nc-all", "turboquant_k3v4_nc-all", "turboquant_3bit_nc-all",
	"fp8", "int4_per_token_head", "q8_0", "q4_0"}

// randRow returns d Gaussian values times scale, with one outlier of
// 8·scale at a random channel.
func randRow(rng *rand.Rand, d int, scale float64) []float32 {
	x := make([]float32, d)
	for i := range x {
		x[i] = float32(scale * rng.NormFloat64())
	}
	x[rng.IntN(d)] = float32(8 * scale)
	return x
}

// q8_0: x̂ = q·d̂ with q = round(x/d), d = max|x|/127, so |x − x̂| ≤ d/2 +
// |q|·|d − d̂| (d̂ the binary16 of d; plus float32 rounding of x/d).
func TestQ8_0BlockBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 80))
	buf, got := make([]byte, 34), make([]float32, 32)
	for it := 0; it < 2000; it++ {
		x := randRow(rng, 32, math.Exp2(float64(rng.IntN(20)-10)))
		encodeQ8_0(buf, x)
		decodeQ8_0(got, buf)
		d := float64(kvq.AbsMax(x)) / 127
		dh := float64(kvq.RoundF16(float32(d)))
		if g := float64(getF16(buf)); g != dh {
			t.Fatalf("stored scale %v, want binary16(max|x|/127) = %v", g, dh)
		}
		for j, v := range x {
			q := math.Round(float64(v) / d)
			bound := d/2 + math.Abs(q)*math.Abs(d-dh) + 1e-6*math.Abs(float64(v))
			if e := math.Abs(float64(got[j] - v)); e > bound {
				t.Fatalf("block %d element %d: |x−x̂| = %g > %g", it, j, e, bound)
			}
		}
	}
}

// q4_0: d = m/−8 with m the value of largest magnitude, q = min(15,
// ⌊x/d + 8.5⌋), x̂ = (q−8)·d̂: |x − x̂| ≤ |d|/2 + 8|d − d̂| where x/d ≤ 7.5,
// and ≤ |d| + 8|d − d̂| at the clipped end (x/d ∈ (7.5, 8]: x = −m is
// read as −7m/8). The largest-magnitude value is exact up to d̂.
func TestQ4_0BlockBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 40))
	buf, got := make([]byte, 18), make([]float32, 32)
	var clipped int
	for it := 0; it < 2000; it++ {
		x := randRow(rng, 32, math.Exp2(float64(rng.IntN(20)-10)))
		if it%2 == 1 {
			for j := range x {
				x[j] = -x[j]
			}
		}
		if it%3 == 0 { // a value of −m: the clipped end of the grid
			x[rng.IntN(32)] = -kvq.AbsMax(x) * float32(1-1e-6*float64(it%2))
		}
		encodeQ4_0(buf, x)
		decodeQ4_0(got, buf)
		var m float32
		for _, v := range x {
			if math.Abs(float64(v)) > math.Abs(float64(m)) {
				m = v
			}
		}
		d := float64(m) / -8
		dh := float64(getF16(buf))
		for j, v := range x {
			r := float64(v) / d
			bound := math.Abs(d)/2 + 8*math.Abs(d-dh) + 1e-6*math.Abs(float64(v))
			if r > 7.5 {
				bound += math.Abs(d) / 2
				clipped++
			}
			if e := math.Abs(float64(got[j] - v)); e > bound {
				t.Fatalf("block %d element %d (x/d = %.3f): |x−x̂| = %g > %g", it, j, r, e, bound)
			}
		}
	}
	t.Logf("%d clipped elements (x/d > 7.5)", clipped)
}

// The llama.cpp rotation sizes: K by the largest power of two ≥ 64
// dividing head_dim, V by 64, none unless 64 | head_dim; the codec
// rotates each run of that many values with the normalized Hadamard
// matrix before encoding and after decoding.
func TestGGMLRotation(t *testing.T) {
	for _, c := range []struct{ d, k, v int }{{32, 0, 0}, {64, 64, 64}, {96, 0, 0}, {128, 128, 64}, {192, 64, 64}, {256, 256, 64}} {
		if ggmlRotK(c.d) != c.k || ggmlRotV(c.d) != c.v {
			t.Errorf("head_dim %d: rotation K %d V %d, want %d %d", c.d, ggmlRotK(c.d), ggmlRotV(c.d), c.k, c.v)
		}
	}
	rng := rand.New(rand.NewPCG(3, 3))
	const d = 128
	x := randRow(rng, d, 1)
	for _, rot := range []int{128, 64} {
		c := &ggmlCodec{bits: 4, hd: d, rot: rot, x: make([]float32, d)}
		buf, got := make([]byte, c.rowBytes()), make([]float32, d)
		c.encode(buf, x)
		c.decode(got, buf)
		// Reference: rotate in float64 by the explicit matrix, encode the
		// blocks, decode, rotate back.
		h := kvq.HadamardMatrix(rot)
		y := make([]float32, d)
		for b := 0; b < d; b += rot {
			for j := 0; j < rot; j++ {
				var s float64
				for i := 0; i < rot; i++ {
					s += float64(x[b+i]) * h[i*rot+j]
				}
				y[b+j] = float32(s)
			}
		}
		yq := make([]float32, d)
		blk := make([]byte, 18)
		for b := 0; b < d; b += 32 {
			encodeQ4_0(blk, y[b:b+32])
			decodeQ4_0(yq[b:b+32], blk)
		}
		for b := 0; b < d; b += rot {
			for j := 0; j < rot; j++ {
				var s float64
				for i := 0; i < rot; i++ {
					s += float64(yq[b+i]) * h[i*rot+j]
				}
				if e := math.Abs(s - float64(got[b+j])); e > 1e-4 {
					t.Fatalf("rot %d element %d: codec %v, explicit rotation %v", rot, b+j, got[b+j], s)
				}
			}
		}
	}
}

// TurboQuant values: s = (max−min)/(2^b−1), code = ⌊(v−min)/s + 0.5⌋,
// v̂ = code·ŝ + min̂: |v − v̂| ≤ s/2 + (2^b−1)|s − ŝ| + |min − min̂|.
func TestTurboValueBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, bits := range []int{3, 4} {
		for _, d := range []int{8, 64, 128} {
			buf, got, codes := make([]byte, (d*bits+7)/8+4), make([]float32, d), make([]uint8, d)
			for it := 0; it < 500; it++ {
				x := randRow(rng, d, math.Exp2(float64(rng.IntN(12)-6)))
				encodeTurboValue(buf, x, bits, codes)
				decodeTurboValue(got, buf, bits, codes)
				lo, hi := kvq.MinMax(x)
				top := float64(int(1)<<bits - 1)
				s := float64(hi-lo) / top
				sh, loh := float64(kvq.RoundF16(float32(s))), float64(kvq.RoundF16(lo))
				bound := s/2 + top*math.Abs(s-sh) + math.Abs(float64(lo)-loh) + 1e-6*float64(hi-lo)
				for j, v := range x {
					if e := math.Abs(float64(got[j] - v)); e > bound {
						t.Fatalf("bits %d d %d row %d element %d: |v−v̂| = %g > %g", bits, d, it, j, e, bound)
					}
				}
			}
		}
	}
}

// The Lloyd–Max codebooks: symmetric, and √d·centroid equal to Max's
// (1960) optimal quantizer for N(0, 1) within 2e-3 (vLLM's trapezoid
// integration over ±10.5σ is not exact); each coordinate's code is the
// nearest centroid.
func TestLloydMaxCodebook(t *testing.T) {
	max3 := []float64{0.2451, 0.7560, 1.3439, 2.1520}
	max4 := []float64{0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326}
	for _, c := range []struct {
		bits int
		ref  []float64
	}{{3, max3}, {4, max4}} {
		for _, d := range []int{8, 64, 128} {
			cb := lloydMaxCodebook(d, c.bits)
			n := len(cb.centroids)
			for i, r := range c.ref {
				hi, lo := float64(cb.centroids[n/2+i]), float64(cb.centroids[n/2-1-i])
				if e := math.Abs(hi*math.Sqrt(float64(d)) - r); e > 2e-3 || math.Abs(hi+lo) > 1e-6 {
					t.Errorf("bits %d d %d: centroid ±%d = %v, %v; want ±%v/√d", c.bits, d, i, lo, hi, r)
				}
			}
			rng := rand.New(rand.NewPCG(5, uint64(d)))
			for it := 0; it < 2000; it++ {
				y := float32(rng.NormFloat64() / math.Sqrt(float64(d)) * 1.5)
				k := cb.code(y)
				for j, cj := range cb.centroids {
					if math.Abs(float64(y-cj)) < math.Abs(float64(y-cb.centroids[k]))-1e-9 {
						t.Fatalf("bits %d d %d: y %v coded %d (%v), centroid %d (%v) is nearer", c.bits, d, y, k, cb.centroids[k], j, cj)
					}
				}
			}
		}
	}
}

// TurboQuant keys: the stored norm is binary16(‖k‖); with norm
// correction the decoded key has exactly that norm; the decoded key is
// n̂·normalize(c)·H (checked against the explicit Hadamard matrix in
// float64); and the per-coordinate error of the rotated unit vector is
// Lloyd–Max's for a Gaussian (MSE 0.03454/d at 3 bits, 0.009497/d at 4
// bits, within 15%) on Gaussian keys.
func TestTurboKey(t *testing.T) {
	want := map[int]float64{3: 0.03454, 4: 0.009497}
	for _, bits := range []int{3, 4} {
		const d = 64
		cb := lloydMaxCodebook(d, bits)
		h := kvq.HadamardMatrix(d)
		rng := rand.New(rand.NewPCG(6, uint64(bits)))
		buf, got := make([]byte, (d*bits+7)/8+2), make([]float32, d)
		y, codes := make([]float32, d), make([]uint8, d)
		var mse float64
		const rows = 3000
		for it := 0; it < rows; it++ {
			x := make([]float32, d)
			for i := range x {
				x[i] = float32(3 * rng.NormFloat64())
			}
			encodeTurboKey(buf, x, bits, cb, y, codes)
			decodeTurboKey(got, buf, bits, true, cb, codes)
			var n2, g2 float64
			for i := range x {
				n2 += float64(x[i]) * float64(x[i])
				g2 += float64(got[i]) * float64(got[i])
			}
			nh := float64(getF16(buf[(d*bits+7)/8:]))
			if nh != float64(kvq.RoundF16(float32(math.Sqrt(n2)))) {
				t.Fatalf("stored norm %v, want binary16 of %v", nh, math.Sqrt(n2))
			}
			if math.Abs(math.Sqrt(g2)-nh) > 1e-5*nh {
				t.Fatalf("norm-corrected key has norm %v, want %v", math.Sqrt(g2), nh)
			}
			unpackBits(codes, buf, bits)
			var cn float64
			for _, k := range codes {
				cn += float64(cb.centroids[k]) * float64(cb.centroids[k])
			}
			for j := 0; j < d; j++ {
				var s float64
				for i := 0; i < d; i++ {
					s += float64(cb.centroids[codes[i]]) * h[i*d+j]
				}
				s *= nh / math.Sqrt(cn)
				if math.Abs(s-float64(got[j])) > 1e-4*nh {
					t.Fatalf("element %d: decoded %v, n̂·normalize(c)·H = %v", j, got[j], s)
				}
			}
			// Rotated unit vector against its centroids.
			yr := make([]float64, d)
			for j := 0; j < d; j++ {
				for i := 0; i < d; i++ {
					yr[j] += float64(x[i]) / math.Sqrt(n2) * h[i*d+j]
				}
				e := yr[j] - float64(cb.centroids[codes[j]])
				mse += e * e
			}
		}
		mse = mse / rows // Σ over d coordinates of E[e²] = d·(D/d) = D
		t.Logf("%d-bit keys: rotated unit-vector MSE·d/d = %.5f (Lloyd–Max %.5f)", bits, mse, want[bits])
		if math.Abs(mse/want[bits]-1) > 0.15 {
			t.Errorf("%d-bit keys: distortion %.5f, want Lloyd–Max's %.5f within 15%%", bits, mse, want[bits])
		}
	}
}

// int4_per_token_head in the rotated space: grid (q − zp)·s̃ with s =
// (max−min)/15, zp = round(−min/s) clamped to [0, 15]: |y − ŷ| ≤ s/2 +
// 15·(s − s̃) + max(0, min) + max(0, −max) (the last two: a row of one
// sign, where the clamped zero point cuts the range); the zero point
// comes back from the scale's low mantissa bits.
func TestInt4PTHBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, d := range []int{8, 64, 128} {
		buf, got := make([]byte, d/2+4), make([]float32, d)
		for it := 0; it < 1000; it++ {
			y := randRow(rng, d, math.Exp2(float64(rng.IntN(12)-6)))
			if it%5 == 0 { // one-sign rows
				for j := range y {
					y[j] = float32(math.Abs(float64(y[j]))) + 0.1
				}
			}
			encodeInt4PTH(buf, y)
			decodeInt4PTH(got, buf)
			lo, hi := kvq.MinMax(y)
			s, zp := int4PTHParams(lo, hi)
			bits := uint32(buf[d/2]) | uint32(buf[d/2+1])<<8 | uint32(buf[d/2+2])<<16 | uint32(buf[d/2+3])<<24
			if float32(bits&15) != zp {
				t.Fatalf("zero point %d, want %v", bits&15, zp)
			}
			st := float64(math.Float32frombits(bits &^ 15))
			bound := float64(s)/2 + 15*(float64(s)-st) + max(0, float64(lo)) + max(0, -float64(hi)) + 1e-6*float64(hi-lo)
			for j := range y {
				if e := math.Abs(float64(got[j] - y[j])); e > bound {
					t.Fatalf("d %d row %d element %d: |y−ŷ| = %g > %g", d, it, j, e, bound)
				}
			}
		}
	}
}

// The codecs' transforms are orthogonal (up to the RHT's √d, undone on
// decode): the ℓ2 error of a decoded row equals the ℓ2 error in the
// transformed space, so the rotated-space bounds above bound it. Checked
// here for int4_per_token_head, whose ‖x − x̂‖ = ‖y − ŷ‖/√d.
func TestInt4PTHRotationIsOrthogonal(t *testing.T) {
	const d = 64
	rng := rand.New(rand.NewPCG(8, 8))
	c := &int4PTHCodec{hd: d, signs: rhtSigns(d), y: make([]float32, d)}
	buf, got, y, yq := make([]byte, c.rowBytes()), make([]float32, d), make([]float32, d), make([]float32, d)
	var plus int
	for _, s := range c.signs {
		if s == 1 {
			plus++
		}
	}
	if plus == 0 || plus == d {
		t.Fatalf("sign vector is constant")
	}
	for it := 0; it < 200; it++ {
		x := randRow(rng, d, 1)
		c.encode(buf, x)
		c.decode(got, buf)
		c.rht(y, x)
		decodeInt4PTH(yq, buf)
		var ex, ey float64
		for i := range x {
			ex += sq(float64(x[i] - got[i]))
			ey += sq(float64(y[i] - yq[i]))
		}
		if math.Abs(math.Sqrt(ex)-math.Sqrt(ey/d)) > 1e-4*math.Sqrt(ey/d)+1e-7 {
			t.Fatalf("row %d: ‖x−x̂‖ = %g, ‖y−ŷ‖/√d = %g", it, math.Sqrt(ex), math.Sqrt(ey/d))
		}
	}
}

func sq(x float64) float64 { return x * x }

// fp8 reads every element back as its nearest FP8 E4M3 value (scale 1):
// |x − x̂| ≤ 2^-4·|x| for normals (half a unit in the last of 3 mantissa
// bits) and ≤ 2^-10 below 2^-6.
func TestFP8Bound(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	c := &fp8Codec{hd: 64, scale: 1}
	buf, got := make([]byte, 64), make([]float32, 64)
	for it := 0; it < 500; it++ {
		x := randRow(rng, 64, math.Exp2(float64(rng.IntN(14)-8)))
		c.encode(buf, x)
		c.decode(got, buf)
		for j, v := range x {
			if got[j] != kvq.F8E4M3ToFloat32(kvq.F8E4M3FromFloat32(v)) {
				t.Fatalf("element %v read %v", v, got[j])
			}
			a := math.Abs(float64(v))
			bound := max(a/16, 1.0/1024)
			if a > 448 {
				bound = a - 448
			}
			if e := math.Abs(float64(got[j] - v)); e > bound {
				t.Fatalf("|x−x̂| = %g > %g at x = %v", e, bound, v)
			}
		}
	}
}

// Bytes against the engines' formulas, per (token, kv head) at head_dim
// d: TurboQuant K ⌈d·b_K/8⌉ + 2 (FP8 keys: d), V ⌈d·b_V/8⌉ + 4, K+V
// rounded up to even (vLLM's slot_size_aligned), boundary layers 2d + 2d;
// fp8 d + d; int4_per_token_head (d/2 + 4)·2; q8_0 34·d/32·2; q4_0
// 18·d/32·2. Five layers (the boundary rule keeps layers 0, 1, 3, 4 in
// fp16) and a sixth case at head_dim 8 where k3v4's slot is padded
// (3 + 2 + 4 + 4 = 13 → 14).
func TestNewKindsBytes(t *testing.T) {
	type preset struct{ kb, vb int }
	turbo := map[string]preset{"turboquant_k8v4": {8, 4}, "turboquant_4bit_nc": {4, 4}, "turboquant_k3v4_nc": {3, 4}, "turboquant_3bit_nc": {3, 3}}
	slot := func(name string, d int) int64 {
		base := strings.TrimSuffix(name, "-all")
		if p, ok := turbo[base]; ok {
			k := (d*p.kb+7)/8 + 2
			if p.kb == 8 {
				k = d
			}
			s := k + (d*p.vb+7)/8 + 4
			return int64(s + s%2)
		}
		switch name {
		case "fp8":
			return int64(2 * d)
		case "int4_per_token_head":
			return int64(2 * (d/2 + 4))
		case "q8_0":
			return int64(2 * 34 * d / 32)
		case "q4_0":
			return int64(2 * 18 * d / 32)
		}
		t.Fatalf("no formula for %s", name)
		return 0
	}
	const n = 100
	for _, layers := range [][]Layer{
		{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 4, HeadDim: 128}, {NumKVHeads: 1, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 32}},
		{{NumKVHeads: 2, HeadDim: 8}, {NumKVHeads: 2, HeadDim: 8}, {NumKVHeads: 2, HeadDim: 8}, {NumKVHeads: 2, HeadDim: 8}, {NumKVHeads: 2, HeadDim: 8}},
	} {
		rng := rand.New(rand.NewPCG(10, 10))
		k, v := tokens(rng, layers, n, nil), tokens(rng, layers, n, nil)
		var sum int
		for _, l := range layers {
			sum += l.NumKVHeads * l.HeadDim
		}
		for _, name := range newKinds {
			c, err := New(name, layers, n, Options{})
			if err != nil {
				if errors.Is(err, ErrBadShape) && layers[0].HeadDim == 8 && (name == "q8_0" || name == "q4_0") {
					continue
				}
				t.Fatalf("%s: %v", name, err)
			}
			writeSteps(c, layers, k, v, 0, n, 30)
			var want int64
			for i, l := range layers {
				if strings.HasPrefix(name, "turboquant") && !strings.HasSuffix(name, "-all") && turboBoundary(i, len(layers)) {
					want += n * int64(l.NumKVHeads) * int64(4*l.HeadDim)
					continue
				}
				want += n * int64(l.NumKVHeads) * slot(name, l.HeadDim)
			}
			if got := c.Bytes(); got != want {
				t.Errorf("%v %s: Bytes %d, want %d", layers, name, got, want)
			}
			bits := c.(Sizer).BitsPerElement()
			if wb := float64(want) * 8 / float64(2*n*sum); math.Abs(bits-wb) > 1e-12 {
				t.Errorf("%s: BitsPerElement %v, want %v", name, bits, wb)
			}
			t.Logf("%v %-24s %8d B  %.4f bits/element", layers[0], name, c.Bytes(), bits)
		}
	}
	// Head_dim 64, every layer quantized: the bits/element of each kind.
	for name, want := range map[string]float64{"turboquant_3bit_nc-all": 3.375, "turboquant_k3v4_nc-all": 3.875,
		"turboquant_4bit_nc-all": 4.375, "turboquant_k8v4-all": 6.25, "fp8": 8, "int4_per_token_head": 4.5, "q8_0": 8.5, "q4_0": 4.5} {
		layers := []Layer{{NumKVHeads: 2, HeadDim: 64}}
		c := mustNew(t, name, layers, 10, Options{})
		rng := rand.New(rand.NewPCG(11, 11))
		writeSteps(c, layers, tokens(rng, layers, 10, nil), tokens(rng, layers, 10, nil), 0, 10, 10)
		if b := c.(Sizer).BitsPerElement(); b != want {
			t.Errorf("%s at head_dim 64: %v bits/element, want %v", name, b, want)
		}
	}
}

// vLLM's boundary rule: n = min(2, ⌊L/2⌋) first and last layers stay
// unquantized (all of a ≤ 4-layer model); those layers read back as the
// binary16 rounding of what was written, the others do not; the -all
// variants quantize every layer.
func TestTurboBoundaryLayers(t *testing.T) {
	for L, want := range map[int]string{1: "", 2: "ss", 3: "sqs", 4: "ssss", 5: "ssqss", 8: "ssqqqqss"} {
		var got string
		for i := 0; i < L; i++ {
			if turboBoundary(i, L) {
				got += "s"
			} else {
				got += "q"
			}
		}
		if L == 1 {
			want = "q"
		}
		if got != want {
			t.Errorf("%d layers: %q, want %q", L, got, want)
		}
	}
	layers := []Layer{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 2, HeadDim: 64}}
	const n = 20
	rng := rand.New(rand.NewPCG(12, 12))
	k, v := tokens(rng, layers, n, nil), tokens(rng, layers, n, nil)
	for _, name := range []string{"turboquant_3bit_nc", "turboquant_3bit_nc-all"} {
		c := mustNew(t, name, layers, n, Options{})
		writeSteps(c, layers, k, v, 0, n, 5)
		for i, l := range layers {
			gk, gv := readAll(c, l, i, n)
			exact := true
			for j := range gk {
				if gk[j] != kvq.RoundF16(k[i][j]) || gv[j] != kvq.RoundF16(v[i][j]) {
					exact = false
				}
			}
			if want := !strings.HasSuffix(name, "-all") && i != 2; exact != want {
				t.Errorf("%s layer %d: binary16-exact %v, want %v", name, i, exact, want)
			}
		}
	}
}

// Through the cache (prefill then decode, sink and recent windows off):
// relative RMS error of K and V on Gaussian tokens within each format's
// band, and above a floor (the kind quantizes).
func TestNewKindsRoundTrip(t *testing.T) {
	layers := []Layer{{NumKVHeads: 2, HeadDim: 64}, {NumKVHeads: 1, HeadDim: 128}, {NumKVHeads: 2, HeadDim: 64}}
	bands := map[string][2]float64{
		"turboquant_k8v4-all": {0.01, 0.1}, "turboquant_4bit_nc-all": {0.03, 0.13},
		"turboquant_k3v4_nc-all": {0.03, 0.22}, "turboquant_3bit_nc-all": {0.1, 0.22},
		"fp8": {0.01, 0.04}, "int4_per_token_head": {0.03, 0.13}, "q8_0": {1e-3, 0.01}, "q4_0": {0.03, 0.15},
	}
	const n = 120
	for name, b := range bands {
		rng := rand.New(rand.NewPCG(13, 13))
		k, v := tokens(rng, layers, n, nil), tokens(rng, layers, n, nil)
		c := mustNew(t, name, layers, n, Options{})
		writeSteps(c, layers, k, v, 0, n, 40)
		var ak, av, gk, gv []float32
		for i, l := range layers {
			rk, rv := readAll(c, l, i, n)
			gk, gv = append(gk, rk...), append(gv, rv...)
			ak, av = append(ak, k[i]...), append(av, v[i]...)
		}
		ek, ev := relErr(gk, ak), relErr(gv, av)
		t.Logf("%-24s relative RMS error K %.4f V %.4f", name, ek, ev)
		for _, e := range []float64{ek, ev} {
			if !(e >= b[0] && e <= b[1]) {
				t.Errorf("%s: relative error %.4g outside [%g, %g]", name, e, b[0], b[1])
			}
		}
	}
}

// Head_dims the engines refuse are refused, naming the layer.
func TestNewKindsRefuseHeadDims(t *testing.T) {
	for _, c := range []struct {
		name string
		l    Layer
	}{{"q8_0", Layer{NumKVHeads: 2, HeadDim: 48}}, {"q4_0", Layer{NumKVHeads: 2, HeadDim: 8}}, {"turboquant_3bit_nc", Layer{NumKVHeads: 2, HeadDim: 96}}, {"turboquant_4bit_nc-all", Layer{NumKVHeads: 2, HeadDim: 4}}, {"int4_per_token_head", Layer{NumKVHeads: 2, HeadDim: 48}}} {
		_, err := New(c.name, []Layer{{NumKVHeads: 2, HeadDim: 64}, c.l}, 8, Options{})
		if !errors.Is(err, ErrBadShape) || !strings.Contains(err.Error(), "layer 1") {
			t.Errorf("%s head_dim %d: err %v, want ErrBadShape naming layer 1", c.name, c.l.HeadDim, err)
		} else {
			t.Log(err)
		}
	}
	if _, err := New("fp8", []Layer{{NumKVHeads: 2, HeadDim: 12}}, 8, Options{}); err != nil {
		t.Errorf("fp8 head_dim 12: %v", err)
	}
}

// packBits/unpackBits round-trip at 3 and 4 bits, and 3-bit codes pack
// eight to three bytes little-endian (vLLM's layout).
func TestPackBits(t *testing.T) {
	codes := []uint8{1, 2, 3, 4, 5, 6, 7, 0}
	buf := make([]byte, 3)
	packBits(buf, codes, 3)
	var w uint32
	for i, c := range codes {
		w |= uint32(c) << (3 * i)
	}
	if buf[0] != uint8(w) || buf[1] != uint8(w>>8) || buf[2] != uint8(w>>16) {
		t.Fatalf("3-bit packing %x, want %06x little-endian", buf, w)
	}
	rng := rand.New(rand.NewPCG(14, 14))
	for _, bits := range []int{3, 4, 8} {
		c := make([]uint8, 64)
		for i := range c {
			c[i] = uint8(rng.IntN(1 << bits))
		}
		p := make([]byte, (64*bits+7)/8)
		packBits(p, c, bits)
		got := make([]uint8, 64)
		unpackBits(got, p, bits)
		for i := range c {
			if got[i] != c[i] {
				t.Fatalf("bits %d: code %d = %d, want %d", bits, i, got[i], c[i])
			}
		}
	}
}

// The cache's fp16 windows apply to the serving-engine kinds as to every
// method: with Sink 3 and Recent 10, the first 3 and the last 10 tokens
// read back as their binary16 rounding, the tokens between them do not.
func TestNewKindsWindows(t *testing.T) {
	const n, sink, recent = 60, 3, 10
	rng := rand.New(rand.NewPCG(15, 15))
	k, v := tokens(rng, ggmlTestLayers, n, nil), tokens(rng, ggmlTestLayers, n, nil)
	for _, name := range []string{"q4_0", "q8_0", "fp8", "int4_per_token_head", "turboquant_3bit_nc-all", "turboquant_k8v4-all"} {
		c := mustNew(t, name, ggmlTestLayers, n, Options{Sink: sink, Recent: recent})
		writeSteps(c, ggmlTestLayers, k, v, 0, n, 25)
		for i, l := range ggmlTestLayers {
			d := l.NumKVHeads * l.HeadDim
			gk, gv := readAll(c, l, i, n)
			for p := 0; p < n; p++ {
				same := true
				for j := p * d; j < (p+1)*d; j++ {
					if gk[j] != kvq.RoundF16(k[i][j]) || gv[j] != kvq.RoundF16(v[i][j]) {
						same = false
					}
				}
				if want := p < sink || p >= n-recent; same != want {
					t.Fatalf("%s layer %d token %d: binary16-exact %v, want %v", name, i, p, same, want)
				}
			}
		}
	}
}
