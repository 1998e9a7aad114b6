package safetensors

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	nlp "github.com/nlpodyssey/safetensors"
)

// refDecode converts little-endian data of dt to float64 values with the
// independent reference decoders of helpers_test.go.
func refDecode(dt DType, data []byte) []float64 {
	var out []float64
	switch dt {
	case F32:
		for i := 0; i < len(data); i += 4 {
			out = append(out, float64(math.Float32frombits(binary.LittleEndian.Uint32(data[i:]))))
		}
	case F64:
		for i := 0; i < len(data); i += 8 {
			out = append(out, math.Float64frombits(binary.LittleEndian.Uint64(data[i:])))
		}
	case F16, BF16:
		ref := refF16
		if dt == BF16 {
			ref = refBF16
		}
		for i := 0; i < len(data); i += 2 {
			out = append(out, ref(binary.LittleEndian.Uint16(data[i:])))
		}
	case F8E4M3, F8E5M2:
		ref := refE4M3
		if dt == F8E5M2 {
			ref = refE5M2
		}
		for _, b := range data {
			out = append(out, ref(b))
		}
	case I8:
		for _, b := range data {
			out = append(out, float64(int8(b)))
		}
	case U8:
		for _, b := range data {
			out = append(out, float64(b))
		}
	case Bool:
		for _, b := range data {
			out = append(out, float64(min(b, 1)))
		}
	case I16:
		for i := 0; i < len(data); i += 2 {
			out = append(out, float64(int16(binary.LittleEndian.Uint16(data[i:]))))
		}
	case U16:
		for i := 0; i < len(data); i += 2 {
			out = append(out, float64(binary.LittleEndian.Uint16(data[i:])))
		}
	case I32:
		for i := 0; i < len(data); i += 4 {
			out = append(out, float64(int32(binary.LittleEndian.Uint32(data[i:]))))
		}
	case U32:
		for i := 0; i < len(data); i += 4 {
			out = append(out, float64(binary.LittleEndian.Uint32(data[i:])))
		}
	case I64:
		for i := 0; i < len(data); i += 8 {
			out = append(out, float64(int64(binary.LittleEndian.Uint64(data[i:]))))
		}
	case U64:
		for i := 0; i < len(data); i += 8 {
			out = append(out, float64(binary.LittleEndian.Uint64(data[i:])))
		}
	}
	return out
}

var allDTypes = []DType{F64, F32, F16, BF16, F8E4M3, F8E5M2, I64, I32, I16, I8, U64, U32, U16, U8, Bool}

// sampleTensors returns one tensor per dtype with seeded random bytes (small
// integer values for the 64-bit and 32-bit integer types so float32 holds
// them exactly), a 0-d F32 scalar, an empty tensor and a streamed tensor.
func sampleTensors() []WriteTensor {
	r := rand.New(rand.NewPCG(7, 8))
	var ts []WriteTensor
	for i, dt := range allDTypes {
		shape := []int{3, 1 + i%4}
		nb := 3 * (1 + i%4) * dt.Size()
		data := make([]byte, nb)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		switch dt {
		case I64, U64, I32, U32, F64:
			// keep values float32-exact: zero the high bytes of each element
			s := dt.Size()
			for j := 0; j < nb; j += s {
				clear(data[j+2 : j+s])
				if dt == F64 { // a finite double: 1.5 × 2^k
					binary.LittleEndian.PutUint64(data[j:], math.Float64bits(math.Ldexp(1.5, int(data[j])%60-30)))
				}
			}
		case Bool:
			for j := range data {
				data[j] &= 1
			}
		}
		ts = append(ts, WriteTensor{Name: "t." + string(dt), DType: dt, Shape: shape, Data: data})
	}
	ts = append(ts,
		FromFloat32("scalar", []int{}, []float32{-2.75}),
		WriteTensor{Name: "empty", DType: F16, Shape: []int{4, 0}},
		WriteTensor{Name: "streamed", DType: F32, Shape: []int{2, 2}, WriteTo: func(w io.Writer) error {
			// written in two pieces to exercise the byte counting
			b := F32Bytes([]float32{1, 2, 3, 4})
			if _, err := w.Write(b[:5]); err != nil {
				return err
			}
			_, err := w.Write(b[5:])
			return err
		}},
	)
	return ts
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rt.safetensors")
	ts := sampleTensors()
	meta := map[string]string{"format": "pt", "note": "<round & trip>"}
	if err := WriteFile(path, ts, meta); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := f.Metadata(); len(got) != 2 || got["format"] != "pt" || got["note"] != "<round & trip>" {
		t.Errorf("metadata = %v, want %v", got, meta)
	}
	infos := f.Tensors()
	if len(infos) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(infos), len(ts))
	}
	if !slices.IsSortedFunc(infos, func(a, b TensorInfo) int { return cmpString(a.Name, b.Name) }) {
		t.Errorf("Tensors() not sorted by name")
	}
	for _, w := range ts {
		got, err := f.Tensor(w.Name)
		if err != nil {
			t.Fatal(err)
		}
		want := w.Data
		if w.WriteTo != nil {
			var buf bytes.Buffer
			w.WriteTo(&buf)
			want = buf.Bytes()
		}
		if got.DType != w.DType || !slices.Equal(got.Shape, w.Shape) || !bytes.Equal(got.Data, want) || got.File != path || got.Name != w.Name {
			t.Errorf("%s: got %s %v %d bytes, want %s %v %d bytes", w.Name, got.DType, got.Shape, len(got.Data), w.DType, w.Shape, len(want))
			continue
		}
		vals, err := got.Float32()
		if err != nil {
			t.Fatal(err)
		}
		ref := refDecode(w.DType, want)
		if len(vals) != got.NumElements() || len(ref) != len(vals) {
			t.Fatalf("%s: %d values, NumElements %d, reference %d", w.Name, len(vals), got.NumElements(), len(ref))
		}
		for i := range vals {
			if !sameFloat(vals[i], float64(float32(ref[i]))) && !(math.IsNaN(ref[i]) && math.IsNaN(float64(vals[i]))) {
				t.Errorf("%s[%d] = %v, want %v", w.Name, i, vals[i], ref[i])
				break
			}
		}
	}
	sc, _ := f.Tensor("scalar")
	if v, _ := sc.Float32(); len(sc.Shape) != 0 || len(v) != 1 || v[0] != -2.75 {
		t.Errorf("scalar: shape %v values %v, want [] [-2.75]", sc.Shape, v)
	}
	// header sanity: 8-aligned and the data section starts right after
	raw, _ := os.ReadFile(path)
	if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestWriteDeterministic(t *testing.T) {
	dir := t.TempDir()
	ts := sampleTensors()
	meta := map[string]string{"b": "2", "a": "1", "c": "3"}
	p1 := filepath.Join(dir, "one.safetensors")
	p2 := filepath.Join(dir, "two.safetensors")
	if err := WriteFile(p1, ts, meta); err != nil {
		t.Fatal(err)
	}
	rev := slices.Clone(ts)
	slices.Reverse(rev)
	if err := WriteFile(p2, rev, map[string]string{"c": "3", "a": "1", "b": "2"}); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(p1)
	b2, _ := os.ReadFile(p2)
	if h1, h2 := sha256.Sum256(b1), sha256.Sum256(b2); h1 != h2 {
		t.Errorf("same tensors in another order give different files: %x vs %x", h1, h2)
	}
}

func TestWriteHeaderLayout(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.safetensors")
	err := WriteFile(p, []WriteTensor{
		FromFloat32("b", []int{2}, []float32{1, 2}),
		{Name: "a<&>", DType: U8, Shape: []int{}, Data: []byte{7}},
	}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	hdr := `{"__metadata__":{"format":"pt"},"a<&>":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}}`
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	want := rawFile(hdr, append([]byte{7}, F32Bytes([]float32{1, 2})...))
	if !bytes.Equal(raw, want) {
		t.Errorf("file bytes\n%q\nwant\n%q", raw, want)
	}
}

// TestCrossCheckWriterWithNlpodyssey reads a file written by WriteFile with
// the independent nlpodyssey reader (which knows no FP8, so those are left
// out) and compares names, dtypes, shapes and bytes.
func TestCrossCheckWriterWithNlpodyssey(t *testing.T) {
	var ts []WriteTensor
	for _, w := range sampleTensors() {
		if w.DType != F8E4M3 && w.DType != F8E5M2 {
			ts = append(ts, w)
		}
	}
	p := filepath.Join(t.TempDir(), "x.safetensors")
	if err := WriteFile(p, ts, map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	st, err := nlp.Deserialize(raw)
	if err != nil {
		t.Fatalf("nlpodyssey rejects our file: %v", err)
	}
	if st.Len() != len(ts) {
		t.Fatalf("nlpodyssey sees %d tensors, want %d", st.Len(), len(ts))
	}
	for _, w := range ts {
		tv, ok := st.Tensor(w.Name)
		if !ok {
			t.Fatalf("nlpodyssey lacks %q", w.Name)
		}
		want := w.Data
		if w.WriteTo != nil {
			var buf bytes.Buffer
			w.WriteTo(&buf)
			want = buf.Bytes()
		}
		shape := make([]int, len(tv.Shape()))
		for i, d := range tv.Shape() {
			shape[i] = int(d)
		}
		if tv.DType().String() != string(w.DType) || !slices.Equal(shape, w.Shape) || !bytes.Equal(tv.Data(), want) {
			t.Errorf("%s: nlpodyssey sees %s %v %d bytes, want %s %v %d bytes", w.Name, tv.DType(), shape, len(tv.Data()), w.DType, w.Shape, len(want))
		}
	}
}

func TestWriteAtomicFailure(t *testing.T) {
	boom := errors.New("source failed")
	cases := []struct {
		name    string
		writeTo func(io.Writer) error
		want    string
	}{
		{"error", func(w io.Writer) error { w.Write(make([]byte, 3)); return boom }, "source failed"},
		{"short", func(w io.Writer) error { _, err := w.Write(make([]byte, 7)); return err }, "wrote 7 bytes, want 8"},
		{"long", func(w io.Writer) error { _, err := w.Write(make([]byte, 9)); return err }, "more than the 8 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "out.safetensors")
			err := WriteFile(p, []WriteTensor{
				FromFloat32("a", []int{1}, []float32{1}),
				{Name: "b", DType: F32, Shape: []int{2}, WriteTo: c.writeTo},
			}, nil)
			wantErr(t, err, p, `tensor "b"`, c.want)
			if c.name == "error" && !errors.Is(err, boom) {
				t.Errorf("error %v does not wrap the WriteTo error", err)
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) != 0 {
				t.Errorf("directory holds %v after a failed write, want nothing", ents)
			}
		})
	}
	// A failed write leaves an existing file untouched.
	dir := t.TempDir()
	p := filepath.Join(dir, "out.safetensors")
	if err := WriteFile(p, []WriteTensor{FromFloat32("a", []int{1}, []float32{1})}, nil); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(p)
	err := WriteFile(p, []WriteTensor{{Name: "a", DType: F32, Shape: []int{1}, WriteTo: func(io.Writer) error { return boom }}}, nil)
	if err == nil {
		t.Fatal("want an error")
	}
	after, _ := os.ReadFile(p)
	ents, _ := os.ReadDir(dir)
	if !bytes.Equal(before, after) || len(ents) != 1 {
		t.Errorf("failed overwrite changed the file or left %d entries", len(ents))
	}
}

func TestWriteValidation(t *testing.T) {
	p := filepath.Join(t.TempDir(), "v.safetensors")
	f32 := FromFloat32("a", []int{2}, []float32{1, 2})
	cases := []struct {
		name string
		ts   []WriteTensor
		want []string
	}{
		{"duplicate", []WriteTensor{f32, f32}, []string{`tensor "a"`, "duplicate name"}},
		{"reserved", []WriteTensor{{Name: "__metadata__", DType: U8, Shape: []int{0}}}, []string{"reserved"}},
		{"empty name twice", []WriteTensor{{Name: "", DType: U8, Shape: []int{0}}, {Name: "", DType: U8, Shape: []int{0}}}, []string{`tensor ""`, "duplicate name"}},
		{"dtype", []WriteTensor{{Name: "x", DType: "F4", Shape: []int{0}}}, []string{`tensor "x"`, `unknown dtype "F4"`}},
		{"length", []WriteTensor{{Name: "x", DType: F16, Shape: []int{3}, Data: make([]byte, 4)}}, []string{`tensor "x"`, "Data has 4 bytes, want 6"}},
		{"negative", []WriteTensor{{Name: "x", DType: F16, Shape: []int{-1}}}, []string{`tensor "x"`, "negative"}},
		{"overflow", []WriteTensor{{Name: "x", DType: F64, Shape: []int{1 << 31, 1 << 31, 8}}}, []string{`tensor "x"`, "overflows"}},
		{"both", []WriteTensor{{Name: "x", DType: U8, Shape: []int{1}, Data: []byte{1}, WriteTo: func(io.Writer) error { return nil }}}, []string{"both Data and WriteTo"}},
		{"neither", []WriteTensor{{Name: "x", DType: U8, Shape: []int{1}}}, []string{"Data has 0 bytes, want 1"}},
		{"bad utf8", []WriteTensor{{Name: "x\xff", DType: U8, Shape: []int{0}}}, []string{"UTF-8"}},
	}
	for _, c := range cases {
		err := WriteFile(p, c.ts, nil)
		wantErr(t, err, append(c.want, p)...)
		if _, serr := os.Stat(p); serr == nil {
			t.Fatalf("%s: file written despite the error", c.name)
		}
	}
	if _, err := FromFloat32As("x", F8E4M3, []int{1}, []float32{1}); err == nil {
		t.Errorf("FromFloat32As(F8_E4M3) succeeded, want an error")
	}
	for _, dt := range []DType{F32, F16, BF16} {
		w, err := FromFloat32As("x", dt, []int{3}, []float32{1, -0.5, 3.140625})
		if err != nil {
			t.Fatal(err)
		}
		tn := &Tensor{Name: "x", DType: w.DType, Shape: w.Shape, Data: w.Data}
		v, err := tn.Float32()
		if err != nil || !slices.Equal(v, []float32{1, -0.5, 3.140625}) {
			t.Errorf("FromFloat32As(%s) decodes to %v (%v)", dt, v, err)
		}
	}
}
