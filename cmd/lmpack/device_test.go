package main

import (
	"strings"
	"testing"
)

// TestDeviceFlag: --device auto on a machine without a usable GPU logs one
// fallback line and gives the CPU's greedy text; --device cuda fails
// naming the driver library searched; a bad value is rejected; calibrate
// refuses cuda.
func TestDeviceFlag(t *testing.T) {
	t.Parallel()
	dir := modelDir(t)
	ref := loadGreedyRef(t).Text
	r := lmpack(t, nil, "run", dir, "--temperature", "0", "--max-tokens", "12", "--device", "auto")
	wantOK(t, r)
	fallback := strings.Count(r.stderr, "no usable CUDA GPU, running on the CPU")
	gpu := strings.Contains(r.stderr, "device=cuda")
	switch {
	case fallback == 1 && !gpu:
		if !strings.Contains(r.stderr, "libcuda.so.1") && !strings.Contains(r.stderr, "nvrtc") {
			t.Errorf("fallback line does not say what was searched:\n%s", r.stderr)
		}
		if !strings.Contains(r.stderr, "device=cpu") {
			t.Errorf("model loaded line does not say device=cpu:\n%s", r.stderr)
		}
	case fallback == 0 && gpu:
		t.Logf("a CUDA GPU is present; auto picked it")
	default:
		t.Fatalf("want exactly one fallback line or a cuda load, got %d fallback lines:\n%s", fallback, r.stderr)
	}
	if !strings.HasPrefix(ref, strings.TrimSuffix(r.stdout, "\n")) || len(r.stdout) < 20 {
		t.Errorf("12 greedy tokens %q are not a prefix of the reference text", r.stdout)
	}

	if fallback == 1 {
		r = lmpack(t, nil, "run", dir, "--max-tokens", "4", "--device", "cuda")
		wantError(t, r, "--device cuda", "no CUDA")
	}
	r = lmpack(t, nil, "eval", dir, "--data", valText(t), "--device", "gpu")
	wantError(t, r, `--device "gpu"`, "auto, cpu or cuda")
	r = lmpack(t, nil, "calibrate", dir, "--data", valText(t), "-o", t.TempDir()+"/c.calib", "--device", "cuda")
	wantError(t, r, "--device cuda", "calibrate runs on the CPU")
}
