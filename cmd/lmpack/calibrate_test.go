package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/oscar"
)

// calibText is the calibration half of the TinyStories excerpt.
func calibText(t *testing.T) string {
	t.Helper()
	return shared.Path(t, "tinystories-valid", "calib.txt")
}

// TestCalibrateQuantizeKV runs `lmpack calibrate` then `lmpack quantize kv`
// end to end on stories260K and checks both files with the packages'
// validating readers: header fields, the version stamped into the binary,
// orthogonal float32 rotations and the default clip ratios.
func TestCalibrateQuantizeKV(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cal, rot := filepath.Join(dir, "calib.safetensors"), filepath.Join(dir, "rot.safetensors")
	r := lmpack(t, nil, "calibrate", modelDir(t), "--data", calibText(t), "--tokens", "2048", "--ctx", "256", "--threads", "1", "-o", cal)
	wantOK(t, r)
	if want := "wrote " + cal + ": 2048 tokens in 8 windows of 256"; !strings.HasPrefix(r.stdout, want) {
		t.Errorf("stdout %q, want it to start with %q", r.stdout, want)
	}
	if !strings.Contains(r.stderr, "calibrate progress") || !strings.Contains(r.stderr, "forwarded_tokens_done=4096") {
		t.Errorf("no progress log lines when stderr is not a terminal:\n%s", r.stderr)
	}
	c, err := calibrate.Read(cal, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	if h := c.Header; h.Tokens != 2048 || h.Ctx != 256 || h.LmpackVersion != testVersion || len(c.OSCAR) != 5 {
		t.Errorf("calibration header %+v, %d layers", h, len(c.OSCAR))
	}

	r = lmpack(t, nil, "quantize", "kv", modelDir(t), "--calib", cal, "-o", rot)
	wantOK(t, r)
	if want := "wrote " + rot + ": oscar rotations for 5 layers, clip_k 0.96, clip_v 0.92\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	rs, h, err := oscar.ReadFile(rot, model.Expect{ModelFingerprint: c.Header.ModelFingerprint})
	if err != nil {
		t.Fatal(err)
	}
	if h.LmpackVersion != testVersion || len(rs.K) != 5 || len(rs.V) != 5 {
		t.Fatalf("rotation header %+v, %d/%d layers", h, len(rs.K), len(rs.V))
	}
	for l := range rs.K {
		if ek, ev := oscar.Orthogonality(rs.K[l], 8), oscar.Orthogonality(rs.V[l], 8); ek > 1e-6 || ev > 1e-6 {
			t.Errorf("layer %d: max|RRᵀ−I| = %.3g (K), %.3g (V)", l, ek, ev)
		}
		if rs.ClipK[l] != 0.96 || rs.ClipV[l] != 0.92 {
			t.Errorf("layer %d: clip ratios %g, %g", l, rs.ClipK[l], rs.ClipV[l])
		}
	}
	r = lmpack(t, nil, "quantize", "kv", modelDir(t), "--calib", cal, "--clip-k", "1", "--clip-v", "0.5", "-o", rot)
	wantOK(t, r)
	if rs, _, err = oscar.ReadFile(rot, model.Expect{}); err != nil || rs.ClipK[0] != 1 || rs.ClipV[4] != 0.5 {
		t.Errorf("--clip-k 1 --clip-v 0.5: %v, %v %v", err, rs.ClipK, rs.ClipV)
	}

	// Errors.
	moe := shared.Path(t, "stories260K-moe-hf")
	other := filepath.Join(dir, "x.safetensors")
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"calibrate", modelDir(t), "-o", other}, []string{"--data FILE is required"}},
		{[]string{"calibrate", modelDir(t), "--data", calibText(t)}, []string{"-o CALIB is required"}},
		{[]string{"calibrate", modelDir(t), "--data", calibText(t), "--tokens", "0", "-o", other}, []string{"--tokens 0"}},
		{[]string{"calibrate", modelDir(t), "--data", calibText(t), "--ctx", "0", "-o", other}, []string{"--ctx 0: want >= 2"}},
		{[]string{"calibrate", modelDir(t), "--data", calibText(t), "--ctx", "4096", "-o", other}, []string{"--ctx 4096: want at most", "max_position_embeddings 512"}},
		{[]string{"calibrate", modelDir(t), "--data", calibText(t), "--tokens", "10000000", "-o", other}, []string{"fewer than the 10000000 requested"}},
		{[]string{"calibrate", modelDir(t), "--data", calibText(t), "-o", filepath.Join(dir, "missing", "c")}, []string{"missing"}},
		{[]string{"quantize", "kv", modelDir(t), "-o", other}, []string{"--calib CALIB is required"}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal}, []string{"-o ROT is required"}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--method", "quarot", "-o", other}, []string{`--method "quarot": want "oscar"`}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--clip-k", "0", "-o", other}, []string{"--clip-k 0: want a ratio in (0, 1]"}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--clip-v", "1.01", "-o", other}, []string{"--clip-v 1.01"}},
		{[]string{"quantize", "kv", moe, "--calib", cal, "-o", other}, []string{cal, "calibration file is from another model", c.Header.ModelFingerprint}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", filepath.Join(modelDir(t), "model.safetensors"), "-o", other}, []string{"not an lmpack calibration file"}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", rot, "-o", other}, []string{`kind "lmpack-kv-rotation"`}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--clip-k4", "1.5", "-o", other}, []string{"--clip-k4 1.5: want 0 (no clipping) or a ratio in (0, 1]"}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--kv-bits", "1", "-o", other}, []string{"--kv-bits 1: want 0 (uniform widths) or average bits per element in [2, 16]"}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--kv-bits", "3", "--kv-window", "16", "-o", other}, []string{`--kv-window "16": want SINK,RECENT`}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--kv-bits", "3", "--kv-serving-ctx", "64", "--kv-window", "16,64", "-o", other}, []string{"--kv-serving-ctx 64: want a context above the fp16 windows' --kv-window sink 16 + --kv-window recent 64 = 80 tokens"}},
		// Windows too long for the default serving context name the
		// window, not --kv-serving-ctx (not given).
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--kv-bits", "3", "--kv-window", "16,40000", "-o", other}, []string{"--kv-window recent 40000: want a window below 32752 tokens: the default serving context 32768 (no --kv-serving-ctx), at which --kv-bits counts bits per element, less --kv-window sink 16 (or give a longer --kv-serving-ctx)"}},
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--kv-bits", "3", "--kv-window", "40000,16", "-o", other}, []string{"--kv-window sink 40000: want a window below the default serving context 32768 (no --kv-serving-ctx)"}},
		// head_dim 8: all-2-bit sides store 6 bits per element (refused
		// from the shapes, before the error measurement).
		{[]string{"quantize", "kv", modelDir(t), "--calib", cal, "--kv-bits", "3", "-o", other}, []string{"--kv-bits 3", "every layer at 2 bits: 6.0000 bits/element", "want --kv-bits ≥ 6.0000", "infeasible"}},
	} {
		wantError(t, lmpack(t, nil, c.args...), c.want...)
	}
}
