package gguf

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
)

// TestRoundTrip writes metadata of every value type and three tensors
// and reads them back: values, dims, types, aligned offsets and data.
func TestRoundTrip(t *testing.T) {
	kvs := []KV{
		{"general.architecture", "llama"},
		{KeyAlignment, uint32(32)},
		{"u8", uint8(7)}, {"i8", int8(-3)}, {"u16", uint16(65535)}, {"i16", int16(-300)},
		{"u32", uint32(1 << 31)}, {"i32", int32(-5)}, {"f32", float32(1.5e-5)}, {"b", true},
		{"u64", uint64(1 << 40)}, {"i64", int64(-1 << 40)}, {"f64", 3.25},
		{"tokens", []string{"<unk>", "a", "", "ü"}},
		{"ids", []int32{1, -2, 3}},
		{"scores", []float32{0, -1.25}},
		{"flags", []bool{true, false}},
		{"empty", []uint64{}},
	}
	f32 := make([]byte, 4*3*5)
	for i := range f32 {
		f32[i] = byte(i)
	}
	q8 := make([]byte, 34*2)
	for i := range q8 {
		q8[i] = byte(255 - i)
	}
	norm := []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	infos := []TensorInfo{
		{Name: "a.weight", Dims: DimsOf([]int{3, 5}), Type: TypeF32},
		{Name: "n.weight", Dims: []uint64{3}, Type: TypeF32},
		{Name: "q.weight", Dims: DimsOf([]int{2, 32}), Type: TypeQ8_0},
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, kvs, infos)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range [][]byte{f32, norm, q8} {
		if err := w.WriteTensor(d); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	if string(b[:4]) != "GGUF" || binary.LittleEndian.Uint32(b[4:]) != 3 ||
		binary.LittleEndian.Uint64(b[8:]) != 3 || binary.LittleEndian.Uint64(b[16:]) != uint64(len(kvs)) {
		t.Fatalf("header % x", b[:24])
	}
	if len(b)%32 != 0 {
		t.Errorf("file size %d not a multiple of 32", len(b))
	}
	f, err := Read(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.KVs, kvs) {
		t.Errorf("KVs\n got %#v\nwant %#v", f.KVs, kvs)
	}
	if f.DataOffset%32 != 0 {
		t.Errorf("data offset %d", f.DataOffset)
	}
	wantOff := []uint64{0, 64, 96} // 60 bytes → 64; 12 bytes → 76 → 96
	for i, ti := range f.Tensors {
		if ti.Name != infos[i].Name || ti.Type != infos[i].Type || !reflect.DeepEqual(ti.Dims, infos[i].Dims) || ti.Offset != wantOff[i] {
			t.Errorf("tensor %d: %+v, want %+v at offset %d", i, ti, infos[i], wantOff[i])
		}
	}
	if got := f.Tensors[0].Dims; !reflect.DeepEqual(got, []uint64{5, 3}) {
		t.Errorf("dims of [3,5]: %v, want [5 3] (ne[0] contiguous)", got)
	}
	for i, d := range [][]byte{f32, norm, q8} {
		got, err := f.TensorData(infos[i].Name)
		if err != nil || !bytes.Equal(got, d) {
			t.Errorf("tensor %s data: %v (err %v)", infos[i].Name, got, err)
		}
	}
	// The padding between tensors is zero.
	for _, x := range b[f.DataOffset+60 : f.DataOffset+64] {
		if x != 0 {
			t.Errorf("padding byte %d", x)
		}
	}
}

func TestWriterErrors(t *testing.T) {
	info := func() []TensorInfo { return []TensorInfo{{Name: "x", Dims: []uint64{4}, Type: TypeF32}} }
	if _, err := NewWriter(&bytes.Buffer{}, []KV{{"a", 1}}, nil); err == nil || !strings.Contains(err.Error(), "unsupported value type int") {
		t.Errorf("Go int value: %v", err)
	}
	if _, err := NewWriter(&bytes.Buffer{}, []KV{{"a", "x"}, {"a", "y"}}, nil); err == nil || !strings.Contains(err.Error(), `duplicate metadata key "a"`) {
		t.Errorf("duplicate key: %v", err)
	}
	if _, err := NewWriter(&bytes.Buffer{}, nil, []TensorInfo{{Name: "q", Dims: []uint64{33}, Type: TypeQ8_0}}); err == nil || !strings.Contains(err.Error(), `"q"`) {
		t.Errorf("Q8_0 row of 33: %v", err)
	}
	w, err := NewWriter(&bytes.Buffer{}, nil, info())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor(make([]byte, 15)); err == nil || !strings.Contains(err.Error(), "15 bytes of data, want 16") {
		t.Errorf("short tensor: %v", err)
	}
	w, _ = NewWriter(&bytes.Buffer{}, nil, info())
	if err := w.Close(); err == nil || !strings.Contains(err.Error(), `0 of 1 tensors written (next: "x")`) {
		t.Errorf("Close before data: %v", err)
	}
}

func TestReadErrors(t *testing.T) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf, []KV{{"k", "v"}}, []TensorInfo{{Name: "x", Dims: []uint64{8}, Type: TypeF32}})
	w.WriteTensor(make([]byte, 32))
	w.Close()
	good := buf.Bytes()
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"magic", append([]byte("GGUG"), good[4:]...), "magic"},
		{"version", append(append([]byte("GGUF"), 2, 0, 0, 0), good[8:]...), "version 2"},
		{"truncated header", good[:30], "truncated"},
		{"truncated data", good[:len(good)-4], "past the end of the file"},
	} {
		if _, err := Read(bytes.NewReader(c.b), int64(len(c.b))); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// FuzzRead: Read never panics and either fails or returns infos whose data
// lies inside the file.
func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	w, _ := NewWriter(&buf, []KV{{"a", "b"}, {"ids", []int32{1, 2}}, {"s", []string{"x", "yz"}}}, []TensorInfo{{Name: "t", Dims: []uint64{32, 2}, Type: TypeQ8_0}})
	w.WriteTensor(make([]byte, 68))
	w.Close()
	f.Add(buf.Bytes())
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := Read(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		for _, ti := range g.Tensors {
			n, err := ti.Size()
			if err != nil || g.DataOffset+ti.Offset+n > uint64(len(b)) {
				t.Fatalf("tensor %q accepted past the end: %v", ti.Name, err)
			}
			if _, err := g.TensorData(ti.Name); err != nil {
				t.Fatal(err)
			}
		}
	})
}
