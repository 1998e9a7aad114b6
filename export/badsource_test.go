package export

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/pack"
)

// copyDir copies the regular files of src into a new directory dst.
func copyDir(t *testing.T, src, dst string) string {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	es, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// poison writes a NaN into the first element of the F32 tensor name of
// the single-file checkpoint dir, locating it through the safetensors
// header (8-byte length, JSON with data_offsets relative to its end).
func poison(t *testing.T, dir, name string) {
	t.Helper()
	p := filepath.Join(dir, "model.safetensors")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	n := int(binary.LittleEndian.Uint64(b))
	var h map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	var e struct {
		DType   string `json:"dtype"`
		Offsets []int  `json:"data_offsets"`
	}
	if err := json.Unmarshal(h[name], &e); err != nil || e.DType != "F32" {
		t.Fatalf("tensor %s: %v %+v", name, err, e)
	}
	binary.LittleEndian.PutUint32(b[8+n+e.Offsets[0]:], math.Float32bits(float32(math.NaN())))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestExportRefusesWhatTheLoaderRefuses: both formats refuse a float
// weight holding NaN and a checkpoint with a tensor config.json does not
// describe (the loader's checks, as run and pack apply them), and an
// artifact that does not verify; nothing is written.
func TestExportRefusesWhatTheLoaderRefuses(t *testing.T) {
	src := shared.Path(t, "stories260K-hf")
	tmp := t.TempDir()

	nan := copyDir(t, src, filepath.Join(tmp, "nan"))
	poison(t, nan, "model.layers.2.mlp.up_proj.weight")
	if _, err := GGUF(context.Background(), nan, GGUFOptions{Out: filepath.Join(tmp, "nan.gguf")}); err == nil || !strings.Contains(err.Error(), "model.layers.2.mlp.up_proj.weight") || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("GGUF of a NaN weight: %v, want an error naming the tensor and NaN", err)
	}
	if _, err := CompressedTensors(context.Background(), nan, CTOptions{Out: filepath.Join(tmp, "nan-ct")}); err == nil || !strings.Contains(err.Error(), "model.layers.2.mlp.up_proj.weight") || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("compressed-tensors of a NaN weight: %v, want an error naming the tensor and NaN", err)
	}

	// An extra tensor (a bias the Llama config does not have).
	extra := copyDir(t, src, filepath.Join(tmp, "extra"))
	ck, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	var ws []safetensors.WriteTensor
	for _, ti := range ck.Tensors() {
		n := ti.Name
		tn, err := ck.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, safetensors.WriteTensor{Name: n, DType: tn.DType, Shape: tn.Shape, Data: tn.Data})
	}
	bias := make([]byte, 4*64)
	ws = append(ws, safetensors.WriteTensor{Name: "model.layers.0.self_attn.q_proj.bias", DType: safetensors.F32, Shape: []int{64}, Data: bias})
	if err := safetensors.WriteFile(filepath.Join(extra, "model.safetensors"), ws, nil); err != nil {
		t.Fatal(err)
	}
	ck.Close()
	if _, err := GGUF(context.Background(), extra, GGUFOptions{Out: filepath.Join(tmp, "extra.gguf")}); err == nil || !strings.Contains(err.Error(), "q_proj.bias") {
		t.Errorf("GGUF of a checkpoint with an undescribed tensor: %v, want an error naming it", err)
	}

	// An artifact whose embedded config.json section fails its CRC.
	art := filepath.Join(tmp, "a.lmpk")
	a, err := pack.FromCheckpoint(src, pack.FromOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pack.Write(art, a, pack.WriteOptions{NoCompress: true}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(art)
	cfg, _ := os.ReadFile(filepath.Join(src, "config.json"))
	var probe map[string]any
	if json.Unmarshal(cfg, &probe) != nil {
		t.Fatal("config.json of the source is not JSON")
	}
	i := strings.Index(string(b), string(cfg[:32]))
	if i < 0 {
		t.Fatal("config.json not found in the uncompressed artifact")
	}
	b[i+10] ^= 0x20
	os.WriteFile(art, b, 0o644)
	if _, err := GGUF(context.Background(), art, GGUFOptions{Out: filepath.Join(tmp, "art.gguf")}); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("GGUF of a corrupt artifact: %v, want a verify error", err)
	}
	if _, err := CompressedTensors(context.Background(), art, CTOptions{Out: filepath.Join(tmp, "art-ct")}); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("compressed-tensors of a corrupt artifact: %v, want a verify error", err)
	}
	for _, f := range []string{"nan.gguf", "nan-ct", "extra.gguf", "art.gguf", "art-ct"} {
		if _, err := os.Stat(filepath.Join(tmp, f)); err == nil {
			t.Errorf("a refused export left %s", f)
		}
	}
}
