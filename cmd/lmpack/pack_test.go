package main

import (
	"encoding/json"
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
