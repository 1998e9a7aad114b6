package gguf

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

func rtn(t *testing.T, rows, cols, bits, group int, sym bool) *weights.Quantized {
	t.Helper()
	q, err := weights.QuantizeRTN(gaussian(uint64(10*bits+group), rows, cols), rows, cols, weights.Options{Bits: bits, GroupSize: group, Symmetric: sym})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// compareDequant decodes blocks with Dequantize and compares with lmpack's
// own Quantized.Dequantize; it returns the number of differing elements and
// the largest difference.
func compareDequant(t *testing.T, q *weights.Quantized, ty Type, blocks []byte) (int, float64) {
	t.Helper()
	got, err := Dequantize(ty, blocks, q.Cols)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float32, q.Rows*q.Cols)
	q.Dequantize(want)
	diff, maxErr := 0, 0.0
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			diff++
			maxErr = math.Max(maxErr, math.Abs(float64(got[i])-float64(want[i])))
		}
	}
	return diff, maxErr
}

// TestFromQuantizedExact: the grids with an exact GGUF counterpart decode
// bit for bit to lmpack's dequantized weights.
func TestFromQuantizedExact(t *testing.T) {
	cases := []struct {
		bits, group int
		sym         bool
		want        Type
	}{
		{8, 32, true, TypeQ8_0}, {8, 128, true, TypeQ8_0}, {8, 0, true, TypeQ8_0},
		{4, 32, true, TypeQ4_0}, {4, 64, true, TypeQ4_0}, {4, 0, true, TypeQ4_0},
		{3, 32, true, TypeQ4_0}, {2, 32, true, TypeQ4_0},
		{3, 32, false, TypeQ4_0}, {2, 64, false, TypeQ4_0},
	}
	for _, c := range cases {
		cols := 128
		if c.group == 0 {
			cols = 160 // per-channel: one group of 5 blocks
		}
		q := rtn(t, 7, cols, c.bits, c.group, c.sym)
		blocks, conv, err := FromQuantized(q)
		if err != nil {
			t.Fatalf("%d-bit group %d sym %v: %v", c.bits, c.group, c.sym, err)
		}
		if conv.Type != c.want || !conv.Exact || conv.MaxAbsErr != 0 {
			t.Errorf("%d-bit group %d sym %v: %+v, want exact %v", c.bits, c.group, c.sym, conv, c.want)
		}
		if rb, _ := c.want.RowBytes(q.Cols); len(blocks) != q.Rows*rb {
			t.Errorf("%d-bit: %d bytes, want %d", c.bits, len(blocks), q.Rows*rb)
		}
		if n, e := compareDequant(t, q, conv.Type, blocks); n != 0 {
			t.Errorf("%d-bit group %d sym %v → %v: %d elements differ (max %g)", c.bits, c.group, c.sym, conv.Type, n, e)
		}
	}
}

// TestFromCodesSymmetric drives the builders directly with lmpack's codes:
// symmetric 8-bit code c ↦ qs = c − 128, symmetric 4-bit code c ↦ nibble c.
func TestFromCodesSymmetric(t *testing.T) {
	q8 := rtn(t, 3, 64, 8, 32, true)
	codes8 := make([]int8, 3*64)
	for i, c := range q8.Codes { // 8-bit rows are one byte per code
		codes8[i] = int8(int(c) - 128)
	}
	b8, err := Q8_0FromCodes(codes8, q8.Scales)
	if err != nil {
		t.Fatal(err)
	}
	if n, e := compareDequant(t, q8, TypeQ8_0, b8); n != 0 {
		t.Errorf("Q8_0FromCodes: %d elements differ (max %g)", n, e)
	}
	q4 := rtn(t, 3, 64, 4, 32, true)
	codes4 := make([]uint8, 3*64)
	for r := 0; r < 3; r++ {
		weights.UnpackRow(codes4[r*64:(r+1)*64], q4.Codes[r*32:(r+1)*32], 4)
	}
	b4, err := Q4_0FromCodes(codes4, q4.Scales)
	if err != nil {
		t.Fatal(err)
	}
	if n, e := compareDequant(t, q4, TypeQ4_0, b4); n != 0 {
		t.Errorf("Q4_0FromCodes: %d elements differ (max %g)", n, e)
	}
	// lmpack's symmetric code 0 is −8·s and 15 is +7·s: Q4_0's own range.
	blk, _ := Q4_0FromCodes(append(make([]uint8, 31), 15), []uint16{0x3c00})
	y, _ := Dequantize(TypeQ4_0, blk, 32)
	if y[0] != -8 || y[31] != 7 {
		t.Errorf("codes 0, 15 with d = 1 decode to %g, %g; want −8, 7", y[0], y[31])
	}
}

// TestFromQuantizedAsymmetric4: 4-bit asymmetric grids go to Q4_1 with
// m = −s·z in fp16. Where fp16 holds s·z the block is exact; elsewhere
// every element of the block is off by the same |m − (−s·z)| ≤ half an
// fp16 ulp of s·z ≤ 2^−11·s·z.
func TestFromQuantizedAsymmetric4(t *testing.T) {
	q := rtn(t, 16, 128, 4, 32, false)
	blocks, conv, err := FromQuantized(q)
	if err != nil {
		t.Fatal(err)
	}
	if conv.Type != TypeQ4_1 {
		t.Fatalf("asymmetric 4-bit → %v, want Q4_1 (%s)", conv.Type, conv.Reason)
	}
	got, _ := Dequantize(TypeQ4_1, blocks, q.Cols)
	want := make([]float32, len(got))
	q.Dequantize(want)
	exactBlocks, maxErr := 0, 0.0
	for b := 0; b < len(got)/32; b++ {
		s := float64(safetensors.F16ToFloat32(q.Scales[b]))
		z := float64(safetensors.F16ToFloat32(q.Zeros[b]))
		bound := 0x1p-11 * s * z
		exact := true
		for i := 32 * b; i < 32*b+32; i++ {
			e := math.Abs(float64(got[i]) - float64(want[i]))
			if e > bound*(1+1e-6) {
				t.Fatalf("block %d element %d: |err| %g > 2^−11·s·z = %g", b, i, e, bound)
			}
			if e != 0 {
				exact = false
			}
			maxErr = math.Max(maxErr, e)
		}
		if exact {
			exactBlocks++
		}
	}
	t.Logf("asymmetric 4-bit group 32 → Q4_1: %d of %d blocks exact, max |err| %.3g (max scale·2^−11·15 = %.3g)", exactBlocks, len(got)/32, maxErr, 15*0x1p-11*float64(safetensors.F16ToFloat32(maxHalf(q.Scales))))
	if conv.MaxAbsErr != maxErr || conv.Exact != (maxErr == 0) {
		t.Errorf("Conversion %+v, measured max |err| %g", conv, maxErr)
	}
	if exactBlocks == 0 {
		t.Errorf("no exact block; z ∈ {0, 1, 2, 4, 8} blocks always are")
	}
}

func maxHalf(h []uint16) uint16 {
	var m uint16
	for _, v := range h {
		if safetensors.F16ToFloat32(v) > safetensors.F16ToFloat32(m) {
			m = v
		}
	}
	return m
}

// TestQ4_1FromZeros: the offset is exact for power-of-two zero-points and
// for a shifted nibble range that makes it so; otherwise the reported
// error is the true one and within half an fp16 ulp.
func TestQ4_1FromZeros(t *testing.T) {
	s := safetensors.F16FromFloat32(0.0123) // 11 significant bits
	codes := make([]uint8, 64)
	for i := range codes {
		codes[i] = uint8(i % 16) // both blocks use all 16 codes: no shift possible
	}
	for _, z := range []float32{0, 1, 2, 4, 8} {
		_, errs, err := Q4_1FromZeros(codes[:32], []uint16{s}, []uint16{safetensors.F16FromFloat32(z)})
		if err != nil || errs[0] != 0 {
			t.Errorf("z = %g: err %v, offset error %g; want exact", z, err, errs[0])
		}
	}
	blk, errs, err := Q4_1FromZeros(codes[:32], []uint16{s}, []uint16{safetensors.F16FromFloat32(7)})
	if err != nil {
		t.Fatal(err)
	}
	sv := float64(safetensors.F16ToFloat32(s))
	m := float64(safetensors.F16ToFloat32(uint16(blk[2]) | uint16(blk[3])<<8))
	if e := m + 7*sv; e != errs[0] || e == 0 || math.Abs(e) > 0x1p-11*7*sv {
		t.Errorf("z = 7: m %g, −s·z %g, error %g reported %g", m, -7*sv, e, errs[0])
	}
	// Codes 3..10 with z = 7: shifting the nibbles by k = 1 makes the
	// offset −s·8, exact.
	short := make([]uint8, 32)
	for i := range short {
		short[i] = uint8(3 + i%8)
	}
	blk, errs, err = Q4_1FromZeros(short, []uint16{s}, []uint16{safetensors.F16FromFloat32(7)})
	if err != nil || errs[0] != 0 {
		t.Fatalf("shifted: err %v, offset error %g; want exact", err, errs[0])
	}
	y, _ := Dequantize(TypeQ4_1, blk, 32)
	for i, c := range short {
		if want := float32(sv * (float64(c) - 7)); y[i] != want {
			t.Fatalf("shifted element %d = %g, want %g", i, y[i], want)
		}
	}
}

// TestFromQuantizedOneBit: the 1-bit grid's fractional zero-point goes to
// Q4_1 with the offset rounded to fp16; the error is reported.
func TestFromQuantizedOneBit(t *testing.T) {
	q := rtn(t, 4, 64, 1, 32, false)
	blocks, conv, err := FromQuantized(q)
	if err != nil {
		t.Fatal(err)
	}
	n, e := compareDequant(t, q, conv.Type, blocks)
	if conv.Type != TypeQ4_1 || conv.MaxAbsErr != e || conv.Exact != (n == 0) {
		t.Errorf("1-bit: %+v; measured %d differing, max %g", conv, n, e)
	}
	var maxS float64
	for _, h := range q.Scales {
		maxS = math.Max(maxS, float64(safetensors.F16ToFloat32(h)))
	}
	if e > maxS*0x1p-10 {
		t.Errorf("1-bit: max |err| %g > 2^−10·max scale %g", e, maxS)
	}
}

// TestFromQuantizedActOrder: a permutation that keeps every block of 32
// original columns inside one group is undone exactly; one that mixes
// groups is refused with ErrNotExact.
func TestFromQuantizedActOrder(t *testing.T) {
	const rows, cols = 8, 128
	r := rand.New(rand.NewPCG(3, 4))
	// Activations whose column c has scale (c/32 + 1): act-order
	// (decreasing H_ii) takes the blocks of 32 in reverse order (in any
	// order within a block), so storage group g is original columns
	// [cols−32(g+1), cols−32g).
	const ns = 512
	x := make([]float32, ns*cols)
	for i := range x {
		x[i] = float32(r.NormFloat64()) * float32(i%cols/32+1)
	}
	h := weights.NewHessian(cols)
	if err := h.Add(x, ns); err != nil {
		t.Fatal(err)
	}
	w := gaussian(9, rows, cols)
	q, err := weights.QuantizeGPTQ(w, rows, cols, h, weights.GPTQOptions{Options: weights.Options{Bits: 4, GroupSize: 32, Symmetric: true}, ActOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	if q.Perm == nil || q.Perm[0]/32 != cols/32-1 {
		t.Fatalf("expected an act-order permutation taking the last block first, got %v", q.Perm)
	}
	blocks, conv, err := FromQuantized(q)
	if err != nil {
		t.Fatal(err)
	}
	if n, e := compareDequant(t, q, conv.Type, blocks); n != 0 || !conv.Exact || conv.Type != TypeQ4_0 {
		t.Errorf("act-order within groups: %+v, %d elements differ (max %g)", conv, n, e)
	}
	// Swap two storage columns of different groups: no longer exact.
	q.Perm[0], q.Perm[40] = q.Perm[40], q.Perm[0]
	if _, _, err := FromQuantized(q); !errors.Is(err, ErrNotExact) {
		t.Errorf("act-order across groups: error %v, want ErrNotExact", err)
	}
}

func TestFromQuantizedRefusals(t *testing.T) {
	// 8-bit asymmetric: c − z spans up to [−255, 255], outside int8.
	q := rtn(t, 4, 64, 8, 32, false)
	if _, _, err := FromQuantized(q); !errors.Is(err, ErrNotExact) {
		t.Errorf("asymmetric 8-bit: error %v, want ErrNotExact", err)
	}
	// Per-channel groups over 48 columns: not whole blocks of 32.
	q = rtn(t, 2, 48, 4, 0, true)
	if _, _, err := FromQuantized(q); !errors.Is(err, ErrNotExact) {
		t.Errorf("48 columns: error %v, want ErrNotExact", err)
	}
	// Asymmetric 4-bit forced to Q4_0: refused unless every c − z + 8 fits.
	q = rtn(t, 4, 64, 4, 32, false)
	if _, _, err := FromQuantizedAs(q, TypeQ4_0); !errors.Is(err, ErrNotExact) {
		t.Errorf("asymmetric 4-bit as Q4_0: error %v, want ErrNotExact", err)
	}
	// …but Q8_0 holds it exactly.
	b, conv, err := FromQuantizedAs(q, TypeQ8_0)
	if err != nil || !conv.Exact {
		t.Errorf("asymmetric 4-bit as Q8_0: %+v, %v; want exact", conv, err)
	} else if n, _ := compareDequant(t, q, TypeQ8_0, b); n != 0 {
		t.Errorf("asymmetric 4-bit as Q8_0: %d elements differ", n)
	}
	if _, _, err := FromQuantizedAs(q, TypeQ4_K); !errors.Is(err, ErrType) {
		t.Errorf("as Q4_K: error %v, want ErrType", err)
	}
	q.Scales = q.Scales[:3]
	if _, _, err := FromQuantized(q); !errors.Is(err, ErrShape) {
		t.Errorf("short scales: error %v, want ErrShape", err)
	}
	// Builders: lengths and values.
	if _, err := Q8_0FromCodes(make([]int8, 64), []uint16{0x3c00}); !errors.Is(err, ErrShape) {
		t.Errorf("Q8_0FromCodes one scale for two blocks: %v", err)
	}
	if _, err := Q4_0FromCodes(make([]uint8, 31), []uint16{0x3c00}); !errors.Is(err, ErrShape) {
		t.Errorf("Q4_0FromCodes 31 codes: %v", err)
	}
	if _, err := Q4_0FromCodes(append(make([]uint8, 31), 16), []uint16{0x3c00}); !errors.Is(err, ErrValue) {
		t.Errorf("Q4_0FromCodes code 16: %v", err)
	}
	if _, err := Q4_1FromCodes(make([]uint8, 32), []uint16{0x7c00}, []uint16{0}); !errors.Is(err, ErrValue) {
		t.Errorf("Q4_1FromCodes infinite scale: %v", err)
	}
	if _, err := Q4_1FromCodes(make([]uint8, 32), []uint16{0x3c00}, nil); !errors.Is(err, ErrShape) {
		t.Errorf("Q4_1FromCodes no mins: %v", err)
	}
}
