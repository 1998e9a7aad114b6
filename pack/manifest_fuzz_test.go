package pack

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzManifest: arbitrary manifest bytes never panic the strict decoder,
// the model conversion (Description, with quantized tensors), the
// quantized-tensor index and the section agreement check (here against
// no sections), or the KV scheme reader (KVCache,
// here without sections, so any rotation it names is missing); a
// manifest that decodes re-encodes to one that decodes to the same
// encoding.
func FuzzManifest(f *testing.F) {
	m := Manifest{FormatVersion: FormatVersion, Files: []FileEntry{}, Tensors: []TensorEntry{{Name: "a", Section: "a", DType: "F32", Shape: []int{8, 8}}},
		KV:    &KVScheme{Cache: "oscar2", Method: "oscar", Rotations: []KVRotations{{Layer: 0, K: "a", V: "a"}}, ClipK: []float64{0.9}, Sink: 4},
		Model: Model{Layers: []Layer{{NumAttentionHeads: 1, NumKeyValueHeads: 1, HeadDim: 8}}}}
	seed, _ := json.Marshal(m)
	f.Add(seed)
	f.Add([]byte(`{"format_version":1,"kv":{"cache":"kivi2"}}`))
	f.Add([]byte(`{"format_version":2,"weights_method":"gptq","tensors":[{"name":"w.weight","section":"w.qweight","dtype":"U8","shape":[4,64],` +
		`"quant":{"bits":4,"group_size":32,"scale_dtype":"F16","scale_section":"w.scales","zero_dtype":"F16","zero_section":"w.qzeros",` +
		`"perm_section":"w.perm","packing_order":"lsb_first"}}]}`))
	f.Add([]byte(`{"format_version":1,"tensors":[{"name":"w.weight","section":"w","dtype":"U8","shape":[4,64],"quant":{"bits":4}}]}`))
	f.Add([]byte(`{"format_version":1,"kv":{"cache":"oscar2","rotations":[{"layer":3,"k":"x","v":"y"}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeManifest("fuzz", b)
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrVersion) {
				t.Fatalf("decode error not ErrFormat/ErrVersion: %v", err)
			}
			return
		}
		r := &Reader{path: "fuzz", manifest: m, l: &layout{index: map[string]int{}}}
		r.storage, _ = storageIndex(m)
		r.Description()
		r.TensorInfos()
		r.Unconsumed()
		agreement(m, r.l)
		if _, _, err := r.KVCache(); err == nil && m.KV != nil && len(m.KV.Rotations) > 0 {
			t.Fatalf("KVCache read %d rotations without sections", len(m.KV.Rotations))
		}
		enc, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := decodeManifest("fuzz", enc)
		if err != nil {
			t.Fatalf("re-encoded manifest does not decode: %v\n%s", err, enc)
		}
		enc2, _ := json.Marshal(m2)
		if string(enc) != string(enc2) {
			t.Fatalf("encoding not stable:\n%s\n%s", enc, enc2)
		}
	})
}
