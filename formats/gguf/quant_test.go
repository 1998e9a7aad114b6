package gguf

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// gaussian returns rows×n standard normal values (fixed seed), with a few
// outliers (every 97th value ×6) so that blocks differ in range.
func gaussian(seed uint64, rows, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, rows*n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
		if i%97 == 13 {
			x[i] *= 6
		}
	}
	return x
}

func roundTrip(t *testing.T, ty Type, x []float32, n int) []float32 {
	t.Helper()
	b, err := Quantize(ty, x, n)
	if err != nil {
		t.Fatalf("Quantize(%v, n=%d): %v", ty, n, err)
	}
	rb, _ := ty.RowBytes(n)
	if len(b) != len(x)/n*rb {
		t.Fatalf("%v: %d bytes for %d rows of %d, want %d", ty, len(b), len(x)/n, n, len(x)/n*rb)
	}
	y, err := Dequantize(ty, b, n)
	if err != nil {
		t.Fatalf("Dequantize(%v): %v", ty, err)
	}
	if len(y) != len(x) {
		t.Fatalf("%v: decoded %d values, want %d", ty, len(y), len(x))
	}
	return y
}

// shapes: one row, seven rows, rows of one block and of several.
var shapes = []struct{ rows, blocks int }{{1, 1}, {7, 1}, {1, 3}, {7, 2}, {3, 5}}

// TestFloatRoundTrip: F32 exact; F16 and BF16 within half an ulp
// (relative 2^−11 and 2^−8 for normal values).
func TestFloatRoundTrip(t *testing.T) {
	x := gaussian(1, 7, 33)
	x[5] = 0
	x[6] = -1e-30 // flushes to −0 in F16, kept (relatively) in BF16
	y := roundTrip(t, TypeF32, x, 33)
	for i := range x {
		if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
			t.Fatalf("F32 element %d: %g → %g", i, x[i], y[i])
		}
	}
	for _, c := range []struct {
		ty  Type
		rel float64
		abs float64
	}{{TypeF16, 0x1p-11, 0x1p-25}, {TypeBF16, 0x1p-8, 0}} {
		y := roundTrip(t, c.ty, x, 33)
		for i := range x {
			if e := math.Abs(float64(y[i] - x[i])); e > c.rel*math.Abs(float64(x[i]))+c.abs {
				t.Fatalf("%v element %d: %g → %g, |err| %g", c.ty, i, x[i], y[i], e)
			}
		}
	}
	if _, err := Quantize(TypeF16, []float32{1, 70000}, 2); !errors.Is(err, ErrValue) {
		t.Errorf("F16 of 70000: error %v, want ErrValue", err)
	}
}

// TestQ8_0RoundTrip: per block d = max|x|/127 and every element within
// d/2 of x, plus the fp16 rounding of d (at most 2^−11·d per unit of code,
// 127 codes): |err| ≤ d·(1/2 + 127·2^−11).
func TestQ8_0RoundTrip(t *testing.T) {
	for _, s := range shapes {
		n := 32 * s.blocks
		x := gaussian(2, s.rows, n)
		y := roundTrip(t, TypeQ8_0, x, n)
		for b := 0; b < len(x)/32; b++ {
			var amax float64
			for _, v := range x[32*b : 32*b+32] {
				amax = math.Max(amax, math.Abs(float64(v)))
			}
			d := amax / 127
			bound := d * (0.5 + 127*0x1p-11)
			for i := 32 * b; i < 32*b+32; i++ {
				if e := math.Abs(float64(y[i] - x[i])); e > bound {
					t.Fatalf("rows %d n %d element %d: %g → %g, |err| %g > %g", s.rows, n, i, x[i], y[i], e, bound)
				}
			}
		}
	}
}

// TestQ4_0RoundTrip: d = m/−8 with m the element of largest magnitude; an
// element x with x/d ≤ 7.5 is within |d|/2, the others (opposite sign to m,
// |x| > 7.5·|d|: code clamped to 15) within |d|; fp16 rounding of d adds up
// to 8·2^−11·|d|.
func TestQ4_0RoundTrip(t *testing.T) {
	for _, s := range shapes {
		n := 32 * s.blocks
		x := gaussian(3, s.rows, n)
		y := roundTrip(t, TypeQ4_0, x, n)
		for b := 0; b < len(x)/32; b++ {
			var m float64
			for _, v := range x[32*b : 32*b+32] {
				if math.Abs(float64(v)) > math.Abs(m) {
					m = float64(v)
				}
			}
			d := m / -8
			for i := 32 * b; i < 32*b+32; i++ {
				bound := math.Abs(d) * (0.5 + 8*0x1p-11)
				if float64(x[i])/d > 7.5 {
					bound = math.Abs(d) * (1 + 8*0x1p-11)
				}
				if e := math.Abs(float64(y[i] - x[i])); e > bound {
					t.Fatalf("rows %d n %d element %d: %g → %g, |err| %g > %g", s.rows, n, i, x[i], y[i], e, bound)
				}
			}
			if got := y[32*b+firstMaxAbs(x[32*b:32*b+32])]; math.Abs(float64(got)-m) > 8*0x1p-11*math.Abs(d)*8 {
				t.Errorf("block %d: the largest-magnitude element %g decodes to %g", b, m, got)
			}
		}
	}
}

func firstMaxAbs(x []float32) int {
	k := 0
	for i, v := range x {
		if math.Abs(float64(v)) > math.Abs(float64(x[k])) {
			k = i
		}
	}
	return k
}

// TestQ4_1RoundTrip: d = (max − min)/15, m = min; |err| ≤ d/2 plus the
// fp16 rounding of d (15 codes × 2^−11·d) and of m (2^−11·|min|).
func TestQ4_1RoundTrip(t *testing.T) {
	for _, s := range shapes {
		n := 32 * s.blocks
		x := gaussian(4, s.rows, n)
		for i := range x[:32] {
			x[i] += 3 // an all-positive first block: m > 0
		}
		y := roundTrip(t, TypeQ4_1, x, n)
		for b := 0; b < len(x)/32; b++ {
			lo, hi := math.Inf(1), math.Inf(-1)
			for _, v := range x[32*b : 32*b+32] {
				lo, hi = math.Min(lo, float64(v)), math.Max(hi, float64(v))
			}
			d := (hi - lo) / 15
			bound := d/2 + 15*d*0x1p-11 + math.Abs(lo)*0x1p-11
			for i := 32 * b; i < 32*b+32; i++ {
				if e := math.Abs(float64(y[i] - x[i])); e > bound {
					t.Fatalf("rows %d n %d element %d: %g → %g, |err| %g > %g", s.rows, n, i, x[i], y[i], e, bound)
				}
			}
		}
	}
}

func relRMSE(x, y []float32) float64 {
	var se, ss float64
	for i := range x {
		d := float64(y[i]) - float64(x[i])
		se += d * d
		ss += float64(x[i]) * float64(x[i])
	}
	return math.Sqrt(se / ss)
}

// TestKQuantRoundTrip: RMSE relative to the data's RMS on Gaussian rows
// (every 97th value ×6, which widens the blocks holding one). Uniform
// rounding of a 32-value block at 4 bits gives about 0.08–0.09 (Q4_1
// measures 0.091 on these rows); Q4_K's scale search must beat Q4_1
// despite its 6-bit sub-block scales (measured 0.0846), and Q6_K (16-value
// sub-blocks, 6 bits) must stay under 0.025 (measured 0.0234).
// TestAgainstGGML checks that these are llama.cpp's own numbers. Every element is also within the range its
// sub-block's grid can reach: |err| ≤ the block's max |x|.
func TestKQuantRoundTrip(t *testing.T) {
	x := gaussian(5, 64, 1024)
	q41 := relRMSE(x, roundTrip(t, TypeQ4_1, x, 1024))
	q4k := relRMSE(x, roundTrip(t, TypeQ4_K, x, 1024))
	q6k := relRMSE(x, roundTrip(t, TypeQ6_K, x, 1024))
	t.Logf("relative RMSE: Q4_1 %.5f, Q4_K %.5f, Q6_K %.5f", q41, q4k, q6k)
	if q4k > 0.09 || q4k >= q41 {
		t.Errorf("Q4_K relative RMSE %.5f, want ≤ 0.09 and below Q4_1's %.5f", q4k, q41)
	}
	if q6k > 0.025 {
		t.Errorf("Q6_K relative RMSE %.5f, want ≤ 0.025", q6k)
	}
	for _, ty := range []Type{TypeQ4_K, TypeQ6_K} {
		for _, s := range []struct{ rows, blocks int }{{1, 1}, {7, 1}, {3, 2}} {
			n := 256 * s.blocks
			xs := gaussian(6, s.rows, n)
			y := roundTrip(t, ty, xs, n)
			lim := map[Type]float64{TypeQ4_K: 0.095, TypeQ6_K: 0.03}[ty]
			if e := relRMSE(xs, y); e > lim {
				t.Errorf("%v rows %d n %d: relative RMSE %.4f > %.3f", ty, s.rows, n, e, lim)
			}
		}
	}
}

// TestQuantizeSpecialBlocks: all-zero, constant and single-spike blocks
// decode without NaN and reproduce zeros exactly.
func TestQuantizeSpecialBlocks(t *testing.T) {
	for _, ty := range []Type{TypeQ8_0, TypeQ4_0, TypeQ4_1, TypeQ4_K, TypeQ6_K} {
		n := ty.BlockSize()
		x := make([]float32, 3*n)
		for i := n; i < 2*n; i++ {
			x[i] = 0.75 // constant block
		}
		x[2*n+5] = -2.5 // spike in an otherwise zero block
		y := roundTrip(t, ty, x, n)
		for i := 0; i < n; i++ {
			if y[i] != 0 {
				t.Fatalf("%v: zero block element %d decodes to %g", ty, i, y[i])
			}
		}
		for i := n; i < 3*n; i++ {
			if math.IsNaN(float64(y[i])) || math.Abs(float64(y[i]-x[i])) > 0.1 {
				t.Fatalf("%v: element %d: %g → %g", ty, i, x[i], y[i])
			}
		}
	}
}

func TestQuantizeErrors(t *testing.T) {
	x := gaussian(7, 2, 64)
	for _, ty := range Types() {
		if _, err := Quantize(ty, x[:63], 63); ty.BlockSize() > 1 && !errors.Is(err, ErrShape) {
			t.Errorf("%v: row of 63: error %v, want ErrShape", ty, err)
		}
		if ty.BlockSize() <= 32 {
			if _, err := Quantize(ty, x[:96], 64); !errors.Is(err, ErrShape) {
				t.Errorf("%v: 96 values in rows of 64: error %v, want ErrShape", ty, err)
			}
		}
		bad := append([]float32(nil), make([]float32, 256)...)
		bad[40] = float32(math.NaN())
		if _, err := Quantize(ty, bad, 256); !errors.Is(err, ErrValue) {
			t.Errorf("%v: NaN input: error %v, want ErrValue", ty, err)
		}
		bad[40] = float32(math.Inf(-1))
		if _, err := Quantize(ty, bad, 256); !errors.Is(err, ErrValue) {
			t.Errorf("%v: −Inf input: error %v, want ErrValue", ty, err)
		}
	}
	huge := make([]float32, 32)
	huge[3] = 1e12 // Q8_0 scale 1e12/127 > 65504
	if _, err := Quantize(TypeQ8_0, huge, 32); !errors.Is(err, ErrValue) {
		t.Errorf("Q8_0 scale beyond fp16: error %v, want ErrValue", err)
	}
	if _, err := Quantize(Type(9), x, 32); !errors.Is(err, ErrType) {
		t.Errorf("Q8_1: error %v, want ErrType", err)
	}
}

// TestDequantizeRejectsTruncated: every length that is not a positive whole
// number of rows is refused, for every type.
func TestDequantizeRejectsTruncated(t *testing.T) {
	for _, ty := range Types() {
		n := 256
		rb, _ := ty.RowBytes(n)
		for _, l := range []int{0, 1, rb - 1, rb + 1, 2*rb - 1, 3*rb - 2} {
			if l < 0 {
				continue
			}
			if _, err := Dequantize(ty, make([]byte, l), n); !errors.Is(err, ErrShape) {
				t.Errorf("%v: %d bytes for rows of %d (%d bytes): error %v, want ErrShape", ty, l, n, rb, err)
			}
		}
		if y, err := Dequantize(ty, make([]byte, 2*rb), n); err != nil || len(y) != 2*n {
			t.Errorf("%v: two whole rows: %d values, %v", ty, len(y), err)
		}
	}
	if _, err := Dequantize(TypeQ4_K, make([]byte, 144), 128); !errors.Is(err, ErrShape) {
		t.Errorf("Q4_K rows of 128: error %v, want ErrShape", err)
	}
}

// The golden blocks below are written from the block layouts of
// ggml-common.h (field order, nibble order), not from the encoder.

func TestGoldenQ8_0(t *testing.T) {
	// d = 0.5 (fp16 0x3800), qs[j] = 127 − 8j: x_j = 0.5·(127 − 8j), the
	// largest |x| 63.5 = 127·d, so the reference quantizer picks d = 0.5.
	want := []byte{0x00, 0x38}
	x := make([]float32, 32)
	for j := 0; j < 32; j++ {
		q := 127 - 8*j
		want = append(want, byte(int8(q)))
		x[j] = 0.5 * float32(q)
	}
	checkGolden(t, TypeQ8_0, x, want)
}

func TestGoldenQ4_0(t *testing.T) {
	// d = 0.5 (0x3800); nibble n_j = j mod 16, x_j = 0.5·(n_j − 8); the
	// largest magnitude is −4 (n = 0), so d = −4/−8 = 0.5. Byte j holds
	// element j (low) and j+16 (high): n_j | n_j<<4 = 0x00, 0x11, … 0xff.
	want := []byte{0x00, 0x38, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
		0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
	x := make([]float32, 32)
	for j := range x {
		x[j] = 0.5 * float32(j%16-8)
	}
	checkGolden(t, TypeQ4_0, x, want)
}

func TestGoldenQ4_1(t *testing.T) {
	// d = 0.25 (0x3400), m = −1 (0xbc00); nibble n_j = 7j mod 16 (0 and 15
	// both occur), x_j = 0.25·n_j − 1.
	want := []byte{0x00, 0x34, 0x00, 0xbc}
	x := make([]float32, 32)
	n := func(j int) byte { return byte(7 * j % 16) }
	for j := 0; j < 16; j++ {
		want = append(want, n(j)|n(j+16)<<4)
	}
	for j := range x {
		x[j] = 0.25*float32(n(j)) - 1
	}
	checkGolden(t, TypeQ4_1, x, want)
}

func checkGolden(t *testing.T, ty Type, x []float32, want []byte) {
	t.Helper()
	got, err := Quantize(ty, x, len(x))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("%v encode:\n got %x\nwant %x", ty, got, want)
	}
	y, err := Dequantize(ty, want, len(x))
	if err != nil {
		t.Fatal(err)
	}
	for i := range x {
		if y[i] != x[i] {
			t.Fatalf("%v decode element %d = %g, want %g", ty, i, y[i], x[i])
		}
	}
}

// TestGoldenQ4_K decodes a hand-packed block_q4_K: d = 1 (0x3c00),
// dmin = 0.5 (0x3800), sub-block scales sc = 7, 15, …, 63 (8j+7) and mins
// m = 63, 55, …, 7 (63−8j), packed per get_scale_min_k4 by hand below, and
// qs[k] = k: element i of chunk c = i/64 is the low nibble of qs[32c + i%32]
// when i%64 < 32, else the high nibble; x_i = d·sc_j·nibble − dmin·m_j
// with j = i/32.
func TestGoldenQ4_K(t *testing.T) {
	blk := []byte{0x00, 0x3c, 0x00, 0x38,
		// scales[0..3]: sc_j | (sc_{j+4}>>4)<<6 with sc_4..7 = 39, 47, 55, 63
		0x87, 0x8f, 0xd7, 0xdf,
		// scales[4..7]: m_j | (m_{j+4}>>4)<<6 with m_4..7 = 31, 23, 15, 7
		0x7f, 0x77, 0x2f, 0x27,
		// scales[8..11]: (sc_{j+4} & 15) | (m_{j+4} & 15)<<4
		0xf7, 0x7f, 0xf7, 0x7f}
	for k := 0; k < 128; k++ {
		blk = append(blk, byte(k))
	}
	y, err := Dequantize(TypeQ4_K, blk, 256)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 256; i++ {
		c, r := i/64, i%64
		q := blk[16+32*c+r%32]
		nib := q & 0xf
		if r >= 32 {
			nib = q >> 4
		}
		j := i / 32
		sc, m := float32(8*j+7), float32(63-8*j)
		if want := sc*float32(nib) - 0.5*m; y[i] != want {
			t.Fatalf("element %d = %g, want %g", i, y[i], want)
		}
	}
	// The packer writes the same 12 scale bytes.
	var sc, m [8]uint8
	for j := range sc {
		sc[j], m[j] = uint8(8*j+7), uint8(63-8*j)
	}
	var got [12]byte
	putScaleMinK4(got[:], &sc, &m)
	if string(got[:]) != string(blk[4:16]) {
		t.Errorf("putScaleMinK4 = %x, want %x", got, blk[4:16])
	}
	// Round trip of the decoded values: they lie on the block's grid, so
	// the encoder's error is bounded by the grid step (max sc·d = 63).
	x := y
	z := roundTrip(t, TypeQ4_K, x, 256)
	if e := relRMSE(x, z); e > 0.05 {
		t.Errorf("re-encoding the golden block: relative RMSE %.4f", e)
	}
}

// TestGoldenQ6_K decodes a hand-packed block_q6_K: d = 0.5 (0x3800),
// scales[j] = j − 8 (int8, so negative scales occur), code q_i = i mod 64,
// x_i = d·scales[i/16]·(q_i − 32). Layout (ggml-common.h): ql[128] low 4
// bits, qh[64] high 2 bits, scales[16], d. For element i with h = i/128,
// r = i%128: low bits in ql[64h + r%64] (high nibble when r ≥ 64), high
// bits in qh[32h + r%32] at bit 2·(r/32).
func TestGoldenQ6_K(t *testing.T) {
	blk := make([]byte, 210)
	for i := 0; i < 256; i++ {
		q := byte(i % 64)
		h, r := i/128, i%128
		if r >= 64 {
			blk[64*h+r%64] |= (q & 0xf) << 4
		} else {
			blk[64*h+r%64] |= q & 0xf
		}
		blk[128+32*h+r%32] |= (q >> 4) << (2 * (r / 32))
	}
	for j := 0; j < 16; j++ {
		blk[192+j] = byte(int8(j - 8))
	}
	binary.LittleEndian.PutUint16(blk[208:], 0x3800)
	y, err := Dequantize(TypeQ6_K, blk, 256)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 256; i++ {
		if want := 0.5 * float32(i/16-8) * float32(i%64-32); y[i] != want {
			t.Fatalf("element %d = %g, want %g", i, y[i], want)
		}
		ql, hi, qh, sh := q6KIndex(i)
		lo := blk[ql] & 0xf
		if hi {
			lo = blk[ql] >> 4
		}
		if got := lo | (blk[128+qh]>>sh&3)<<4; int(got) != i%64 {
			t.Fatalf("q6KIndex(%d) reads code %d, want %d", i, got, i%64)
		}
	}
	// An encoder round trip of a block with exactly representable values.
	z := roundTrip(t, TypeQ6_K, y, 256)
	if e := relRMSE(y, z); e > 0.02 {
		t.Errorf("re-encoding the golden block: relative RMSE %.4f", e)
	}
}

// FuzzDequantize: any byte string and row length either decodes to whole
// rows (len(data)/RowBytes(n)·n values) or is refused with ErrShape or
// ErrType; it never panics. The seeds run with `go test`; `go test -fuzz
// FuzzDequantize` explores further.
func FuzzDequantize(f *testing.F) {
	for _, ty := range Types() {
		rb, _ := ty.RowBytes(256)
		f.Add(uint32(ty), 256, make([]byte, rb))
		f.Add(uint32(ty), 256, make([]byte, rb-1))
		f.Add(uint32(ty), 32, make([]byte, 3*ty.BlockBytes()))
	}
	f.Add(uint32(9), 32, make([]byte, 36))
	f.Fuzz(func(t *testing.T, ty uint32, n int, data []byte) {
		y, err := Dequantize(Type(ty), data, n)
		if err != nil {
			if !errors.Is(err, ErrShape) && !errors.Is(err, ErrType) {
				t.Fatalf("error %v, want ErrShape or ErrType", err)
			}
			return
		}
		rb, _ := Type(ty).RowBytes(n)
		if len(data)%rb != 0 || len(y) != len(data)/rb*n {
			t.Fatalf("%v n %d: %d bytes gave %d values", Type(ty), n, len(data), len(y))
		}
	})
}

func TestRowBytesOverflow(t *testing.T) {
	if _, err := TypeF32.RowBytes(math.MaxInt); !errors.Is(err, ErrShape) {
		t.Errorf("F32 row of MaxInt: error %v, want ErrShape", err)
	}
	if _, err := Dequantize(TypeF32, make([]byte, 8), 1<<62); !errors.Is(err, ErrShape) {
		t.Errorf("F32 rows of 2^62: error %v, want ErrShape", err)
	}
}
