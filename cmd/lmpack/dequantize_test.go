package main

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// bf16Copy writes stories260K's tensors as BF16, with its config and
// tokenizer files, into a temp dir and returns it.
func bf16Copy(t *testing.T) string {
	t.Helper()
	src := modelDir(t)
	dir := t.TempDir()
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ck, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var ws []safetensors.WriteTensor
	for _, n := range ck.Names() {
		tt, err := ck.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		v, err := tt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		w, err := safetensors.FromFloat32As(n, safetensors.BF16, tt.Shape, v)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ws, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDequantizeFlag: on a BF16 checkpoint, run and eval give the same
// text and the same perplexity bits with the weights in place (default)
// and widened to float32 (--dequantize).
func TestDequantizeFlag(t *testing.T) {
	t.Parallel()
	dir := bf16Copy(t)
	args := []string{"run", dir, "--temperature", "0", "--max-tokens", "48", "--threads", "1"}
	inPlace := lmpack(t, nil, args...)
	wantOK(t, inPlace)
	wide := lmpack(t, nil, append(args, "--dequantize")...)
	wantOK(t, wide)
	if inPlace.stdout == "\n" || inPlace.stdout != wide.stdout {
		t.Errorf("run: %q in place, %q with --dequantize", inPlace.stdout, wide.stdout)
	}
	eargs := []string{"eval", dir, "--data", valText(t), "--ctx", "64", "--max-windows", "2", "--json", "--threads", "1"}
	var a, b evalJSON
	r := lmpack(t, nil, eargs...)
	wantOK(t, r)
	decodeOneJSON(t, r.stdout, &a)
	r = lmpack(t, nil, append(eargs, "--dequantize")...)
	wantOK(t, r)
	decodeOneJSON(t, r.stdout, &b)
	if a.Perplexity == nil || b.Perplexity == nil || math.Float64bits(*a.Perplexity) != math.Float64bits(*b.Perplexity) {
		t.Errorf("eval perplexity %v in place, %v with --dequantize", a.Perplexity, b.Perplexity)
	}
}
