package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lmpack/lmpack/internal/shared"
)

// writeRecipe writes a stories260K oscar2 recipe with absolute data paths
// and the given eval bounds.
func writeRecipe(t *testing.T, tokens int, maxDeltaPPL, maxKL string) string {
	t.Helper()
	src := `name: cli
calibrate:
  data: ` + shared.Path(t, "tinystories-valid", "calib.txt") + `
  tokens: ` + itoa(tokens) + `
  ctx: 256
quantize:
  kv:
    cache: oscar2
    sink: 8
    recent: 32
eval:
  data: ` + shared.Path(t, "tinystories-valid", "heldout.txt") + `
  ctx: 256
  max_windows: 2
  max_delta_ppl_pct: ` + maxDeltaPPL + `
  max_kl: ` + maxKL + `
`
	p := filepath.Join(t.TempDir(), "recipe.yaml")
	if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestCompressCLI: a recipe with an unknown key exits 1 naming key and
// line; a failed eval gate exits 3 and writes no artifact; a passing run
// prints the JSON report, writes a verified artifact, and a rerun reuses
// every stage.
func TestCompressCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("name: x\npack:\n  lz4: true\n  zstd: true\n"), 0o644)
	out := filepath.Join(dir, "m.lmpk")
	r := lmpack(t, nil, "compress", modelDir(t), "--recipe", bad, "-o", out)
	wantError(t, r, `line 4: unknown key "zstd" in pack`)
	if r.code != 1 {
		t.Errorf("unknown key: exit %d, want 1", r.code)
	}

	r = lmpack(t, nil, "compress", modelDir(t), "--recipe", writeRecipe(t, 1024, "0.001", "0"), "-o", out)
	if last := r.stderr[strings.LastIndex(strings.TrimRight(r.stderr, "\n"), "\n")+1:]; r.code != 3 ||
		!strings.HasPrefix(last, "lmpack: compress: eval gate failed: ΔPPL") || !strings.Contains(last, "exceeds max_delta_ppl_pct 0.001") ||
		!strings.Contains(r.stdout, "gate FAILED") {
		t.Errorf("failed gate: want exit 3, the eval table and the gate error:\n%v", r)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("artifact written despite the failed gate")
	}

	// Same recipe with looser bounds: the bounds are not part of any cache
	// key, so every stage is reused (and again on a rerun) and the gate
	// now passes.
	recipe := writeRecipe(t, 1024, "100000", "10")
	for i := range 2 {
		r = lmpack(t, nil, "compress", modelDir(t), "--recipe", recipe, "-o", out, "--json")
		wantOK(t, r)
		var rep struct {
			Written bool `json:"written"`
			Stages  []struct {
				Name   string `json:"name"`
				Cached bool   `json:"cached"`
			} `json:"stages"`
			KVCache string `json:"kv_cache"`
			Eval    struct {
				DeltaPPL      float64 `json:"delta_ppl"`
				KL            float64 `json:"kl"`
				KVBits        float64 `json:"kv_bits_per_element"`
				ServingCtx    int     `json:"serving_ctx"`
				KVBitsServing float64 `json:"kv_bits_per_element_serving"`
			} `json:"eval"`
		}
		decodeOneJSON(t, r.stdout, &rep)
		if !rep.Written || rep.KVCache != "oscar2" || len(rep.Stages) != 4 || !(rep.Eval.KL > 0) {
			t.Fatalf("run %d report: %+v", i, rep)
		}
		// oscar2 on head_dim 8: 6 bits per quantized element (2-bit codes,
		// fp16 scale and zero per row of 8), the 8+32 window tokens 16:
		// (40·16 + 216·6)/256 at the eval context, (40·16 + 32728·6)/32768
		// at the default serving context.
		if rep.Eval.KVBits != 1936.0/256 || rep.Eval.ServingCtx != 32768 || rep.Eval.KVBitsServing != 197008.0/32768 {
			t.Errorf("run %d: kv bits/element %v at ctx 256, %v at serving ctx %d; want %v and %v at 32768",
				i, rep.Eval.KVBits, rep.Eval.KVBitsServing, rep.Eval.ServingCtx, 1936.0/256, 197008.0/32768)
		}
		for _, s := range rep.Stages {
			if !s.Cached {
				t.Errorf("run %d: stage %s recomputed", i, s.Name)
			}
		}
	}
	// The text report's gate line gives the measured ΔPPL and KL and
	// names only the bounds that are set (max_kl 0 is no bound, not
	// "max_kl 0").
	r = lmpack(t, nil, "compress", modelDir(t), "--recipe", writeRecipe(t, 1024, "100000", "0"), "-o", out)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "gate passed (ΔPPL +") || !regexp.MustCompile(`of the source perplexity, KL [0-9]\.[0-9]{5}; max_delta_ppl_pct 100000\)\n`).MatchString(r.stdout) || strings.Contains(r.stdout, "max_kl") {
		t.Errorf("gate line with max_kl unset: want only max_delta_ppl_pct named:\n%s", r.stdout)
	}
	// The eval table gives KV bits/element at the eval context and at the
	// serving context, as eval --kv does: 7.5625 and 6.0122 (above).
	if !strings.Contains(r.stdout, "     kv  kv_bits kv_bits@32768\n") || !regexp.MustCompile(`\nsource .* fp32    32\.00         32\.00\n`).MatchString(r.stdout) ||
		!regexp.MustCompile(`\nartifact .* oscar2     7\.56          6\.01\n`).MatchString(r.stdout) {
		t.Errorf("eval table: want kv_bits 7.56 and kv_bits@32768 6.01 for the artifact:\n%s", r.stdout)
	}
	wantOK(t, lmpack(t, nil, "verify", out))
	wantOK(t, lmpack(t, nil, "eval", out, "--data", valText(t), "--ctx", "256", "--max-windows", "1"))
}

// TestCompressKilled: compress killed with SIGKILL in the middle of
// calibrate, then rerun and killed again once eval started, leaves no
// output and only the killed stage's temporary directory; the last rerun
// reuses calibrate, quantize-kv and pack, recomputes eval, and writes an
// artifact byte-identical to an uninterrupted run's. The model and data
// files keep their bytes.
func TestCompressKilled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	recipe := writeRecipe(t, 16384, "100000", "10")
	inputs := []string{filepath.Join(modelDir(t), "model.safetensors"), filepath.Join(modelDir(t), "config.json"),
		shared.Path(t, "tinystories-valid", "calib.txt"), shared.Path(t, "tinystories-valid", "heldout.txt")}
	before := map[string][]byte{}
	for _, p := range inputs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		before[p] = b
	}
	ref := filepath.Join(dir, "ref.lmpk")
	wantOK(t, lmpack(t, nil, "compress", modelDir(t), "--recipe", recipe, "-o", ref, "--threads", "1"))

	out := filepath.Join(dir, "out.lmpk")
	work := filepath.Join(dir, "work")
	args := []string{"compress", modelDir(t), "--recipe", recipe, "-o", out, "--work-dir", work, "--threads", "1"}
	// Kill once while calibrate runs, then again once eval has started.
	for _, c := range []struct{ line, stage string }{
		{`"msg":"calibrate progress"`, "calibrate"},
		{`"msg":"stage started","stage":"eval"`, "eval"},
	} {
		killAt(t, append([]string{"--log-format", "json"}, args...), c.line)
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("output exists after the kill in %s", c.stage)
		}
		if tmp, _ := filepath.Glob(filepath.Join(work, "."+c.stage+"-*.tmp-*")); len(tmp) != 1 {
			all, _ := filepath.Glob(filepath.Join(work, ".*.tmp-*"))
			t.Fatalf("after the kill in %s: temporary stage dirs %v, want that stage's", c.stage, all)
		}
	}
	r := lmpack(t, nil, append(args, "--json")...)
	wantOK(t, r)
	var rep struct {
		Stages []struct {
			Name   string `json:"name"`
			Cached bool   `json:"cached"`
		} `json:"stages"`
	}
	decodeOneJSON(t, r.stdout, &rep)
	want := map[string]bool{"calibrate": true, "quantize-kv": true, "pack": true, "eval": false}
	for _, s := range rep.Stages {
		if c, ok := want[s.Name]; !ok || c != s.Cached {
			t.Errorf("rerun after the kill in eval: stage %s cached %v", s.Name, s.Cached)
		}
	}
	if len(rep.Stages) != len(want) {
		t.Errorf("rerun stages %+v", rep.Stages)
	}
	a, _ := os.ReadFile(ref)
	b, _ := os.ReadFile(out)
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("resumed artifact (%d bytes) differs from the uninterrupted one (%d bytes)", len(b), len(a))
	}
	for _, p := range inputs {
		if b, _ := os.ReadFile(p); !bytes.Equal(b, before[p]) {
			t.Errorf("input %s changed", p)
		}
	}
}

// killAt starts lmpack with args, waits for a stderr line containing line
// and kills the process with SIGKILL.
func killAt(t *testing.T, args []string, line string) {
	t.Helper()
	cmd := exec.Command(lmpackBin, args...)
	cmd.Env = isolatedEnv(t)
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// No time limit: the line comes or the process ends.
	for !strings.Contains(stderr.String(), line) {
		select {
		case err := <-done:
			t.Fatalf("lmpack ended before the kill (%v):\n%s", err, stderr.String())
		case <-time.After(2 * time.Millisecond):
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	err := <-done
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("want death by SIGKILL, got %v", err)
	}
}
