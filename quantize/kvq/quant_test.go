package kvq

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

var widths = []int{2, 4, 8}

func TestPackLayout(t *testing.T) {
	cases := []struct {
		bits  int
		codes []uint8
		want  []byte
	}{
		{2, []uint8{1, 2, 3, 0}, []byte{0b00_11_10_01}},
		{2, []uint8{3, 0, 0, 0, 2}, []byte{0x03, 0x02}},
		{4, []uint8{0xa, 0x5, 0xf}, []byte{0x5a, 0x0f}},
		{8, []uint8{7, 200}, []byte{7, 200}},
	}
	for _, c := range cases {
		got := make([]byte, PackedLen(len(c.codes), c.bits))
		Pack(got, c.codes, c.bits)
		if !slices.Equal(got, c.want) {
			t.Errorf("Pack(%v, %d) = %08b, want %08b", c.codes, c.bits, got, c.want)
		}
	}
}

// Every byte value unpacks to codes that pack back to it, and every code
// sequence of one byte's worth round-trips; lengths 1..9 with random codes
// round-trip too.
func TestPackUnpackExhaustive(t *testing.T) {
	for _, bits := range widths {
		per := 8 / bits
		for v := 0; v < 256; v++ {
			codes := make([]uint8, per)
			Unpack(codes, []byte{byte(v)}, bits)
			for i, c := range codes {
				if want := uint8(v>>(i*bits)) & (1<<bits - 1); c != want {
					t.Fatalf("bits=%d byte %#x code %d = %d, want %d", bits, v, i, c, want)
				}
			}
			out := []byte{0}
			Pack(out, codes, bits)
			if out[0] != byte(v) {
				t.Fatalf("bits=%d: pack(unpack(%#x)) = %#x", bits, v, out[0])
			}
		}
		rng := rand.New(rand.NewPCG(uint64(bits), 1))
		for n := 1; n <= 9; n++ {
			codes := make([]uint8, n)
			for i := range codes {
				codes[i] = uint8(rng.IntN(1 << bits))
			}
			p := make([]byte, PackedLen(n, bits))
			Pack(p, codes, bits)
			back := make([]uint8, n)
			Unpack(back, p, bits)
			if !slices.Equal(back, codes) {
				t.Fatalf("bits=%d n=%d: %v → %v", bits, n, codes, back)
			}
		}
	}
	mustPanic(t, "Pack bits=3", func() { Pack(make([]byte, 4), make([]uint8, 4), 3) })
	mustPanic(t, "Pack short", func() { Pack(make([]byte, 1), make([]uint8, 5), 2) })
	mustPanic(t, "Unpack short", func() { Unpack(make([]uint8, 3), make([]byte, 1), 4) })
}

// randRow returns n values: Gaussian with the given spread and offset,
// with a few large outliers.
func randRow(rng *rand.Rand, n int, spread, offset float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(offset + spread*rng.NormFloat64())
	}
	if n > 4 {
		x[rng.IntN(n)] *= 8
	}
	return x
}

// refDecodeAsym dequantizes through Unpack and the formula (independent of
// DecodeAsym's lookup table).
func refDecodeAsym(codes []byte, n, bits int, scale, zero float32) []float32 {
	c := make([]uint8, n)
	Unpack(c, codes, bits)
	out := make([]float32, n)
	for i := range c {
		out[i] = (float32(c[i]) - zero) * scale
	}
	return out
}

func TestAsymRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, bits := range widths {
		qmax := uint8(1<<bits - 1)
		for _, n := range []int{1, 3, 8, 13, 64, 128} {
			for trial := 0; trial < 20; trial++ {
				x := randRow(rng, n, 1+rng.Float64()*5, rng.NormFloat64()*3)
				codes := make([]byte, PackedLen(n, bits))
				scale, zero := QuantizeAsym(codes, x, bits)
				got := make([]float32, n)
				DecodeAsym(got, codes, bits, scale, zero)
				ref := refDecodeAsym(codes, n, bits, scale, zero)
				lo, hi := MinMax(x)
				if n > 1 && hi > lo {
					if want := (hi - lo) / float32(qmax); math.Abs(float64(scale-want)) > 1e-6*float64(want) {
						t.Fatalf("bits=%d scale %v, want (max−min)/%d = %v", bits, scale, qmax, want)
					}
				}
				c := make([]uint8, n)
				Unpack(c, codes, bits)
				for i := range x {
					if math.Abs(float64(got[i]-ref[i])) > 1e-6*(1+math.Abs(float64(ref[i]))) {
						t.Fatalf("DecodeAsym[%d]=%v, formula %v", i, got[i], ref[i])
					}
					bound := float64(scale)/2 + 1e-6*(1+math.Abs(float64(x[i])))
					if e := math.Abs(float64(x[i] - got[i])); e > bound {
						t.Fatalf("bits=%d n=%d: |x−x̂|=%g at %d > scale/2=%g", bits, n, e, i, bound)
					}
					if x[i] == lo && c[i] != 0 && hi > lo {
						t.Fatalf("bits=%d: min got code %d, want 0", bits, c[i])
					}
					if x[i] == hi && c[i] != qmax && hi > lo {
						t.Fatalf("bits=%d: max got code %d, want %d", bits, c[i], qmax)
					}
				}
			}
		}
	}
}

func TestAsymConstantRows(t *testing.T) {
	for _, bits := range widths {
		for _, v := range []float32{0, 1, -1, 3.75, -1e-3, 1000} {
			x := []float32{v, v, v, v, v}
			codes := make([]byte, PackedLen(len(x), bits))
			s, z := QuantizeAsym(codes, x, bits)
			got := make([]float32, len(x))
			DecodeAsym(got, codes, bits, s, z)
			for i := range got {
				if got[i] != v {
					t.Fatalf("bits=%d constant %v decoded %v (scale %v zero %v)", bits, v, got[i], s, z)
				}
			}
			s16, z16 := AsymParamsF16(v, v, bits)
			EncodeAsym(codes, x, bits, s16, z16)
			DecodeAsym(got, codes, bits, s16, z16)
			for i := range got {
				if e := math.Abs(float64(got[i] - v)); e > math.Abs(float64(v))/2048+float64(s16)/2 {
					t.Fatalf("bits=%d f16 constant %v decoded %v", bits, v, got[i])
				}
			}
		}
	}
}

func TestAsymParamsF16(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	type rowCase struct {
		name           string
		spread, offset float64
	}
	cases := []rowCase{
		{"unit", 1, 0}, {"offset", 1, 20}, {"narrow band far from zero", 1e-4, 5},
		{"tiny", 1e-6, 0}, {"large", 300, -1000}, {"negative band", 0.01, -40},
	}
	for _, bits := range widths {
		for _, c := range cases {
			for trial := 0; trial < 10; trial++ {
				x := randRow(rng, 64, c.spread, c.offset)
				lo, hi := MinMax(x)
				s, z := AsymParamsF16(lo, hi, bits)
				if RoundF16(s) != s || RoundF16(z) != z {
					t.Fatalf("%s: params %v %v not binary16 values", c.name, s, z)
				}
				if !(s > 0) || math.IsInf(float64(z), 0) || math.IsNaN(float64(z)) {
					t.Fatalf("%s: bad params %v %v", c.name, s, z)
				}
				codes := make([]byte, PackedLen(len(x), bits))
				EncodeAsym(codes, x, bits, s, z)
				got := make([]float32, len(x))
				DecodeAsym(got, codes, bits, s, z)
				bound := float64(s)/2 + math.Abs(float64(lo))/2048 + 1e-6*(1+math.Abs(float64(lo))+math.Abs(float64(hi)))
				for i := range x {
					if e := math.Abs(float64(x[i] - got[i])); e > bound {
						t.Fatalf("%s bits=%d: |x−x̂|=%g > %g (x=%v scale %v zero %v)", c.name, bits, e, bound, x[i], s, z)
					}
				}
			}
		}
	}
}

func TestSymRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, bits := range widths {
		for _, n := range []int{1, 5, 64, 128} {
			for trial := 0; trial < 20; trial++ {
				x := randRow(rng, n, 2, rng.NormFloat64())
				codes := make([]byte, PackedLen(n, bits))
				s := QuantizeSym(codes, x, bits)
				am := AbsMax(x)
				var want float32
				if bits == 2 {
					want = am / 1.5
				} else {
					want = am / float32(int(1)<<(bits-1)-1)
				}
				if s != want {
					t.Fatalf("bits=%d scale %v, want %v", bits, s, want)
				}
				got := make([]float32, n)
				DecodeSym(got, codes, bits, s)
				for i := range x {
					if e := math.Abs(float64(x[i] - got[i])); e > float64(s)/2+1e-6*(1+math.Abs(float64(x[i]))) {
						t.Fatalf("bits=%d: |x−x̂|=%g > scale/2=%g", bits, e, s/2)
					}
					// Symmetric grid: decoded values are mirror images.
					if bits == 2 {
						k := got[i]/s + 1.5
						if math.Abs(float64(k-float32(math.Round(float64(k))))) > 1e-5 || k < -1e-5 || k > 3+1e-5 {
							t.Fatalf("INT2 level %v is not one of {−1.5,−0.5,0.5,1.5}·scale", got[i]/s)
						}
					}
				}
			}
		}
	}
	// The INT2 grid itself.
	got := make([]float32, 4)
	DecodeSym(got, []byte{0b11_10_01_00}, 2, 2)
	if want := []float32{-3, -1, 1, 3}; !slices.Equal(got, want) {
		t.Fatalf("INT2 levels at scale 2 = %v, want %v", got, want)
	}
	// Zero rows decode to zeros.
	z := make([]float32, 7)
	codes := make([]byte, PackedLen(7, 2))
	s := QuantizeSym(codes, z, 2)
	DecodeSym(got[:0], codes, 2, s)
	out := make([]float32, 7)
	DecodeSym(out, codes, 2, s)
	for _, v := range out {
		if v != 0 {
			t.Fatalf("zero row decoded %v", out)
		}
	}
}

func TestChannelsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, bits := range widths {
		for _, shape := range [][2]int{{32, 8}, {32, 64}, {7, 128}, {1, 5}} {
			tk, d := shape[0], shape[1]
			x := make([]float32, tk*d)
			for c := 0; c < d; c++ { // each channel its own offset and spread
				off, sp := rng.NormFloat64()*4, 0.1+rng.Float64()*3
				for r := 0; r < tk; r++ {
					x[r*d+c] = float32(off + sp*rng.NormFloat64())
				}
			}
			codes := make([]byte, tk*PackedLen(d, bits))
			scales, zeros := make([]float32, d), make([]float32, d)
			QuantizeChannels(codes, x, tk, d, bits, scales, zeros)
			got := make([]float32, tk*d)
			DecodeChannels(got, codes, tk, d, bits, scales, zeros)
			rowCodes := make([]uint8, d)
			for c := 0; c < d; c++ {
				// Reference: the channel as a row through QuantizeAsym.
				col := make([]float32, tk)
				for r := range col {
					col[r] = x[r*d+c]
				}
				cc := make([]byte, PackedLen(tk, bits))
				s, z := QuantizeAsym(cc, col, bits)
				if s != scales[c] || z != zeros[c] {
					t.Fatalf("channel %d params %v %v, per-row reference %v %v", c, scales[c], zeros[c], s, z)
				}
				want := make([]uint8, tk)
				Unpack(want, cc, bits)
				for r := 0; r < tk; r++ {
					Unpack(rowCodes, codes[r*PackedLen(d, bits):], bits)
					if rowCodes[c] != want[r] {
						t.Fatalf("bits=%d [%d,%d] code %d, reference %d", bits, r, c, rowCodes[c], want[r])
					}
					if e := math.Abs(float64(x[r*d+c] - got[r*d+c])); e > float64(s)/2+1e-6*(1+math.Abs(float64(x[r*d+c]))) {
						t.Fatalf("bits=%d: |x−x̂|=%g > %g", bits, e, s/2)
					}
				}
			}
		}
	}
}

func TestF16Exhaustive(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToFloat32(uint16(h))
		if f != f {
			if g := F16FromFloat32(f); g&0x7c00 != 0x7c00 || g&0x3ff == 0 {
				t.Fatalf("NaN %#04x → %#04x", h, g)
			}
			continue
		}
		if g := F16FromFloat32(f); g != uint16(h) {
			t.Fatalf("half %#04x → %v → %#04x", h, f, g)
		}
		// Independent value check for finite halves.
		e, m := h>>10&0x1f, h&0x3ff
		var want float64
		switch e {
		case 0:
			want = float64(m) * math.Pow(2, -24)
		case 0x1f:
			want = math.Inf(1)
		default:
			want = (1 + float64(m)/1024) * math.Pow(2, float64(e-15))
		}
		if h&0x8000 != 0 {
			want = -want
		}
		if float64(f) != want {
			t.Fatalf("half %#04x = %v, want %v", h, f, want)
		}
	}
}

func TestF16RoundsToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	// All finite positive halves, sorted, to find neighbours.
	var halves []float64
	for h := 0; h < 0x7c00; h++ {
		halves = append(halves, float64(F16ToFloat32(uint16(h))))
	}
	check := func(f float32) {
		got := float64(F16ToFloat32(F16FromFloat32(f)))
		a := math.Abs(float64(f))
		if a >= 65520 { // halfway between 65504 and 2^16 and above → Inf
			if !math.IsInf(got, 0) {
				t.Fatalf("%v → %v, want Inf", f, got)
			}
			return
		}
		i := sort.SearchFloat64s(halves, a)
		best := math.Inf(1)
		for _, j := range []int{i - 1, i, i + 1} {
			if j >= 0 && j < len(halves) {
				best = min(best, math.Abs(halves[j]-a))
			}
		}
		if e := math.Abs(math.Abs(got) - a); e != best {
			t.Fatalf("%v → %v: error %g, nearest half is %g away", f, got, e, best)
		}
		if e := math.Abs(math.Abs(got) - a); e == best && i < len(halves) && i > 0 && halves[i]-a == a-halves[i-1] {
			// Tie: the even mantissa wins.
			if F16FromFloat32(float32(a))&1 != 0 {
				t.Fatalf("tie %v rounded to odd", f)
			}
		}
	}
	for i := 0; i < 200000; i++ {
		f := float32(math.Ldexp(rng.Float64()*2-1, rng.IntN(44)-28))
		check(f)
	}
	for _, f := range []float32{0, 65504, 65519, 65520, 1 << 20, 1.0 / (1 << 24), 1.0 / (1 << 25), 3.0 / (1 << 26), 1.0 / (1 << 26), 6.1e-5, 1 + 1.0/2048, 1 + 3.0/2048} {
		check(f)
		check(-f)
	}
}

// sortClipRef is Clip's definition with a full sort.
func sortClipRef(x []float32, ratio float64) float32 {
	a := make([]float64, len(x))
	for i, v := range x {
		a[i] = math.Abs(float64(v))
	}
	sort.Float64s(a)
	k := int(math.Floor(ratio * float64(len(x))))
	k = max(0, min(k, len(x)-1))
	return float32(a[k])
}

func TestClip(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, n := range []int{1, 2, 7, 16, 17, 64, 128, 600} {
		for _, ratio := range []float64{0, 0.3, 0.5, 0.92, 0.96, 0.999, 1, 1.5, -1} {
			x := randRow(rng, n, 1, 0)
			if n > 10 {
				x[3] = x[5] // duplicates
				x[4] = -x[5]
			}
			orig := slices.Clone(x)
			tau := Clip(x, ratio)
			want := sortClipRef(orig, ratio)
			if tau != want {
				t.Fatalf("n=%d ratio=%v: τ=%v, want %v", n, ratio, tau, want)
			}
			for i := range x {
				w := min(max(orig[i], -want), want)
				if x[i] != w {
					t.Fatalf("n=%d ratio=%v: x[%d]=%v, want %v", n, ratio, i, x[i], w)
				}
			}
			if ratio >= 1 && !slices.Equal(x, orig) {
				t.Fatalf("ratio %v changed x", ratio)
			}
		}
	}
	if Clip(nil, 0.9) != 0 {
		t.Fatal("Clip(nil) != 0")
	}
	x := []float32{1, float32(math.NaN()), -3, 2}
	if tau := Clip(x, 0.25); tau != 2 || x[2] != -2 || x[1] == x[1] {
		t.Fatalf("NaN row: τ=%v x=%v", tau, x)
	}
}

func BenchmarkQuantizeRow(b *testing.B) {
	for _, d := range []int{64, 128} {
		rng := rand.New(rand.NewPCG(1, uint64(d)))
		x := randRow(rng, d, 1, 0)
		for _, bits := range widths {
			codes := make([]byte, PackedLen(d, bits))
			b.Run(fmt.Sprintf("asym/int%d/d=%d", bits, d), func(b *testing.B) {
				b.SetBytes(int64(4 * d))
				for b.Loop() {
					lo, hi := MinMax(x)
					s, z := AsymParamsF16(lo, hi, bits)
					EncodeAsym(codes, x, bits, s, z)
				}
			})
			b.Run(fmt.Sprintf("dequant/int%d/d=%d", bits, d), func(b *testing.B) {
				out := make([]float32, d)
				b.SetBytes(int64(4 * d))
				for b.Loop() {
					DecodeAsym(out, codes, bits, 0.1, 1.5)
				}
			})
		}
		b.Run(fmt.Sprintf("sym/int2/d=%d", d), func(b *testing.B) {
			codes := make([]byte, PackedLen(d, 2))
			b.SetBytes(int64(4 * d))
			for b.Loop() {
				QuantizeSym(codes, x, 2)
			}
		})
		b.Run(fmt.Sprintf("clip/d=%d", d), func(b *testing.B) {
			y := make([]float32, d)
			b.SetBytes(int64(4 * d))
			for b.Loop() {
				copy(y, x)
				Clip(y, 0.96)
			}
		})
	}
}

func BenchmarkF16(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	x := randRow(rng, 1024, 1, 0)
	h := make([]uint16, len(x))
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			EncodeF16(h, x)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			DecodeF16(x, h)
		}
	})
}

// The slice converters' inlined fast paths agree with the scalar ones:
// every half for DecodeF16, and a sweep of float32 bit patterns (with the
// fast path's boundaries) for EncodeF16.
func TestF16SlicesMatchScalar(t *testing.T) {
	hs := make([]uint16, 1<<16)
	for i := range hs {
		hs[i] = uint16(i)
	}
	fs := make([]float32, len(hs))
	DecodeF16(fs, hs)
	for i, h := range hs {
		if math.Float32bits(fs[i]) != math.Float32bits(F16ToFloat32(h)) {
			t.Fatalf("DecodeF16(%#04x) = %v, F16ToFloat32 %v", h, fs[i], F16ToFloat32(h))
		}
	}
	var xs []float32
	for b := uint64(0); b < 1<<32; b += 4099 {
		xs = append(xs, math.Float32frombits(uint32(b)))
	}
	for _, b := range []uint32{0x38800000, 0x387fffff, 0x477fe000, 0x477fefff, 0x477ff000, 0x477fffff, 0x38801000, 0x38803000} {
		xs = append(xs, math.Float32frombits(b), math.Float32frombits(b|0x80000000))
	}
	out := make([]uint16, len(xs))
	EncodeF16(out, xs)
	for i, x := range xs {
		want := F16FromFloat32(x)
		if x != x {
			if out[i]&0x7c00 != 0x7c00 || out[i]&0x3ff == 0 {
				t.Fatalf("EncodeF16(NaN) = %#04x", out[i])
			}
			continue
		}
		if out[i] != want {
			t.Fatalf("EncodeF16(%v = %#08x) = %#04x, F16FromFloat32 %#04x", x, math.Float32bits(x), out[i], want)
		}
	}
}
