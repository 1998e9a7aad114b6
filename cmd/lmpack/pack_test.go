package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPackVerify(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "m.lmpk")
	r := lmpack(t, nil, "pack", modelDir(t), "-o", out, "--json")
	wantOK(t, r)
	var st struct {
		FileBytes int64 `json:"file_bytes"`
		ByDType   []struct {
			DType string `json:"dtype"`
			Raw   int64  `json:"raw_bytes"`
		} `json:"by_dtype"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.ByDType) == 0 {
		t.Fatalf("pack --json: %v\n%s", err, r.stdout)
	}
	fi, err := os.Stat(out)
	if err != nil || fi.Size() != st.FileBytes {
		t.Fatalf("artifact size %v, report %d (%v)", fi, st.FileBytes, err)
	}
	r = lmpack(t, nil, "verify", out)
	wantOK(t, r)
	if !strings.HasPrefix(r.stdout, "ok ") {
		t.Errorf("verify output %q", r.stdout)
	}
	// Flip a byte inside the first tensor section; verify must name it.
	b, _ := os.ReadFile(out)
	b[128+10] ^= 0xff // the first section starts right after the header
	bad := filepath.Join(dir, "bad.lmpk")
	os.WriteFile(bad, b, 0o644)
	wantError(t, lmpack(t, nil, "verify", bad), "checksum mismatch", "section \"")
	wantError(t, lmpack(t, nil, "verify", filepath.Join(dir, "missing.lmpk")), "missing.lmpk")
	os.WriteFile(bad, b[:len(b)/2], 0o644)
	wantError(t, lmpack(t, nil, "verify", bad), "truncated")
	// Plain-text pack output and --no-compress.
	r = lmpack(t, nil, "pack", modelDir(t), "-o", filepath.Join(dir, "raw.lmpk"), "--no-compress")
	wantOK(t, r)
	if !strings.Contains(r.stdout, "F32") {
		t.Errorf("pack summary lacks the F32 row:\n%s", r.stdout)
	}
}

func TestPackBadInput(t *testing.T) {
	dir := t.TempDir()
	wantError(t, lmpack(t, nil, "pack", modelDir(t)), "-o FILE.lmpk is required")
	wantError(t, lmpack(t, nil, "pack", dir, "-o", filepath.Join(t.TempDir(), "x.lmpk")), "config.json")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", filepath.Join(modelDir(t), "x.lmpk")), "inside the model directory")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", filepath.Join(dir, "y.lmpk"), "--kv-rotations", filepath.Join(dir, "nope")), "nope")
	if _, err := os.Stat(filepath.Join(dir, "y.lmpk")); err == nil {
		t.Error("a failed pack left its output behind")
	}
}

// TestPackRefusesUnrelatedOutput: -o over an existing file that is not an
// artifact is refused (the file survives); over an earlier artifact it is
// replaced (a rerun), with mode 0644.
func TestPackRefusesUnrelatedOutput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	other := filepath.Join(dir, "notes.txt")
	os.WriteFile(other, []byte("keep me"), 0o644)
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", other), "not an lmpack artifact", "refusing to overwrite")
	if b, _ := os.ReadFile(other); string(b) != "keep me" {
		t.Fatal("the unrelated file was overwritten")
	}
	art := filepath.Join(dir, "m.lmpk")
	wantOK(t, lmpack(t, nil, "pack", modelDir(t), "-o", art))
	wantOK(t, lmpack(t, nil, "pack", modelDir(t), "-o", art))
	if st, err := os.Stat(art); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("artifact mode: %v %v", st.Mode(), err)
	}
}

// TestPackQuantizedKV: a 4-bit RTN g32 stories260K checkpoint with OSCAR
// rotations computed on it packs (format version 2, per-tensor quant
// entries), verifies, and from the artifact eval gives the perplexity of
// "eval QCHECKPOINT --kv oscar2 --kv-rotations ROT" (within 1e-9
// relative), run gives the quantized checkpoint's greedy text with the
// oscar2 cache, and inspect reports the quantized checkpoint's tensors.
func TestPackQuantizedKV(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	model := modelDir(t)
	cal := filepath.Join(dir, "calib.st")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "1024", "--ctx", "256", "--threads", "1", "-o", cal))
	q4 := filepath.Join(dir, "q4")
	wantOK(t, lmpack(t, nil, "quantize", "weights", model, "--calib", cal, "-o", q4, "--method", "rtn", "--bits", "4", "--group", "32", "--threads", "1"))
	qcal, rot := filepath.Join(dir, "qcalib.st"), filepath.Join(dir, "rot.st")
	wantOK(t, lmpack(t, nil, "calibrate", q4, "--data", calibText(t), "--tokens", "1024", "--ctx", "256", "--threads", "1", "-o", qcal))
	wantOK(t, lmpack(t, nil, "quantize", "kv", q4, "--calib", qcal, "-o", rot))
	art := filepath.Join(dir, "q4.lmpk")
	wantOK(t, lmpack(t, nil, "pack", q4, "-o", art, "--kv-rotations", rot))
	r := lmpack(t, nil, "verify", art)
	wantOK(t, r)
	held := valText(t)
	r = lmpack(t, nil, "eval", art, "--data", held, "--ctx", "256", "--max-windows", "4", "--threads", "1", "--json")
	wantOK(t, r)
	var got struct {
		Perplexity float64 `json:"perplexity"`
		KVCache    string  `json:"kv_cache"`
	}
	decodeOneJSON(t, r.stdout, &got)
	r = lmpack(t, nil, "eval", q4, "--data", held, "--ctx", "256", "--max-windows", "4", "--threads", "1", "--kv", "oscar2", "--kv-rotations", rot, "--json")
	wantOK(t, r)
	var ref struct {
		Rows []struct {
			KV         string  `json:"kv"`
			Perplexity float64 `json:"perplexity"`
		} `json:"rows"`
	}
	decodeOneJSON(t, r.stdout, &ref)
	if len(ref.Rows) != 1 {
		t.Fatalf("eval --kv oscar2 rows: %+v", ref.Rows)
	}
	want := ref.Rows[0].Perplexity
	t.Logf("4-bit artifact (kv %s) perplexity %.6f; quantized checkpoint --kv oscar2 %.6f", got.KVCache, got.Perplexity, want)
	if got.KVCache != "oscar2" || math.Abs(got.Perplexity-want) > 1e-9*want {
		t.Errorf("artifact eval: kv %q perplexity %.12f, want oscar2 %.12f", got.KVCache, got.Perplexity, want)
	}
	onArt := lmpack(t, nil, "run", art, "--temperature", "0", "--max-tokens", "32", "--threads", "1")
	wantOK(t, onArt)
	if len(strings.TrimSpace(onArt.stdout)) < 32 || !strings.Contains(onArt.stderr, "kv_cache=oscar2") {
		t.Errorf("run from the artifact:\n%v", onArt)
	}
	in := lmpack(t, nil, "inspect", art)
	wantOK(t, in)
	ck := lmpack(t, nil, "inspect", q4)
	wantOK(t, ck)
	strip := func(s string) string { return s[strings.Index(s, "\n"):] }
	// inspect of the artifact additionally counts its KV rotations.
	if !strings.Contains(in.stdout, "parameters:    260032") || !strings.Contains(in.stdout, "model.layers.0.mlp.up_proj.qweight") ||
		!strings.Contains(in.stdout, "artifact:      format version 2, weights rtn, kv cache oscar2 (sink 0, recent 0 tokens)") {
		t.Errorf("inspect artifact:\n%s\ncheckpoint:\n%s", in.stdout, strip(ck.stdout))
	}
}

// TestPackKVWindowBound: KV windows beyond max_position_embeddings (512
// for stories260K) are refused naming the window that does not fit and
// the bound; inspect of an artifact
// shows its format version, weights and KV cache methods and windows, in
// text and JSON.
func TestPackKVWindowBound(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "m.lmpk")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-cache", "kivi2", "--kv-window", "99999999999999,1"), "--kv-window sink 99999999999999: want at most the model's max_position_embeddings 512 tokens (the fp16 sink window must fit the context)")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-cache", "kivi2", "--kv-window", "600,8"), "--kv-window sink 600: want at most the model's max_position_embeddings 512")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-cache", "kivi2", "--kv-window", "8,600"), "--kv-window recent 600: want at most the model's max_position_embeddings 512")
	wantError(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-cache", "kivi2", "--kv-window", "500,13"), "--kv-window recent 13: want at most 12 tokens: the model's max_position_embeddings 512 less --kv-window sink 500")
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused pack wrote its output")
	}
	wantOK(t, lmpack(t, nil, "pack", modelDir(t), "-o", out, "--kv-cache", "kivi2", "--kv-window", "8,32"))
	r := lmpack(t, nil, "inspect", out)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "artifact:      format version 1, weights float (not quantized), kv cache kivi2 (sink 8, recent 32 tokens)") {
		t.Errorf("inspect artifact:\n%s", r.stdout)
	}
	r = lmpack(t, nil, "inspect", out, "--json")
	wantOK(t, r)
	var got struct {
		Artifact *struct {
			FormatVersion int    `json:"format_version"`
			KVCache       string `json:"kv_cache"`
			KVSink        int    `json:"kv_sink"`
			KVRecent      int    `json:"kv_recent"`
		} `json:"artifact"`
	}
	decodeOneJSON(t, r.stdout, &got)
	if a := got.Artifact; a == nil || a.FormatVersion != 1 || a.KVCache != "kivi2" || a.KVSink != 8 || a.KVRecent != 32 {
		t.Errorf("inspect --json artifact: %+v", got.Artifact)
	}
	r = lmpack(t, nil, "inspect", modelDir(t), "--json")
	wantOK(t, r)
	if strings.Contains(r.stdout, `"artifact"`) {
		t.Errorf("inspect of a checkpoint reports an artifact block")
	}
}

// TestNotAnArtifactMessages: eval, run and inspect on an empty or
// bad-magic .lmpk say it is not an lmpack artifact; pack of a file (an
// artifact, config.json) says INPUT must be a checkpoint directory.
func TestNotAnArtifactMessages(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty, junk := filepath.Join(dir, "empty.lmpk"), filepath.Join(dir, "junk.lmpk")
	os.WriteFile(empty, nil, 0o644)
	os.WriteFile(junk, []byte("GGUF and more bytes"), 0o644)
	for _, args := range [][]string{
		{"inspect", empty}, {"run", empty, "--max-tokens", "1"}, {"eval", empty, "--data", valText(t)},
	} {
		wantError(t, lmpack(t, nil, args...), "not an lmpack artifact", "empty")
	}
	for _, args := range [][]string{
		{"inspect", junk}, {"run", junk, "--max-tokens", "1"}, {"eval", junk, "--data", valText(t)},
	} {
		wantError(t, lmpack(t, nil, args...), "not an lmpack artifact", `bad magic "GGUF"`)
	}
	art := packArtifact(t)
	out := filepath.Join(dir, "o.lmpk")
	wantError(t, lmpack(t, nil, "pack", art, "-o", out), "already an lmpack artifact", "checkpoint directory")
	wantError(t, lmpack(t, nil, "pack", filepath.Join(modelDir(t), "config.json"), "-o", out), "is a file", "checkpoint directory", "its directory")
}

// TestVerifyListsEveryProblem: with two corrupt sections (and so a wrong
// content sha256) verify lists all three problems, each naming its
// section, not only the first.
func TestVerifyListsEveryProblem(t *testing.T) {
	out := filepath.Join(t.TempDir(), "m.lmpk")
	r := lmpack(t, nil, "pack", modelDir(t), "-o", out, "--no-compress", "--json")
	wantOK(t, r)
	var st struct {
		Sections []struct {
			Name   string `json:"name"`
			Stored int64  `json:"stored_bytes"`
		} `json:"sections"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || len(st.Sections) < 2 {
		t.Fatalf("pack --json: %v\n%s", err, r.stdout)
	}
	// Sections follow the 128-byte header in name order, 64-byte aligned.
	first, second := int64(128), (128+st.Sections[0].Stored+63)/64*64
	b, _ := os.ReadFile(out)
	b[first] ^= 0x01
	b[second] ^= 0x01
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	r = lmpack(t, nil, "verify", out)
	wantError(t, r, "checksum mismatch", "and 2 more problems")
	for i, sec := range []string{st.Sections[0].Name, st.Sections[1].Name} {
		if want := fmt.Sprintf("problem %d of 3: section %q:", i+1, sec); !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if !strings.Contains(r.stderr, "problem 3 of 3: ") || !strings.Contains(r.stderr, "content sha256") {
		t.Errorf("stderr lacks the sha256 problem:\n%s", r.stderr)
	}
}
