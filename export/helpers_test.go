package export

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/gguf"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

// writeQuantCheckpoint writes an lmpack-wq checkpoint (docs/QUANT.md) in
// a temporary directory from the checkpoint src: every 2-D weight for
// which choose returns options is RTN-quantized with them, the rest copied
// in their dtype; config.json gets the lmpack_quantization block and the
// tokenizer files are copied.
func writeQuantCheckpoint(t *testing.T, src string, choose func(name string, rows, cols int) *weights.Options) string {
	t.Helper()
	return writeQuantCheckpointPerm(t, src, choose, nil)
}

// writeQuantCheckpointPerm is writeQuantCheckpoint with an act-order
// column permutation: where permFor returns one, storage column j holds
// original column perm[j] (the weight's columns are permuted before RTN
// and NAME.perm is stored).
func writeQuantCheckpointPerm(t *testing.T, src string, choose func(name string, rows, cols int) *weights.Options, permFor func(name string, cols int) []int32) string {
	t.Helper()
	dir := t.TempDir()
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	d, err := arch.Load(src)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, n := range d.TensorNames() {
		known[n] = true
	}
	tensors := map[string]any{}
	var out []safetensors.WriteTensor
	names := ck.Names()
	sort.Strings(names)
	for _, n := range names {
		tt, err := ck.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		var o *weights.Options
		if len(tt.Shape) == 2 && n != d.Embedding && known[n] {
			o = choose(n, tt.Shape[0], tt.Shape[1])
		}
		if o == nil {
			out = append(out, safetensors.WriteTensor{Name: n, DType: tt.DType, Shape: tt.Shape, Data: append([]byte(nil), tt.Data...)})
			continue
		}
		v, err := tt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		var perm []int32
		if permFor != nil {
			perm = permFor(n, tt.Shape[1])
		}
		if perm != nil {
			rows, cols := tt.Shape[0], tt.Shape[1]
			pv := make([]float32, len(v))
			for r := 0; r < rows; r++ {
				for j, c := range perm {
					pv[r*cols+j] = v[r*cols+int(c)]
				}
			}
			v = pv
		}
		q, err := weights.QuantizeRTN(v, tt.Shape[0], tt.Shape[1], *o)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		p := arch.QuantPrefix(n)
		if perm != nil {
			pb := make([]byte, 4*len(perm))
			for j, c := range perm {
				binary.LittleEndian.PutUint32(pb[4*j:], uint32(c))
			}
			out = append(out, safetensors.WriteTensor{Name: p + arch.SuffixPerm, DType: safetensors.I32, Shape: []int{len(perm)}, Data: pb})
		}
		g := q.Cols / q.GroupSize
		out = append(out, safetensors.WriteTensor{Name: p + arch.SuffixQWeight, DType: safetensors.U8, Shape: []int{q.Rows, weights.RowBytes(q.Cols, q.Bits)}, Data: q.Codes},
			safetensors.WriteTensor{Name: p + arch.SuffixScales, DType: safetensors.F16, Shape: []int{q.Rows, g}, Data: u16Bytes(q.Scales)})
		if !q.Symmetric {
			out = append(out, safetensors.WriteTensor{Name: p + arch.SuffixQZeros, DType: safetensors.F16, Shape: []int{q.Rows, g}, Data: u16Bytes(q.Zeros)})
		}
		tensors[n] = map[string]any{"bits": q.Bits, "group_size": q.GroupSize, "symmetric": q.Symmetric, "perm": perm != nil}
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), out, nil); err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(src, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg[arch.QuantKey] = map[string]any{"format": arch.QuantFormat, "version": arch.QuantVersion, "method": "rtn", "tensors": tensors}
	b, _ = json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"} {
		if b, err := os.ReadFile(filepath.Join(src, f)); err == nil {
			os.WriteFile(filepath.Join(dir, f), b, 0o644)
		}
	}
	return dir
}

func u16Bytes(v []uint16) []byte {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return b
}

// openGGUF opens a written GGUF file for the test.
func openGGUF(t *testing.T, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func kv(t *testing.T, f *gguf.File, key string) any {
	t.Helper()
	v, ok := f.Get(key)
	if !ok {
		t.Errorf("metadata %q missing", key)
	}
	return v
}

func descForTokenizer(modelType string) *arch.Description {
	return &arch.Description{ModelType: modelType, BOSTokenID: -1}
}
