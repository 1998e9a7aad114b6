package safetensors

import (
	"encoding/binary"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

func TestF16AllPatterns(t *testing.T) {
	src := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	tn := &Tensor{Name: "all", File: "mem", DType: F16, Shape: []int{1 << 16}, Data: src}
	got, err := tn.Float32()
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i := range 1 << 16 {
		want := refF16(uint16(i))
		if !sameFloat(got[i], want) || !sameFloat(F16ToFloat32(uint16(i)), want) {
			if bad++; bad < 10 {
				t.Errorf("F16 %#04x: got %v, want %v", i, got[i], want)
			}
		}
	}
	checkOddLength(t, F16, src, got)
	// Anchors from the IEEE 754 binary16 definition.
	for _, c := range []struct {
		h    uint16
		want float32
	}{{0x3c00, 1}, {0x7bff, 65504}, {0x0001, 5.960464477539063e-08}, {0x0400, 6.103515625e-05}, {0xc000, -2}} {
		if g := F16ToFloat32(c.h); g != c.want {
			t.Errorf("F16 %#04x = %v, want %v", c.h, g, c.want)
		}
	}
}

// checkOddLength decodes src minus its first element and its last 1..3
// elements (so the 4-at-a-time loop has a remainder) and compares with full,
// the already checked decoding of all of src.
func checkOddLength(t *testing.T, dt DType, src []byte, full []float32) {
	t.Helper()
	sz := dt.Size()
	for cut := 1; cut <= 3; cut++ {
		n := len(full) - 1 - cut
		tn := &Tensor{Name: "odd", File: "mem", DType: dt, Shape: []int{n}, Data: src[sz : sz*(1+n)]}
		got, err := tn.Float32()
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(full[i+1]) {
				t.Fatalf("%s odd length %d: [%d] = %v, want %v", dt, n, i, got[i], full[i+1])
			}
		}
	}
}

func TestBF16AllPatterns(t *testing.T) {
	src := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	tn := &Tensor{Name: "all", File: "mem", DType: BF16, Shape: []int{256, 256}, Data: src}
	got, err := tn.Float32()
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i := range 1 << 16 {
		want := refBF16(uint16(i))
		if !sameFloat(got[i], want) || !sameFloat(BF16ToFloat32(uint16(i)), want) {
			if bad++; bad < 10 {
				t.Errorf("BF16 %#04x: got %v, want %v", i, got[i], want)
			}
		}
	}
	checkOddLength(t, BF16, src, got)
}

func TestFP8AllPatterns(t *testing.T) {
	src := make([]byte, 256)
	for i := range src {
		src[i] = byte(i)
	}
	for _, c := range []struct {
		dt  DType
		ref func(uint8) float64
		one func(uint8) float32
	}{{F8E4M3, refE4M3, F8E4M3ToFloat32}, {F8E5M2, refE5M2, F8E5M2ToFloat32}} {
		tn := &Tensor{Name: "all", File: "mem", DType: c.dt, Shape: []int{256}, Data: src}
		got, err := tn.Float32()
		if err != nil {
			t.Fatal(err)
		}
		for i := range 256 {
			want := c.ref(uint8(i))
			if !sameFloat(got[i], want) || !sameFloat(c.one(uint8(i)), want) {
				t.Errorf("%s %#02x: got %v, want %v", c.dt, i, got[i], want)
			}
		}
	}
	// Anchors from the OCP OFP8 v1.0 specification tables.
	anchors := []struct {
		dt   DType
		b    uint8
		want float64
	}{
		{F8E4M3, 0x7e, 448}, {F8E4M3, 0xfe, -448}, {F8E4M3, 0x08, math.Ldexp(1, -6)},
		{F8E4M3, 0x07, 0.875 * math.Ldexp(1, -6)}, {F8E4M3, 0x01, math.Ldexp(1, -9)},
		{F8E4M3, 0x7f, math.NaN()}, {F8E4M3, 0xff, math.NaN()}, {F8E4M3, 0x78, 256},
		{F8E5M2, 0x7b, 57344}, {F8E5M2, 0x7c, math.Inf(1)}, {F8E5M2, 0xfc, math.Inf(-1)},
		{F8E5M2, 0x7d, math.NaN()}, {F8E5M2, 0x04, math.Ldexp(1, -14)}, {F8E5M2, 0x01, math.Ldexp(1, -16)},
	}
	for _, a := range anchors {
		tn := &Tensor{Name: "x", File: "mem", DType: a.dt, Shape: []int{}, Data: []byte{a.b}}
		got, err := tn.Float32()
		if err != nil {
			t.Fatal(err)
		}
		if !sameFloat(got[0], a.want) {
			t.Errorf("%s %#02x = %v, want %v", a.dt, a.b, got[0], a.want)
		}
	}
}

// nearestRNE is a brute-force reference for rounding x to a binary format
// whose non-negative finite bit patterns 0..maxFinite are ordered like their
// values (val), with infBits the pattern of +Inf: it finds the neighbours of
// |x| by binary search and picks the nearer, ties to the even pattern. The
// Inf pattern takes part in rounding as the value one ulp above maxFinite
// (IEEE 754 overflow rule).
func nearestRNE(x float64, maxFinite, infBits uint16, val func(uint16) float64, signBit uint16) uint16 {
	sign := uint16(0)
	if math.Signbit(x) {
		sign = signBit
		x = -x
	}
	if math.IsInf(x, 1) {
		return sign | infBits
	}
	top := 2*val(maxFinite) - val(maxFinite-1) // maxFinite + 1 ulp
	value := func(h uint16) float64 {
		if h > maxFinite {
			return top
		}
		return val(h)
	}
	// largest lo in [0, maxFinite+1] with value(lo) <= x
	lo, hi := 0, int(maxFinite)+1
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if value(uint16(mid)) <= x {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lo == int(maxFinite)+1 {
		return sign | infBits
	}
	a, b := uint16(lo), uint16(lo+1)
	da, db := x-value(a), value(b)-x
	pick := a
	if db < da || (db == da && b&1 == 0) {
		pick = b
	}
	if pick > maxFinite {
		return sign | infBits
	}
	return sign | pick
}

// testInputs returns float32 values to round: the exact value of every
// pattern of the 16-bit format, the midpoints and quarter points between
// consecutive finite ones, and 10^6 random float32 bit patterns (seeded).
func testInputs(maxFinite uint16, val func(uint16) float64) []float32 {
	var xs []float32
	for h := uint16(0); h <= maxFinite; h++ {
		v := val(h)
		xs = append(xs, float32(v), float32(-v))
		if h < maxFinite {
			w := val(h + 1)
			xs = append(xs, float32((v+w)/2), float32(v+(w-v)/4), float32(w-(w-v)/4))
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1_000_000 {
		xs = append(xs, math.Float32frombits(r.Uint32()))
	}
	return xs
}

func TestF16FromFloat32RNE(t *testing.T) {
	bad := 0
	for _, x := range testInputs(0x7bff, refF16) {
		got := F16FromFloat32(x)
		if math.IsNaN(float64(x)) {
			if !math.IsNaN(refF16(got)) || (got>>15 == 1) != math.Signbit(float64(x)) {
				t.Errorf("F16FromFloat32(NaN %#08x) = %#04x, want a NaN of the same sign", math.Float32bits(x), got)
			}
			continue
		}
		want := nearestRNE(float64(x), 0x7bff, 0x7c00, refF16, 0x8000)
		if got != want {
			if bad++; bad < 10 {
				t.Errorf("F16FromFloat32(%v) = %#04x, want %#04x", x, got, want)
			}
		}
	}
	if F16FromFloat32(65519.996) != 0x7bff || F16FromFloat32(65520) != 0x7c00 {
		t.Errorf("overflow threshold wrong: %#04x %#04x", F16FromFloat32(65519.996), F16FromFloat32(65520))
	}
}

func TestBF16FromFloat32RNE(t *testing.T) {
	bad := 0
	for _, x := range testInputs(0x7f7f, refBF16) {
		got := BF16FromFloat32(x)
		if math.IsNaN(float64(x)) {
			if !math.IsNaN(refBF16(got)) || (got>>15 == 1) != math.Signbit(float64(x)) {
				t.Errorf("BF16FromFloat32(NaN %#08x) = %#04x, want a NaN of the same sign", math.Float32bits(x), got)
			}
			continue
		}
		want := nearestRNE(float64(x), 0x7f7f, 0x7f80, refBF16, 0x8000)
		if got != want {
			if bad++; bad < 10 {
				t.Errorf("BF16FromFloat32(%v) = %#04x, want %#04x", x, got, want)
			}
		}
	}
}

func TestIntegerAndF64Conversion(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 1000
	type kase struct {
		dt   DType
		data []byte
		want []float32
	}
	// Integer references round once, exactly, through math/big.
	fromInt := func(v int64) float32 { f, _ := new(big.Float).SetInt64(v).Float32(); return f }
	fromUint := func(v uint64) float32 { f, _ := new(big.Float).SetUint64(v).Float32(); return f }
	var cases []kase
	mk := func(dt DType, size int, put func(b []byte) float32) {
		c := kase{dt: dt, data: make([]byte, n*size), want: make([]float32, n)}
		for i := range n {
			c.want[i] = put(c.data[i*size:])
		}
		cases = append(cases, c)
	}
	mk(I8, 1, func(b []byte) float32 { v := int8(r.Uint32()); b[0] = byte(v); return fromInt(int64(v)) })
	mk(U8, 1, func(b []byte) float32 { v := uint8(r.Uint32()); b[0] = v; return fromUint(uint64(v)) })
	mk(I16, 2, func(b []byte) float32 {
		v := int16(r.Uint32())
		binary.LittleEndian.PutUint16(b, uint16(v))
		return fromInt(int64(v))
	})
	mk(U16, 2, func(b []byte) float32 {
		v := uint16(r.Uint32())
		binary.LittleEndian.PutUint16(b, v)
		return fromUint(uint64(v))
	})
	mk(I32, 4, func(b []byte) float32 {
		v := int32(r.Uint32()) >> (r.Uint32() % 31) // mix small and large magnitudes
		binary.LittleEndian.PutUint32(b, uint32(v))
		return fromInt(int64(v))
	})
	mk(U32, 4, func(b []byte) float32 {
		v := r.Uint32()
		binary.LittleEndian.PutUint32(b, v)
		return fromUint(uint64(v))
	})
	mk(I64, 8, func(b []byte) float32 {
		v := int64(r.Uint64()) >> (r.Uint64() % 63)
		binary.LittleEndian.PutUint64(b, uint64(v))
		return fromInt(v)
	})
	mk(U64, 8, func(b []byte) float32 { v := r.Uint64(); binary.LittleEndian.PutUint64(b, v); return fromUint(v) })
	mk(F64, 8, func(b []byte) float32 {
		v := r.NormFloat64() * math.Pow(10, float64(r.IntN(20)-10))
		binary.LittleEndian.PutUint64(b, math.Float64bits(v))
		f, _ := big.NewFloat(v).Float32()
		return f
	})
	mk(Bool, 1, func(b []byte) float32 {
		v := byte(r.Uint32() % 3) // 0, 1, 2: nonzero is true
		b[0] = v
		if v != 0 {
			return 1
		}
		return 0
	})
	for _, c := range cases {
		tn := &Tensor{Name: "x", File: "mem", DType: c.dt, Shape: []int{n}, Data: c.data}
		got, err := tn.Float32()
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if got[i] != c.want[i] {
				t.Errorf("%s[%d] = %v, want %v", c.dt, i, got[i], c.want[i])
				break
			}
		}
	}
}

func TestFloat32IntoErrors(t *testing.T) {
	tn := &Tensor{Name: "w", File: "f.safetensors", DType: F32, Shape: []int{2, 3}, Data: make([]byte, 24)}
	wantErr(t, tn.Float32Into(make([]float32, 5)), "f.safetensors", `"w"`, "5 elements, want 6")
	tn.Data = tn.Data[:20]
	wantErr(t, tn.Float32Into(make([]float32, 6)), "f.safetensors", `"w"`, "20 data bytes, want 24")
	tn.DType = "F4"
	_, err := tn.Float32()
	wantErr(t, err, `unknown dtype "F4"`, `"w"`)
}
