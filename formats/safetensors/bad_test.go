package safetensors

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// pad appends spaces to h up to a multiple of 8, as writers do.
func pad(h string) string {
	for len(h)%8 != 0 {
		h += " "
	}
	return h
}

func TestBadFiles(t *testing.T) {
	lenOnly := func(n uint64, total int) []byte {
		b := make([]byte, total)
		binary.LittleEndian.PutUint64(b, n)
		copy(b[8:], "{}")
		return b
	}
	cases := []struct {
		name   string
		file   []byte
		tensor string // must be named in the error ("" = none)
		want   string
	}{
		{"truncated", []byte{1, 2, 3, 4, 5}, "", "shorter than the 8-byte header length"},
		{"empty file", nil, "", "file is 0 bytes"},
		{"header past EOF", lenOnly(1000, 64), "", "header length 1000 runs past the end"},
		{"header huge", lenOnly(1<<40, 64), "", "not a safetensors file: header length 1099511627776 exceeds the limit"},
		{"text file", []byte("Once upon a time, there was a little girl.\n"), "", "not a safetensors file: header length"},
		{"header max uint64", lenOnly(^uint64(0), 64), "", "exceeds the limit"},
		{"invalid JSON", rawFile(`{"a":`, nil), "", "invalid JSON header"},
		{"not an object", rawFile(`[1,2]   `, nil), "", "does not start with '{'"},
		{"trailing garbage", rawFile(`{} x`, nil), "", "unexpected data after the JSON object"},
		{"not UTF-8", rawFile("{\"\xff\":1}", nil), "", "not valid UTF-8"},
		{"duplicate key", rawFile(pad(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`), nil), "", `duplicate key "a"`},
		{"overlap", rawFile(pad(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`), make([]byte, 12)), "b", `overlap tensor "a", which ends at 8`},
		{"gap", rawFile(pad(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`), make([]byte, 12)), "b", "leave a gap"},
		{"gap at start", rawFile(pad(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`), make([]byte, 8)), "a", "leave a gap"},
		{"out of range", rawFile(pad(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`), make([]byte, 8)), "a", "end past the data section of 8 bytes"},
		{"untracked tail", rawFile(pad(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`), make([]byte, 8)), "", "tensors cover 4 bytes but the data section has 8"},
		{"size mismatch", rawFile(pad(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`), make([]byte, 8)), "a", "hold 8 bytes but F32 [3] needs 12"},
		{"unknown dtype", rawFile(pad(`{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}`), make([]byte, 1)), "a", `unknown dtype "F4"`},
		{"negative dim", rawFile(pad(`{"a":{"dtype":"U8","shape":[2,-3],"data_offsets":[0,0]}}`), nil), "a", "dim 1 is negative"},
		{"fractional dim", rawFile(pad(`{"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}}`), make([]byte, 2)), "a", "want an integer"},
		{"string dim", rawFile(pad(`{"a":{"dtype":"U8","shape":["2"],"data_offsets":[0,2]}}`), make([]byte, 2)), "a", "want an integer"},
		{"null shape", rawFile(pad(`{"a":{"dtype":"U8","shape":null,"data_offsets":[0,1]}}`), make([]byte, 1)), "a", "not a JSON array"},
		{"count overflow", rawFile(pad(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}}`), nil), "a", "overflows"},
		{"offsets reversed", rawFile(pad(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}}`), make([]byte, 8)), "a", "[8,4) out of order"},
		{"negative offset", rawFile(pad(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[-4,0]}}`), nil), "a", "out of order"},
		{"three offsets", rawFile(pad(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4,8]}}`), make([]byte, 4)), "a", "has 3 values, want 2"},
		{"missing offsets", rawFile(pad(`{"a":{"dtype":"U8","shape":[4]}}`), make([]byte, 4)), "a", `missing "data_offsets"`},
		{"missing dtype", rawFile(pad(`{"a":{"shape":[4],"data_offsets":[0,4]}}`), make([]byte, 4)), "a", `missing "dtype"`},
		{"extra key", rawFile(pad(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1}}`), make([]byte, 4)), "a", `unexpected key "x"`},
		{"entry not object", rawFile(pad(`{"a":[1]}`), nil), "a", "not a JSON object"},
		{"metadata not string", rawFile(pad(`{"__metadata__":{"k":1}}`), nil), "", `__metadata__: value of "k"`},
	}
	dir := t.TempDir()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, "bad"+string(rune('a'+i%26))+strings.Repeat("x", i/26)+".safetensors")
			if err := os.WriteFile(p, c.file, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := Open(p)
			if f != nil {
				f.Close()
			}
			parts := []string{"safetensors: " + p + ": ", c.want}
			if c.tensor != "" {
				parts = append(parts, `tensor "`+c.tensor+`"`)
			}
			wantErr(t, err, parts...)
			if !errors.Is(err, ErrFormat) {
				t.Errorf("error %v does not wrap ErrFormat", err)
			}
			// The in-memory parser gives the same verdict.
			_, err2 := FromBytes(p, c.file)
			if err2 == nil || err2.Error() != err.Error() {
				t.Errorf("FromBytes: %v\nOpen:      %v", err2, err)
			}
		})
	}
}

func TestValidEdgeCases(t *testing.T) {
	// Empty tensors may sit anywhere, including at the same offset; tensors
	// may be listed in any order; trailing whitespace and newlines pad the
	// header; a file with no tensors has an empty data section.
	hdr := pad(`{"z":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"e1":{"dtype":"BF16","shape":[0,5],"data_offsets":[4,4]},` +
		`"e2":{"dtype":"I8","shape":[3,0],"data_offsets":[4,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"s":{"dtype":"I16","shape":[],"data_offsets":[6,8]}}` + "\n")
	data := []byte{0, 0, 0x80, 0x3f, 9, 10, 0xfe, 0xff}
	f, err := FromBytes("mem", rawFile(hdr, data))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ti := range f.Tensors() {
		names = append(names, ti.Name)
	}
	if strings.Join(names, ",") != "b,e1,e2,s,z" {
		t.Errorf("names %v, want sorted b,e1,e2,s,z", names)
	}
	s, _ := f.Tensor("s")
	if v, err := s.Float32(); err != nil || len(v) != 1 || v[0] != -2 {
		t.Errorf("0-d I16 = %v (%v), want [-2]", v, err)
	}
	e, _ := f.Tensor("e1")
	if v, err := e.Float32(); err != nil || len(v) != 0 || e.NumElements() != 0 {
		t.Errorf("empty tensor = %v (%v)", v, err)
	}
	if _, err := FromBytes("mem", rawFile(pad("{}"), nil)); err != nil {
		t.Errorf("empty header rejected: %v", err)
	}
}

func TestMissingTensorAndClosed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "m.safetensors")
	if err := WriteFile(p, []WriteTensor{FromFloat32("a", []int{1}, []float32{1})}, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Tensor("nope")
	wantErr(t, err, p, `tensor "nope"`)
	if !errors.Is(err, ErrMissingTensor) {
		t.Errorf("%v does not wrap ErrMissingTensor", err)
	}
	_, err = f.Info("nope")
	if !errors.Is(err, ErrMissingTensor) {
		t.Errorf("Info: %v does not wrap ErrMissingTensor", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	_, err = f.Tensor("a")
	if !errors.Is(err, ErrClosed) {
		t.Errorf("Tensor after Close: %v, want ErrClosed", err)
	}
	_, err = Open(filepath.Join(t.TempDir(), "absent.safetensors"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open(absent) = %v, want os.ErrNotExist", err)
	}
}
