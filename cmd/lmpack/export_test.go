package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestExportGGUFCLI runs lmpack export --format gguf on stories260K: the
// JSON report (47 exact F32 tensors, 32 bits per weight, the file's
// size), and the refusals of bad flags and of an -o that is not a GGUF.
func TestExportGGUFCLI(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.gguf")
	r := lmpack(t, nil, "export", modelDir(t), "--format", "gguf", "-o", out, "--json")
	wantOK(t, r)
	var rep struct {
		Format        string  `json:"format"`
		Bytes         int64   `json:"bytes"`
		BitsPerWeight float64 `json:"bits_per_weight"`
		Tensors       []struct {
			Name, To, Mode string
		} `json:"tensors"`
	}
	decodeOneJSON(t, r.stdout, &rep)
	st, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Format != "gguf" || rep.Bytes != st.Size() || rep.BitsPerWeight != 32 || len(rep.Tensors) != 47 || rep.Tensors[1].Mode != "exact" {
		t.Errorf("report %+v (file %d bytes)", rep, st.Size())
	}
	wantError(t, lmpack(t, nil, "export", modelDir(t), "--format", "gguf", "-o", out, "--gguf-type", "q5_k"), `--gguf-type "q5_k": want auto, q8_0`)
	wantError(t, lmpack(t, nil, "export", modelDir(t), "--format", "onnx", "-o", out), `--format "onnx": want gguf or compressed-tensors`)
	wantError(t, lmpack(t, nil, "export", modelDir(t), "--format", "gguf"), "-o: want the .gguf file to write")
	other := filepath.Join(dir, "notes.txt")
	os.WriteFile(other, []byte("keep"), 0o644)
	wantError(t, lmpack(t, nil, "export", modelDir(t), "--format", "gguf", "-o", other), "not a GGUF file; refusing to overwrite it")
	if b, _ := os.ReadFile(other); string(b) != "keep" {
		t.Errorf("-o file changed: %q", b)
	}
}
