package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/pack"
)

// packArtifact packs the stories260K checkpoint with the CLI.
func packArtifact(t *testing.T, extra ...string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "m.lmpk")
	wantOK(t, lmpack(t, nil, append([]string{"pack", modelDir(t), "-o", out}, extra...)...))
	return out
}

// TestArtifactAsModel: eval, run and inspect on a packed stories260K give
// what they give on the checkpoint: PPL 3.76833 over 8 windows of 512
// (SOURCE.md), the same greedy text, 260,032 parameters.
func TestArtifactAsModel(t *testing.T) {
	t.Parallel()
	for _, flags := range [][]string{nil, {"--no-compress"}} {
		art := packArtifact(t, flags...)
		r := lmpack(t, nil, "eval", art, "--data", valText(t), "--ctx", "512", "--max-windows", "8", "--json")
		checkEval(t, r, 3.76833, 0.0005, 8, 512)
		onCk := lmpack(t, nil, "run", modelDir(t), "--temperature", "0", "--max-tokens", "64")
		onArt := lmpack(t, nil, "run", art, "--temperature", "0", "--max-tokens", "64")
		wantOK(t, onCk)
		wantOK(t, onArt)
		if onArt.stdout != onCk.stdout || len(onArt.stdout) < 64 {
			t.Errorf("greedy text %v\n  from the artifact: %q\nfrom the checkpoint: %q", flags, onArt.stdout, onCk.stdout)
		}
		r = lmpack(t, nil, "inspect", art)
		wantOK(t, r)
		m := regexp.MustCompile(`parameters:\s+(\d+) `).FindStringSubmatch(r.stdout)
		if m == nil || m[1] != "260032" {
			t.Errorf("inspect artifact: %v", r.stdout)
		}
		ck := lmpack(t, nil, "inspect", modelDir(t))
		wantOK(t, ck)
		// Same report apart from the model line, and the tied lm_head copy
		// the checkpoint stores and the artifact does not (with its bytes).
		strip := func(s string) string {
			var keep []string
			for _, l := range strings.Split(s[strings.Index(s, "\n"):], "\n") {
				if !strings.Contains(l, "lm_head.weight") && !strings.HasPrefix(l, "bytes:") && !strings.HasPrefix(l, "artifact:") {
					keep = append(keep, l)
				}
			}
			return strings.Join(keep, "\n")
		}
		if strip(r.stdout) != strip(ck.stdout) {
			t.Errorf("inspect differs:\nartifact:\n%s\ncheckpoint:\n%s", r.stdout, ck.stdout)
		}
	}
}

// forge writes an artifact of the stories260K checkpoint with edit
// applied to it before writing.
func forge(t *testing.T, edit func(a *pack.Artifact)) string {
	t.Helper()
	a, err := pack.FromCheckpoint(modelDir(t), pack.FromOptions{LmpackVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	edit(a)
	out := filepath.Join(t.TempDir(), "forged.lmpk")
	if _, err := pack.Write(out, a, pack.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestArtifactUnconsumed: a manifest tensor the model does not use, and KV
// rotations the runtime does not apply, make run and eval fail naming
// them; a flipped byte in a tensor section is a checksum error.
func TestArtifactUnconsumed(t *testing.T) {
	t.Parallel()
	eye := make([]byte, 8*8*4)
	for i := 0; i < 8; i++ {
		copy(eye[4*(9*i):], []byte{0, 0, 0x80, 0x3f}) // float32 1.0
	}
	extra := forge(t, func(a *pack.Artifact) {
		a.Manifest.Tensors = append(a.Manifest.Tensors, pack.TensorEntry{Name: "zz.extra.weight", Section: "zz.extra.weight", DType: "F32", Shape: []int{8, 8}})
		a.Sections = append(a.Sections, pack.Section{Name: "zz.extra.weight", ElemSize: 4, Data: eye})
	})
	wantError(t, lmpack(t, nil, "run", extra, "--max-tokens", "4"), "zz.extra.weight", "does not use")
	wantError(t, lmpack(t, nil, "eval", extra, "--data", valText(t), "--ctx", "64", "--max-windows", "1"), "zz.extra.weight")

	// One rotation pair for a 5-layer model, and a scheme naming no cache
	// method: both refused, naming the problem.
	rot := forge(t, func(a *pack.Artifact) {
		k, v := "kv/oscar.layers.0.r_k", "kv/oscar.layers.0.r_v"
		a.Manifest.KV = &pack.KVScheme{Cache: "oscar2", Method: "oscar", Rotations: []pack.KVRotations{{Layer: 0, K: k, V: v}}}
		for _, n := range []string{k, v} {
			a.Manifest.Tensors = append([]pack.TensorEntry{{Name: n, Section: n, DType: "F32", Shape: []int{8, 8}}}, a.Manifest.Tensors...)
			a.Sections = append(a.Sections, pack.Section{Name: n, ElemSize: 4, Data: eye})
		}
	})
	wantError(t, lmpack(t, nil, "run", rot, "--max-tokens", "4"), "1 rotation pairs for 5 layers")
	noCache := forge(t, func(a *pack.Artifact) { a.Manifest.KV = &pack.KVScheme{Method: "oscar"} })
	wantError(t, lmpack(t, nil, "eval", noCache, "--data", valText(t), "--ctx", "64", "--max-windows", "1"), "manifest kv", "no cache method")
	// A rotation-shaped tensor the KV scheme (kivi2, no rotations) does
	// not name goes unconsumed.
	stray := forge(t, func(a *pack.Artifact) {
		a.Manifest.KV = &pack.KVScheme{Cache: "kivi2"}
		n := "kv/oscar.layers.0.r_k"
		a.Manifest.Tensors = append([]pack.TensorEntry{{Name: n, Section: n, DType: "F32", Shape: []int{8, 8}}}, a.Manifest.Tensors...)
		a.Sections = append(a.Sections, pack.Section{Name: n, ElemSize: 4, Data: eye})
	})
	wantError(t, lmpack(t, nil, "run", stray, "--max-tokens", "4"), "kv/oscar.layers.0.r_k", "does not use")
	r := lmpack(t, nil, "inspect", rot)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "kv rotations:  2 tensors") {
		t.Errorf("inspect of an artifact with rotations:\n%s", r.stdout)
	}

	// A byte flipped inside a raw tensor section (lz4 sections are
	// covered section by section in pack's TestTensorCorruptSection).
	art := packArtifact(t, "--no-compress")
	rd, err := pack.Open(art)
	if err != nil {
		t.Fatal(err)
	}
	name := "model.layers.2.mlp.up_proj.weight"
	sec, err := rd.Section(name)
	sec = bytes.Clone(sec)
	rd.Close()
	if err != nil || len(sec) == 0 {
		t.Fatalf("section %q: %v", name, err)
	}
	b, _ := os.ReadFile(art)
	off := bytes.Index(b, sec)
	if off < 0 {
		t.Fatalf("section %q not found in the file", name)
	}
	b[off+len(sec)/2] ^= 0x20
	bad := filepath.Join(t.TempDir(), "bad.lmpk")
	os.WriteFile(bad, b, 0o644)
	wantError(t, lmpack(t, nil, "run", bad, "--max-tokens", "4"), "checksum mismatch", name)
}

// TestArtifactKVScheme: stories260K packed with oscar2 rotations (lmpack
// calibrate, quantize kv, pack --kv-rotations) evaluates from the
// artifact to the perplexity "eval --kv oscar2 --kv-rotations ROT" gives
// on the checkpoint (same cache, same rotations; the two sum the NLL in a
// different order, hence 1e-9), which differs from the float32 cache's.
func TestArtifactKVScheme(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	calib, rot := filepath.Join(dir, "calib.st"), filepath.Join(dir, "rot.st")
	data := shared.Path(t, "tinystories-valid", "calib.txt")
	wantOK(t, lmpack(t, nil, "calibrate", modelDir(t), "--data", data, "--tokens", "2048", "--ctx", "256", "-o", calib))
	wantOK(t, lmpack(t, nil, "quantize", "kv", modelDir(t), "--calib", calib, "-o", rot))
	art := packArtifact(t, "--kv-rotations", rot)
	held := shared.Path(t, "tinystories-valid", "heldout.txt")
	r := lmpack(t, nil, "eval", art, "--data", held, "--ctx", "256", "--max-windows", "4", "--json")
	wantOK(t, r)
	var got struct {
		Perplexity float64 `json:"perplexity"`
		KVCache    string  `json:"kv_cache"`
	}
	decodeOneJSON(t, r.stdout, &got)
	r = lmpack(t, nil, "eval", modelDir(t), "--data", held, "--ctx", "256", "--max-windows", "4", "--kv", "oscar2", "--kv-rotations", rot, "--json")
	wantOK(t, r)
	var ref struct {
		Rows []struct {
			KV         string  `json:"kv"`
			Perplexity float64 `json:"perplexity"`
			DeltaPPL   float64 `json:"delta_ppl"`
		} `json:"rows"`
	}
	decodeOneJSON(t, r.stdout, &ref)
	if len(ref.Rows) != 1 || ref.Rows[0].KV != "oscar2" {
		t.Fatalf("eval --kv oscar2 rows: %+v", ref.Rows)
	}
	want := ref.Rows[0].Perplexity
	t.Logf("artifact (kv %s) perplexity %.6f, checkpoint --kv oscar2 %.6f (delta vs fp32 %+.4f)", got.KVCache, got.Perplexity, want, ref.Rows[0].DeltaPPL)
	if got.KVCache != "oscar2" || math.Abs(got.Perplexity-want) > 1e-9*want {
		t.Errorf("artifact eval: kv %q perplexity %.12f, want oscar2 %.12f", got.KVCache, got.Perplexity, want)
	}
	if ref.Rows[0].DeltaPPL == 0 {
		t.Errorf("oscar2 perplexity equals the float32 cache's: the comparison cannot tell the caches apart")
	}
	// run generates from the artifact through its oscar2 cache (the
	// logits are compared bit for bit in pack's TestArtifactKVCacheLogits).
	r = lmpack(t, nil, "run", art, "--temperature", "0", "--max-tokens", "32")
	wantOK(t, r)
	if len(strings.TrimSpace(r.stdout)) < 32 || !strings.Contains(r.stderr, "kv_cache=oscar2") {
		t.Errorf("run from the oscar2 artifact:\n%v", r)
	}
}

// TestArtifactKVNoRotations: pack --kv-cache kivi2 --kv-window 4,64 (a
// scheme without rotations) evaluates from the artifact to the perplexity
// of eval --kv kivi2 --kv-window 4,64 on the checkpoint; bad --kv-cache
// and --kv-window combinations are refused.
func TestArtifactKVNoRotations(t *testing.T) {
	t.Parallel()
	art := packArtifact(t, "--kv-cache", "kivi2", "--kv-window", "4,64")
	held := shared.Path(t, "tinystories-valid", "heldout.txt")
	r := lmpack(t, nil, "eval", art, "--data", held, "--ctx", "256", "--max-windows", "2", "--json")
	wantOK(t, r)
	var got struct {
		Perplexity float64 `json:"perplexity"`
		KVCache    string  `json:"kv_cache"`
	}
	decodeOneJSON(t, r.stdout, &got)
	r = lmpack(t, nil, "eval", modelDir(t), "--data", held, "--ctx", "256", "--max-windows", "2", "--kv", "kivi2", "--kv-window", "4,64", "--json")
	wantOK(t, r)
	var ref struct {
		Rows []struct {
			KV         string  `json:"kv"`
			Perplexity float64 `json:"perplexity"`
		} `json:"rows"`
	}
	decodeOneJSON(t, r.stdout, &ref)
	if len(ref.Rows) != 2 || ref.Rows[1].KV != "kivi2+w4,64" {
		t.Fatalf("eval --kv kivi2 --kv-window rows: %+v", ref.Rows)
	}
	want := ref.Rows[1].Perplexity
	if got.KVCache != "kivi2" || math.Abs(got.Perplexity-want) > 1e-9*want || want == ref.Rows[0].Perplexity {
		t.Errorf("artifact eval: kv %q perplexity %.12f, want kivi2 with windows %.12f (without windows %.12f)", got.KVCache, got.Perplexity, want, ref.Rows[0].Perplexity)
	}
	out := filepath.Join(t.TempDir(), "x.lmpk")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-cache", "oscar2"), "--kv-cache \"oscar2\": want --kv-rotations: it needs a rotation file")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-cache", "oscar7"), "--kv-cache \"oscar7\": want a known method")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-window", "4,64"), "--kv-window sink: want --kv-cache")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-cache", "int4", "--kv-window", "4"), "--kv-window \"4\"")
}

// TestServeArtifactRefusesKVFlags: an artifact serves with its own KV
// scheme; --kv-window alone (or with --kv) is refused as such, not as a
// window without --kv.
func TestServeArtifactRefusesKVFlags(t *testing.T) {
	t.Parallel()
	art := packArtifact(t)
	for _, extra := range [][]string{{"--kv-window", "16,64"}, {"--kv", "int4", "--kv-window", "16,64"}} {
		wantError(t, lmpack(t, nil, append([]string{"serve", art, "--port", "0"}, extra...)...), "is an artifact, which serves with its own KV cache scheme")
	}
}
