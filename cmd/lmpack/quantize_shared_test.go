package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/internal/synthmoe"
)

// TestQuantizeWeightsSharedExpert runs calibrate, `quantize weights
// --moe-budget` (GPTQ), pack and eval (on the checkpoint and on the
// artifact) on a synthetic Qwen2-MoE with shared experts
// (internal/synthmoe): every command exits 0, the shared experts'
// gate/up/down are in the config's quantization block at --bits and
// marked shared_expert in the JSON report, and the artifact evaluates to
// the checkpoint's perplexity.
func TestQuantizeWeightsSharedExpert(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	model := filepath.Join(dir, "qwen2moe")
	if _, err := synthmoe.Write(model, 11, shared.Path(t, "stories260K-hf")); err != nil {
		t.Fatal(err)
	}
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "2048", "--ctx", "256", "--threads", "1", "-o", cal))
	out := filepath.Join(dir, "q")
	r := lmpack(t, nil, "quantize", "weights", model, "--calib", cal, "-o", out, "--method", "gptq", "--bits", "4", "--group", "32",
		"--moe-budget", "2.5", "--threads", "1", "--json")
	wantOK(t, r)
	var rep struct {
		ExpertBPW float64 `json:"expert_bits_per_weight"`
		Tensors   []struct {
			Name   string `json:"name"`
			Expert int    `json:"expert"`
			Shared bool   `json:"shared_expert"`
			Bits   int    `json:"bits"`
		} `json:"tensors"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, r.stdout)
	}
	var cfg struct {
		Q struct {
			Tensors map[string]struct {
				Bits      int
				GroupSize int `json:"group_size"`
			} `json:"tensors"`
		} `json:"lmpack_quantization"`
	}
	b, _ := os.ReadFile(filepath.Join(out, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	nShared := 0
	for _, tr := range rep.Tensors {
		if !strings.Contains(tr.Name, ".shared_expert.") {
			continue
		}
		nShared++
		q := cfg.Q.Tensors[tr.Name]
		if !tr.Shared || tr.Expert != -1 || tr.Bits != 4 || q.Bits != 4 || q.GroupSize != 32 {
			t.Errorf("%s: report %+v, config %+v", tr.Name, tr, q)
		}
	}
	if nShared != 3*synthmoe.Layers || !(rep.ExpertBPW > 0 && rep.ExpertBPW <= 2.5) {
		t.Errorf("%d shared-expert tensors (want %d), expert bits per weight %v", nShared, 3*synthmoe.Layers, rep.ExpertBPW)
	}
	txt := filepath.Join(dir, "t")
	r = lmpack(t, nil, "quantize", "weights", model, "--calib", cal, "-o", txt, "--method", "rtn", "--bits", "8", "--moe-budget", "3", "--threads", "1")
	wantOK(t, r)
	for _, want := range []string{"(moe budget 3; shared experts at --bits, outside the budget)", "model.layers.1.mlp.shared_expert.down_proj.weight    8 "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("text report lacks %q:\n%s", want, r.stdout)
		}
	}
	art := filepath.Join(dir, "q.lmpk")
	wantOK(t, lmpack(t, nil, "pack", out, "-o", art))
	ppl := func(model string) float64 {
		ev := lmpack(t, nil, "eval", model, "--data", valText(t), "--ctx", "256", "--max-windows", "2", "--threads", "1", "--json")
		wantOK(t, ev)
		var e struct {
			Perplexity float64 `json:"perplexity"`
		}
		if err := json.Unmarshal([]byte(ev.stdout), &e); err != nil || !(e.Perplexity > 1) {
			t.Errorf("eval %s: %v %v", model, err, e.Perplexity)
		}
		return e.Perplexity
	}
	if pc, pa := ppl(out), ppl(art); pc != pa {
		t.Errorf("perplexity: checkpoint %v, artifact %v", pc, pa)
	}
}
