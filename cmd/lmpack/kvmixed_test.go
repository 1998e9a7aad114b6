package main

import (
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/pack"
)

// TestArtifactKVMixed: quantize kv --clip-search --kv-bits 7 on
// stories260K reports per-layer ratios, errors and widths (text and
// --json) within the budget; pack --kv-rotations makes an oscar-mixed
// artifact with the widths in its manifest, and eval on it gives the
// perplexity eval --kv oscar-mixed gives on the checkpoint with the same
// rotation file, different from the float32 cache's.
func TestArtifactKVMixed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	calib, rot := filepath.Join(dir, "calib.st"), filepath.Join(dir, "rot.st")
	data := shared.Path(t, "tinystories-valid", "calib.txt")
	wantOK(t, lmpack(t, nil, "calibrate", modelDir(t), "--data", data, "--tokens", "512", "--ctx", "256", "-o", calib))
	args := []string{"quantize", "kv", modelDir(t), "--calib", calib, "-o", rot, "--clip-search", "--kv-bits", "7", "--kv-window", "4,16", "--search-tokens", "256"}
	r := lmpack(t, nil, append(args, "--json")...)
	wantOK(t, r)
	var s struct {
		BitsPerElement float64 `json:"bits_per_element"`
		PerLayer       []struct {
			K struct {
				Clip  []float64 `json:"clip"`
				Error []float64 `json:"error"`
				Bits  int       `json:"bits"`
			} `json:"k"`
		} `json:"per_layer"`
	}
	decodeOneJSON(t, r.stdout, &s)
	if len(s.PerLayer) != 5 || s.BitsPerElement > 7 || s.BitsPerElement < 6 || len(s.PerLayer[0].K.Error) != 3 || s.PerLayer[0].K.Bits == 0 {
		t.Fatalf("quantize kv --json: %s", r.stdout)
	}
	r = lmpack(t, nil, args...)
	wantOK(t, r)
	for _, want := range []string{"clip search", "clip2", "error8", "bits", "kv-bits 7 at serving context 32768 (windows 4,16 amortised)", "uniform 2-bit"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("quantize kv report lacks %q:\n%s", want, r.stdout)
		}
	}
	// Packed with the windows the widths were chosen for: no warning; with
	// others (none): a warning naming both.
	const winWarn = "per-layer KV widths were chosen for other fp16 windows"
	if r := lmpack(t, nil, "pack", modelDir(t), "-o", filepath.Join(t.TempDir(), "w.lmpk"), "--kv-rotations", rot, "--kv-window", "4,16"); r.code != 0 || strings.Contains(r.stderr, winWarn) {
		t.Errorf("pack --kv-window 4,16 (the windows of --kv-bits): exit %d, stderr:\n%s", r.code, r.stderr)
	}
	out := filepath.Join(t.TempDir(), "m.lmpk")
	r = lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-rotations", rot)
	wantOK(t, r)
	if !strings.Contains(r.stderr, winWarn) || !strings.Contains(r.stderr, "chosen_for_window=4,16") {
		t.Errorf("pack without --kv-window of a rotation file chosen for 4,16: no warning %q in stderr:\n%s", winWarn, r.stderr)
	}
	art := out
	rd, err := pack.Open(art)
	if err != nil {
		t.Fatal(err)
	}
	m := rd.Manifest()
	rd.Close()
	if m.KV == nil || m.KV.Cache != "oscar-mixed" || len(m.KV.BitsK) != 5 || len(m.KV.ClipK4) != 5 || m.KV.BitsK[0] != s.PerLayer[0].K.Bits {
		t.Fatalf("manifest kv %+v", m.KV)
	}
	held := shared.Path(t, "tinystories-valid", "heldout.txt")
	r = lmpack(t, nil, "eval", art, "--data", held, "--ctx", "256", "--max-windows", "2", "--json")
	wantOK(t, r)
	var got struct {
		Perplexity float64 `json:"perplexity"`
		KVCache    string  `json:"kv_cache"`
	}
	decodeOneJSON(t, r.stdout, &got)
	r = lmpack(t, nil, "eval", modelDir(t), "--data", held, "--ctx", "256", "--max-windows", "2", "--kv", "oscar-mixed", "--kv-rotations", rot, "--json")
	wantOK(t, r)
	var ref struct {
		Rows []struct {
			KV         string  `json:"kv"`
			Perplexity float64 `json:"perplexity"`
			DeltaPPL   float64 `json:"delta_ppl"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &ref); err != nil || len(ref.Rows) != 1 {
		t.Fatalf("eval --kv oscar-mixed: %v\n%s", err, r.stdout)
	}
	t.Logf("artifact (kv %s) perplexity %.6f; checkpoint --kv oscar-mixed %.6f (delta vs fp32 %+.4f)", got.KVCache, got.Perplexity, ref.Rows[0].Perplexity, ref.Rows[0].DeltaPPL)
	if got.KVCache != "oscar-mixed" || math.Abs(got.Perplexity-ref.Rows[0].Perplexity) > 1e-9*got.Perplexity {
		t.Errorf("artifact eval: kv %q perplexity %.12f, want oscar-mixed %.12f", got.KVCache, got.Perplexity, ref.Rows[0].Perplexity)
	}
	if ref.Rows[0].DeltaPPL == 0 {
		t.Error("oscar-mixed perplexity equals the float32 cache's")
	}
}
