package main

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// TestCtxDefaultFromModel: without --ctx, calibrate and eval use min(512,
// max_position_embeddings): 256 on tiny1m-hf (whose context is 256), so
// neither refuses the model's own context as too long.
func TestCtxDefaultFromModel(t *testing.T) {
	t.Parallel()
	model := shared.Path(t, "tiny1m-hf")
	out := filepath.Join(t.TempDir(), "c.safetensors")
	r := lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "512", "--threads", "1", "--json", "-o", out)
	wantOK(t, r)
	var s struct {
		Ctx     int `json:"ctx"`
		Windows int `json:"windows"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil || s.Ctx != 256 || s.Windows != 2 {
		t.Errorf("calibrate: ctx %d, %d windows (%v); want 256 and 2:\n%s", s.Ctx, s.Windows, err, r.stdout)
	}
	r = lmpack(t, nil, "eval", model, "--data", valText(t), "--max-windows", "1", "--threads", "1", "--json")
	wantOK(t, r)
	var e struct {
		Ctx int `json:"ctx"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &e); err != nil || e.Ctx != 256 {
		t.Errorf("eval: ctx %d (%v); want 256:\n%s", e.Ctx, err, r.stdout)
	}
	// An explicit --ctx above the model's context is still refused.
	wantError(t, lmpack(t, nil, "eval", model, "--data", valText(t), "--ctx", "512"), "--ctx 512: want at most the model's max_position_embeddings 256")
}

// TestRunStopsAtContext: run --max-tokens beyond the model's context
// (tiny1m-hf: 256 positions, prompt BOS alone) generates up to the
// context, 255 tokens, and says so, instead of refusing the flag.
func TestRunStopsAtContext(t *testing.T) {
	t.Parallel()
	r := lmpack(t, nil, "--log-format", "json", "run", shared.Path(t, "tiny1m-hf"), "--temperature", "0", "--ignore-eos", "--max-tokens", "1000", "--threads", "1")
	wantOK(t, r)
	lines := jsonLogLines(t, r.stderr)
	if done := findLog(lines, "generation done"); done == nil || done["generated_tokens"] != 255.0 || done["prompt_tokens"] != 1.0 {
		t.Errorf("want a \"generation done\" line with 255 generated tokens, got %v", lines)
	}
	if findLog(lines, "generation stopped at the model's context") == nil {
		t.Errorf("no warning that generation stopped at the context in %v", lines)
	}
	// The largest --max-tokens does not overflow the context arithmetic.
	r = lmpack(t, nil, "--log-format", "json", "run", shared.Path(t, "tiny1m-hf"), "--temperature", "0", "--ignore-eos", "--max-tokens", "9223372036854775807", "--threads", "1")
	wantOK(t, r)
	if done := findLog(jsonLogLines(t, r.stderr), "generation done"); done == nil || done["generated_tokens"] != 255.0 {
		t.Errorf("--max-tokens MaxInt64: want 255 generated tokens, got %v", r.stderr)
	}
}
