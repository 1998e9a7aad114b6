package oscar

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/model"
)

// FuzzReadFile: an arbitrary "lmpack" header over two valid layers of
// rotations (head_dim 4) never panics ReadFile; it is refused with one of
// ReadFile's sentinels, or accepted with every clip list of one ratio in
// (0, 1] per layer (the 4- and 8-bit ones possibly absent) and widths of
// 2, 4 or 8 bits (both lists or none); an accepted header written again
// by WriteFile reads back the same.
func FuzzReadFile(f *testing.F) {
	good := RotationHeader{FormatVersion: FormatVersion, Kind: Kind, Method: Method, ClipK: []float64{0.96, 0.96}, ClipV: []float64{0.92, 0.92}}
	seed, _ := json.Marshal(good)
	f.Add(seed)
	mixed := good
	mixed.ClipK4, mixed.ClipV8 = []float64{1, 0.98}, []float64{0.99, 1}
	mixed.BitsK, mixed.BitsV = []int{2, 8}, []int{4, 2}
	mixed.KVBits, mixed.KVServingCtx, mixed.KVRecent = 3, 32768, 64
	seed, _ = json.Marshal(mixed)
	f.Add(seed)
	f.Add([]byte(`{"format_version":1,"kind":"lmpack-kv-rotation","method":"oscar","clip_k":[1,1],"clip_v":[1,1],"bits_k":[2,3],"bits_v":[2,2],"kv_bits":3,"kv_serving_ctx":1}`))
	f.Add([]byte(`{"format_version":1,"kind":"lmpack-kv-rotation","method":"oscar","clip_k":[1,1],"clip_v":[1,1],"clip_k4":[1]}`))
	const d = 4
	id := make([]float32, d*d)
	for i := 0; i < d; i++ {
		id[i*d+i] = 1
	}
	var ts []safetensors.WriteTensor
	var layers []Layer
	for l := 0; l < 2; l++ {
		ts = append(ts, safetensors.FromFloat32(TensorName(l, "r_k"), []int{d, d}, id), safetensors.FromFloat32(TensorName(l, "r_v"), []int{d, d}, id))
		r := make([]float64, d*d)
		for i := range r {
			r[i] = float64(id[i])
		}
		layers = append(layers, Layer{HeadDim: d, RK: r, RV: r})
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, header []byte) {
		p := filepath.Join(dir, "r.safetensors")
		if err := safetensors.WriteFile(p, ts, map[string]string{model.MetadataKey: string(header)}); err != nil {
			t.Skip(err) // not storable as safetensors metadata
		}
		r, h, err := ReadFile(p, model.Expect{})
		if err != nil {
			if !errors.Is(err, ErrNotRotation) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrBadRotation) {
				t.Fatalf("error without a sentinel: %v", err)
			}
			return
		}
		L := len(r.K)
		if L != 2 || len(h.ClipK) != L || len(h.ClipV) != L {
			t.Fatalf("accepted %d layers, %d clip_k, %d clip_v", L, len(h.ClipK), len(h.ClipV))
		}
		for _, c := range [][]float64{h.ClipK, h.ClipV, h.ClipK4, h.ClipV4, h.ClipK8, h.ClipV8} {
			if c != nil && len(c) != L {
				t.Fatalf("accepted a clip list of %d for %d layers", len(c), L)
			}
			for _, x := range c {
				if !(x > 0 && x <= 1) {
					t.Fatalf("accepted ratio %v", x)
				}
			}
		}
		if (h.BitsK == nil) != (h.BitsV == nil) {
			t.Fatalf("accepted bits_k %v with bits_v %v", h.BitsK, h.BitsV)
		}
		for _, b := range slices.Concat(h.BitsK, h.BitsV) {
			if !slices.Contains(Widths, b) {
				t.Fatalf("accepted width %d", b)
			}
		}
		q := filepath.Join(dir, "again.safetensors")
		if err := WriteFile(q, *h, layers); err != nil {
			t.Fatalf("WriteFile refused an accepted header: %v", err)
		}
		_, h2, err := ReadFile(q, model.Expect{})
		if err != nil {
			t.Fatalf("rewritten file refused: %v", err)
		}
		a, _ := json.Marshal(h)
		b, _ := json.Marshal(h2)
		if string(a) != string(b) {
			t.Fatalf("header changed on rewrite:\n%s\n%s", a, b)
		}
	})
}
