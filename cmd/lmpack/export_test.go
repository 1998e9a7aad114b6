package main

import (
	"os"
	"path/filepath"
	"strings"
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
	// pack's output rules: not inside the model directory, an existing
	// parent directory (named, without the temporary's name).
	wantError(t, lmpack(t, nil, "export", modelDir(t), "--format", "gguf", "-o", filepath.Join(modelDir(t), "model.gguf")), "inside the model directory")
	missing := filepath.Join(dir, "nodir", "sub", "x.gguf")
	if r := lmpack(t, nil, "export", modelDir(t), "--format", "gguf", "-o", missing); r.code == 0 || !strings.Contains(r.stderr, "directory "+filepath.Dir(missing)+" does not exist") || strings.Contains(r.stderr, ".tmp-") {
		t.Errorf("export to a missing directory: exit %d, stderr %s", r.code, r.stderr)
	}
}

// TestExportCompressedTensorsCLI: --format compressed-tensors writes a
// directory whose config.json carries no quantization_config for a float
// model (the tensors keep their dtype), refuses an existing OUT and the
// GGUF-only flags, and leaves nothing behind on a refusal.
func TestExportCompressedTensorsCLI(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "ct")
	r := lmpack(t, nil, "export", modelDir(t), "--format", "compressed-tensors", "-o", out, "--json")
	wantOK(t, r)
	var rep struct {
		Format  string `json:"format"`
		Tensors []struct {
			Name, To, Mode string
		} `json:"tensors"`
	}
	decodeOneJSON(t, r.stdout, &rep)
	if rep.Format != "compressed-tensors" || len(rep.Tensors) == 0 {
		t.Errorf("report %+v", rep)
	}
	for _, f := range []string{"config.json", "model.safetensors.index.json", "tokenizer.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("export output lacks %s: %v", f, err)
		}
	}
	wantError(t, lmpack(t, nil, "export", modelDir(t), "--format", "compressed-tensors", "-o", out), out)
	other := filepath.Join(dir, "ct2")
	wantError(t, lmpack(t, nil, "export", modelDir(t), "--format", "compressed-tensors", "-o", other, "--gguf-type", "q8_0"), "--gguf-type applies to --format gguf only")
	wantError(t, lmpack(t, nil, "export", modelDir(t), "--format", "gguf", "-o", filepath.Join(dir, "m.gguf"), "--drop-kv"), "apply to --format compressed-tensors only")
	if _, err := os.Stat(other); err == nil {
		t.Errorf("a refused export left %s behind", other)
	}
}
