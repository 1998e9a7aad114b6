package weights

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestF16KnownValues(t *testing.T) {
	cases := []struct {
		x float64
		h uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {0x1p-24, 0x0001}, {0x1p-14, 0x0400},
		{0.1, 0x2e66}, {1.0 / 3, 0x3555}, {65520, 0x7c00}, {0, 0}, {1 + 0x1p-11, 0x3c00}, // tie → even
		{1 + 3*0x1p-11, 0x3c02}, // tie → even (up)
	}
	for _, c := range cases {
		if got := f16FromFloat(c.x); got != c.h {
			t.Errorf("f16FromFloat(%g) = %#04x, want %#04x", c.x, got, c.h)
		}
	}
	// Every finite binary16 value round-trips, and RoundUp gives the
	// smallest value ≥ x (checked against the neighbouring patterns).
	for h := uint16(0); h < 0x7c00; h++ {
		v := f16ToFloat(h)
		if got := f16FromFloat(v); got != h {
			t.Fatalf("round trip %#04x → %g → %#04x", h, v, got)
		}
		if h > 0 {
			mid := (v + f16ToFloat(h-1)) / 2
			if got := f16RoundUp(mid); got != h {
				t.Fatalf("f16RoundUp(%g) = %#04x, want %#04x", mid, got, h)
			}
		}
	}
}

// bitRef packs codes by building the bit stream one bit at a time.
func bitRef(codes []uint8, bits int) []byte {
	var stream []bool
	for _, c := range codes {
		for k := 0; k < bits; k++ {
			stream = append(stream, c>>uint(k)&1 == 1)
		}
	}
	out := make([]byte, (len(stream)+7)/8)
	for k, b := range stream {
		if b {
			out[k/8] |= 1 << uint(k%8)
		}
	}
	return out
}

func TestPackUnpackExhaustive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, bits := range []int{1, 2, 3, 4, 8} {
		nv := 1 << uint(bits)
		for cols := 1; cols <= 3*nv+5; cols++ {
			for trial := 0; trial < 4; trial++ {
				codes := make([]uint8, cols)
				for j := range codes {
					if trial == 0 {
						codes[j] = uint8((j + cols) % nv) // every value at every position mod nv
					} else {
						codes[j] = uint8(rng.IntN(nv))
					}
				}
				dst := make([]byte, RowBytes(cols, bits))
				for i := range dst {
					dst[i] = 0xff // PackRow must clear stale bits
				}
				PackRow(dst, codes, bits)
				want := bitRef(codes, bits)
				if string(dst) != string(want) {
					t.Fatalf("bits %d cols %d: packed %x, want %x", bits, cols, dst, want)
				}
				got := make([]uint8, cols)
				UnpackRow(got, dst, bits)
				for j := range codes {
					if got[j] != codes[j] {
						t.Fatalf("bits %d cols %d: code %d = %d, want %d", bits, cols, j, got[j], codes[j])
					}
				}
			}
		}
	}
	// Hand-checked 3-bit layout: codes 1..8 mod 8 = 1,2,3,4,5,6,7,0.
	// Stream (LSB first): 100 010 110 001 101 011 111 000
	// Bits 0–7 = 1,0,0,0,1,0,1,1 → 0xd1; 8–15 = 0,0,0,1,1,0,1,0 → 0x58;
	// 16–23 = 1,1,1,1,1,0,0,0 → 0x1f.
	dst := make([]byte, 3)
	PackRow(dst, []uint8{1, 2, 3, 4, 5, 6, 7, 0}, 3)
	if dst[0] != 0xd1 || dst[1] != 0x58 || dst[2] != 0x1f {
		t.Errorf("3-bit layout %x, want d1581f", dst)
	}
}

func randMatrix(rng *rand.Rand, rows, cols int) []float32 {
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * 0.05)
	}
	return w
}

// checkBound asserts |w − ŵ| ≤ s/2 per element with the stored scale, and
// that Dequantize agrees with an independent decode of codes/scales/zeros.
func checkBound(t *testing.T, name string, w []float32, q *Quantized) {
	t.Helper()
	deq := make([]float32, q.Rows*q.Cols)
	q.Dequantize(deq)
	ng := q.Cols / q.GroupSize
	rb := RowBytes(q.Cols, q.Bits)
	codes := make([]uint8, q.Cols)
	for r := 0; r < q.Rows; r++ {
		UnpackRow(codes, q.Codes[r*rb:(r+1)*rb], q.Bits)
		for c := 0; c < q.Cols; c++ {
			g := c / q.GroupSize
			s := f16ToFloat(q.Scales[r*ng+g])
			z := math.Exp2(float64(q.Bits - 1))
			if !q.Symmetric {
				z = f16ToFloat(q.Zeros[r*ng+g])
				if z != math.Trunc(z) || z < 0 || z > math.Exp2(float64(q.Bits))-1 {
					t.Fatalf("%s: zero %g not an integer code", name, z)
				}
			}
			ref := float32(s * (float64(codes[c]) - z))
			if deq[r*q.Cols+c] != ref {
				t.Fatalf("%s: Dequantize [%d,%d] = %g, decode %g", name, r, c, deq[r*q.Cols+c], ref)
			}
			if d := math.Abs(float64(w[r*q.Cols+c]) - float64(ref)); d > s/2*(1+1e-6) {
				t.Fatalf("%s: [%d,%d] |w−ŵ| = %g > scale/2 = %g", name, r, c, d, s/2)
			}
		}
	}
}

func TestRTNRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	rows, cols := 16, 256
	w := randMatrix(rng, rows, cols)
	w[5] = 0.9 // an outlier
	for i := 0; i < 64; i++ {
		w[3*cols+i] = 0.02 + float32(i)*1e-3 // an all-positive group
		w[4*cols+i] = 0                      // an all-zero group
	}
	for _, bits := range []int{2, 3, 4, 8} {
		for _, g := range []int{0, 32, 64, 128} {
			for _, sym := range []bool{false, true} {
				q, err := QuantizeRTN(w, rows, cols, Options{Bits: bits, GroupSize: g, Symmetric: sym})
				if err != nil {
					t.Fatal(err)
				}
				name := strings.Join([]string{"b", string(rune('0' + bits)), "g", itoa(g), "sym", itoa(b2i(sym))}, "")
				checkBound(t, name, w, q)
			}
		}
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	s := ""
	for ; i > 0; i /= 10 {
		s = string(rune('0'+i%10)) + s
	}
	return s
}
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestBitsPerWeight(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	cases := []struct {
		rows, cols, bits, g int
		sym                 bool
		want                float64
	}{
		{8, 256, 4, 128, false, 4 + 32.0/128},
		{8, 256, 4, 128, true, 4 + 16.0/128},
		{8, 256, 2, 32, false, 2 + 32.0/32},
		{8, 256, 8, 64, false, 8 + 32.0/64},
		{4, 100, 3, 0, false, (38*8 + 32) / 100.0}, // ceil(300/8)=38 bytes per row
		{4, 96, 3, 32, true, 3 + 16.0/32},
	}
	for _, c := range cases {
		q, err := QuantizeRTN(randMatrix(rng, c.rows, c.cols), c.rows, c.cols, Options{Bits: c.bits, GroupSize: c.g, Symmetric: c.sym})
		if err != nil {
			t.Fatal(err)
		}
		if got := q.BitsPerWeight(); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%+v: bpw %g, want %g", c, got, c.want)
		}
		if got, want := q.Bytes(), int64(math.Round(c.want*float64(c.rows*c.cols)/8)); got != want {
			t.Errorf("%+v: bytes %d, want %d", c, got, want)
		}
	}
}

func TestErrors(t *testing.T) {
	w := make([]float32, 4*64)
	cases := []struct {
		w          []float32
		rows, cols int
		opt        Options
		want       error
		msg        string
	}{
		{w, 4, 64, Options{Bits: 5}, ErrOptions, "bits 5"},
		{w, 4, 64, Options{Bits: 4, GroupSize: 48}, ErrOptions, "group size 48"},
		{w, 2, 128, Options{Bits: 4, GroupSize: 128}, nil, ""},
		{w, 4, 64, Options{Bits: 4, GroupSize: 128}, ErrOptions, "cols 64 not divisible by group size 128"},
		{w[:10], 4, 64, Options{Bits: 4}, ErrShape, "10 elements"},
	}
	nan := append([]float32(nil), w...)
	nan[2*64+7] = float32(math.NaN())
	inf := append([]float32(nil), w...)
	inf[65] = float32(math.Inf(-1))
	big := append([]float32(nil), w...)
	big[0] = 3e38
	cases = append(cases,
		struct {
			w          []float32
			rows, cols int
			opt        Options
			want       error
			msg        string
		}{nan, 4, 64, Options{Bits: 4}, ErrNonFinite, "weight [2, 7] is NaN"},
		struct {
			w          []float32
			rows, cols int
			opt        Options
			want       error
			msg        string
		}{inf, 4, 64, Options{Bits: 4}, ErrNonFinite, "weight [1, 1] is -Inf"},
		struct {
			w          []float32
			rows, cols int
			opt        Options
			want       error
			msg        string
		}{big, 4, 64, Options{Bits: 4}, ErrRange, "row 0 group 0"},
	)
	for _, c := range cases {
		_, err := QuantizeRTN(c.w, c.rows, c.cols, c.opt)
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: unexpected %v", c.msg, err)
			}
			continue
		}
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("got %v, want %v containing %q", err, c.want, c.msg)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "weights: ") {
			t.Errorf("error %q lacks package prefix", err)
		}
	}
}

// TestRTN1Bit: the 1-bit grid stores two levels per group, the nearer of
// which every weight takes; each group's squared error is at most its
// variance about the mean (the error of the best single level) plus the
// float16 rounding of the scale and zero-point, and with a symmetric grid
// it is refused.
func TestRTN1Bit(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	rows, cols := 8, 256
	w := randMatrix(rng, rows, cols)
	for i := 0; i < 32; i++ {
		w[2*cols+i] = 0.25 // a constant group
		w[3*cols+i] = 3 + float32(i)*1e-3
	}
	for _, g := range []int{0, 32, 64, 128} {
		q, err := QuantizeRTN(w, rows, cols, Options{Bits: 1, GroupSize: g})
		if err != nil {
			t.Fatal(err)
		}
		if len(q.Codes) != rows*cols/8 || q.BitsPerWeight() != 1+32/float64(q.GroupSize) {
			t.Fatalf("g%d: %d code bytes, %.4f bpw", g, len(q.Codes), q.BitsPerWeight())
		}
		dq := make([]float32, rows*cols)
		q.Dequantize(dq)
		G := q.GroupSize
		for r := 0; r < rows; r++ {
			for g0 := 0; g0 < cols; g0 += G {
				seg, got := w[r*cols+g0:r*cols+g0+G], dq[r*cols+g0:r*cols+g0+G]
				var mu, v, e, amax float64
				for _, x := range seg {
					mu += float64(x)
					amax = math.Max(amax, math.Abs(float64(x)))
				}
				mu /= float64(G)
				levels := map[float32]bool{}
				for j, x := range seg {
					v += (float64(x) - mu) * (float64(x) - mu)
					d := float64(x) - float64(got[j])
					e += d * d
					levels[got[j]] = true
				}
				// fp16 rounding of s and z: about 2^-10 relative to the levels.
				tol := float64(G) * math.Pow(amax*2e-3, 2) * 4
				if len(levels) > 2 || e > v+tol+1e-12 {
					t.Fatalf("g%d row %d group %d: %d levels, squared error %g > variance %g + %g", g, r, g0/G, len(levels), e, v, tol)
				}
				// Every weight takes the nearer of the stored levels.
				for j, x := range seg {
					for l := range levels {
						if math.Abs(float64(x)-float64(l)) < math.Abs(float64(x)-float64(got[j]))-1e-6 {
							t.Fatalf("g%d row %d col %d: %v went to %v, level %v is nearer", g, r, g0+j, x, got[j], l)
						}
					}
				}
			}
		}
		if g == 32 && dq[2*cols] != 0.25 {
			t.Fatalf("constant group: %v, want 0.25", dq[2*cols])
		}
	}
	if _, err := QuantizeRTN(w, rows, cols, Options{Bits: 1, Symmetric: true}); !errors.Is(err, ErrOptions) {
		t.Fatalf("symmetric 1 bit: err %v, want ErrOptions", err)
	}
}

// TestGPTQ1Bit: GPTQ with the 1-bit grid has a lower output error
// tr(ΔW H ΔWᵀ) than 1-bit RTN on correlated inputs.
func TestGPTQ1Bit(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	rows, cols, n := 16, 64, 512
	w := randMatrix(rng, rows, cols)
	x := make([]float32, n*cols)
	for i := 0; i < n; i++ {
		base := rng.NormFloat64()
		for j := 0; j < cols; j++ {
			x[i*cols+j] = float32(base + 0.3*rng.NormFloat64())
		}
	}
	h := NewHessian(cols)
	if err := h.Add(x, n); err != nil {
		t.Fatal(err)
	}
	outErr := func(q *Quantized) float64 {
		dq := make([]float32, rows*cols)
		q.Dequantize(dq)
		var s float64
		for i := 0; i < n; i++ {
			for r := 0; r < rows; r++ {
				var d float64
				for j := 0; j < cols; j++ {
					d += float64(w[r*cols+j]-dq[r*cols+j]) * float64(x[i*cols+j])
				}
				s += d * d
			}
		}
		return s / float64(n)
	}
	for _, g := range []int{0, 32} {
		qr, err := QuantizeRTN(w, rows, cols, Options{Bits: 1, GroupSize: g})
		if err != nil {
			t.Fatal(err)
		}
		qg, err := QuantizeGPTQ(w, rows, cols, h, GPTQOptions{Options: Options{Bits: 1, GroupSize: g}})
		if err != nil {
			t.Fatal(err)
		}
		er, eg := outErr(qr), outErr(qg)
		t.Logf("1 bit g%d: output error RTN %.4g, GPTQ %.4g", g, er, eg)
		if !(eg < er) {
			t.Fatalf("1 bit g%d: GPTQ error %g not below RTN %g", g, eg, er)
		}
	}
}

// TestMSEClip: the clipped grid's squared error is, group by group, at
// most the min-max grid's (the full range is one of the candidates), and
// on heavy-tailed rows at 2 bits it is clearly lower; at 1 bit it changes
// nothing. GPTQ accepts it.
func TestMSEClip(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	rows, cols := 16, 128
	w := make([]float32, rows*cols)
	for i := range w {
		// Student-t-like: a normal divided by a random scale.
		w[i] = float32(rng.NormFloat64() / math.Sqrt(0.2+rng.ExpFloat64()))
	}
	for _, bits := range []int{1, 2, 3, 4, 8} {
		for _, g := range []int{0, 32} {
			for _, sym := range []bool{false, true} {
				if bits == 1 && sym {
					continue
				}
				groupErr := func(clip bool) ([]float64, float64) {
					q, err := QuantizeRTN(w, rows, cols, Options{Bits: bits, GroupSize: g, Symmetric: sym, MSEClip: clip})
					if err != nil {
						t.Fatal(err)
					}
					dq := make([]float32, rows*cols)
					q.Dequantize(dq)
					G := q.GroupSize
					ge := make([]float64, rows*cols/G)
					var tot float64
					for i := range dq {
						d := float64(dq[i] - w[i])
						ge[i/G] += d * d
						tot += d * d
					}
					return ge, tot
				}
				plain, pt := groupErr(false)
				clip, ct := groupErr(true)
				for k := range plain {
					if clip[k] > plain[k]*(1+1e-6)+1e-12 {
						t.Fatalf("%d bits g%d sym %v group %d: clipped error %g > min-max %g", bits, g, sym, k, clip[k], plain[k])
					}
				}
				if bits == 1 && ct != pt {
					t.Errorf("1 bit g%d: clipping changed the error %g -> %g", g, pt, ct)
				}
				if bits == 2 && !(ct < 0.8*pt) {
					t.Errorf("2 bits g%d sym %v: clipped error %g not clearly below min-max %g", g, sym, ct, pt)
				}
				if g == 0 && !sym {
					t.Logf("%d bits per channel: squared error min-max %.4g, clipped %.4g", bits, pt, ct)
				}
			}
		}
	}
	h := NewHessian(cols)
	x := make([]float32, 64*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	if err := h.Add(x, 64); err != nil {
		t.Fatal(err)
	}
	if _, err := QuantizeGPTQ(w, rows, cols, h, GPTQOptions{Options: Options{Bits: 2, GroupSize: 32, MSEClip: true}}); err != nil {
		t.Fatal(err)
	}
}
