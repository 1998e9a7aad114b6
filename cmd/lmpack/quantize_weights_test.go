package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

// TestQuantizeWeights runs `lmpack quantize weights` on stories260K (GPTQ
// 4-bit g32 with act-order, text report; the allocator at 3.0 bpw, JSON
// report), runs eval and run on the outputs, and checks bad flags.
func TestQuantizeWeights(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	model := modelDir(t)
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "2048", "--ctx", "256", "--threads", "1", "-o", cal))

	q4 := filepath.Join(dir, "q4")
	r := lmpack(t, nil, "quantize", "weights", model, "--calib", cal, "-o", q4, "--method", "gptq", "--bits", "4", "--group", "32", "--act-order", "--threads", "1")
	wantOK(t, r)
	// down_proj (172 columns) falls back to per-channel.
	for _, want := range []string{"wrote " + q4 + ": method gptq, 226560 weights at ", "model.layers.4.mlp.down_proj.weight", " chan ", "quantized tensors 906240 -> "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "quantizing weights") || !strings.Contains(r.stderr, "steps_done=5") {
		t.Errorf("no progress lines:\n%s", r.stderr)
	}
	var cfg struct {
		Q struct {
			Tensors map[string]struct {
				Bits      int
				GroupSize int `json:"group_size"`
				Perm      bool
			}
		} `json:"lmpack_quantization"`
	}
	b, _ := os.ReadFile(filepath.Join(q4, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil || len(cfg.Q.Tensors) != 35 || !cfg.Q.Tensors["model.layers.0.mlp.up_proj.weight"].Perm ||
		cfg.Q.Tensors["model.layers.0.mlp.down_proj.weight"].Perm || cfg.Q.Tensors["model.layers.0.mlp.down_proj.weight"].GroupSize != 172 {
		t.Errorf("config.json block: %v %+v", err, cfg.Q)
	}
	ev := lmpack(t, nil, "eval", q4, "--data", valText(t), "--ctx", "256", "--max-windows", "4", "--threads", "1", "--json")
	wantOK(t, ev)
	var e struct {
		Perplexity float64 `json:"perplexity"`
	}
	if err := json.Unmarshal([]byte(ev.stdout), &e); err != nil || !(e.Perplexity > 1 && e.Perplexity < 20) {
		t.Errorf("eval of the 4-bit checkpoint: %v %v", err, e.Perplexity)
	}
	wantOK(t, lmpack(t, nil, "run", q4, "--prompt", "Once upon a time", "--max-tokens", "8", "--threads", "1"))
	// inspect counts the quantized weights' parameters on their qweights.
	in := lmpack(t, nil, "inspect", q4)
	wantOK(t, in)
	if !strings.Contains(in.stdout, "parameters:    260032") || !strings.Contains(in.stdout, "model.layers.0.mlp.up_proj.perm") {
		t.Errorf("inspect of the quantized checkpoint:\n%s", in.stdout)
	}

	a3 := filepath.Join(dir, "a3")
	r = lmpack(t, nil, "quantize", "weights", model, "--calib", cal, "-o", a3, "--target-bpw", "3", "--method", "rtn", "--threads", "1", "--json")
	wantOK(t, r)
	var rep struct {
		BPW        float64 `json:"bits_per_weight"`
		Target     float64 `json:"target_bpw"`
		Allocation struct {
			Choice []int  `json:"choice"`
			Method string `json:"method"`
		} `json:"allocation"`
		Tensors []struct {
			Bits int `json:"bits"`
		} `json:"tensors"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || rep.Target != 3 || rep.BPW > 3 || rep.BPW < 2.5 || len(rep.Allocation.Choice) != 35 || rep.Allocation.Method != "dp" || len(rep.Tensors) != 35 {
		t.Errorf("allocator report: %v %+v", err, rep)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", filepath.Join(dir, "x")}, "--calib CALIB is required"},
		{[]string{"--calib", cal}, "-o OUT is required"},
		{[]string{"--calib", cal, "-o", filepath.Join(dir, "x"), "--bits", "5"}, "--bits 5"},
		{[]string{"--calib", cal, "-o", filepath.Join(dir, "x"), "--group", "16"}, "--group 16"},
		{[]string{"--calib", cal, "-o", filepath.Join(dir, "x"), "--method", "awq"}, `--method "awq"`},
		{[]string{"--calib", cal, "-o", filepath.Join(dir, "x"), "--method", "rtn", "--act-order"}, "--act-order: want --method gptq"},
		{[]string{"--calib", cal, "-o", filepath.Join(dir, "x"), "--method", "rtn", "--true-sequential"}, "--true-sequential: want --method gptq"},
		{[]string{"--calib", cal, "-o", filepath.Join(dir, "x"), "--bits", "4", "--target-bpw", "3"}, "want exactly one of --bits and --target-bpw"},
		{[]string{"--calib", cal, "-o", filepath.Join(dir, "x"), "--target-bpw", "-1"}, "--target-bpw -1"},
		{[]string{"--calib", cal, "-o", q4}, "already exists"},
		{[]string{"--calib", cal, "-o", filepath.Join(model, "q")}, "inside"},
		{[]string{"--calib", filepath.Join(dir, "missing"), "-o", filepath.Join(dir, "x")}, "missing"},
	} {
		wantError(t, lmpack(t, nil, append([]string{"quantize", "weights", model}, tc.args...)...), tc.want)
	}
}

// TestQuantizeWeightsMoE runs `lmpack quantize weights --moe-budget 2.5`
// on stories260K-moe-hf (JSON and text reports), checks the per-layer,
// per-expert widths against the written config and the budget, evaluates
// the checkpoint, and checks the MoE flags' refusals.
func TestQuantizeWeightsMoE(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	moe := shared.Path(t, "stories260K-moe-hf")
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", moe, "--data", calibText(t), "--tokens", "2048", "--ctx", "256", "--threads", "1", "-o", cal))

	out := filepath.Join(dir, "q")
	r := lmpack(t, nil, "quantize", "weights", moe, "--calib", cal, "-o", out, "--method", "rtn", "--moe-budget", "2.5", "--group", "32", "--threads", "1", "--json")
	wantOK(t, r)
	var rep struct {
		BPW       float64 `json:"bits_per_weight"`
		ExpertBPW float64 `json:"expert_bits_per_weight"`
		Budget    float64 `json:"moe_budget"`
		MoE       struct {
			Layers    []int       `json:"layers"`
			Bits      [][]int     `json:"bits"`
			BPW       float64     `json:"bits_per_weight"`
			Predicted float64     `json:"predicted_error"`
			Method    string      `json:"method"`
			Widths    map[int]int `json:"widths"`
		} `json:"moe_allocation"`
		Tensors []struct {
			Name   string `json:"name"`
			Expert int    `json:"expert"`
			Bits   int    `json:"bits"`
		} `json:"tensors"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v:\n%s", err, r.stdout)
	}
	if rep.Budget != 2.5 || rep.ExpertBPW > 2.5 || rep.ExpertBPW != rep.MoE.BPW || len(rep.MoE.Bits) != 5 || rep.MoE.Method != "dp" || !(rep.MoE.Predicted > 0) {
		t.Errorf("report: budget %v expert bpw %v allocation %+v", rep.Budget, rep.ExpertBPW, rep.MoE)
	}
	var cfg struct {
		Q struct {
			Tensors map[string]struct{ Bits int } `json:"tensors"`
		} `json:"lmpack_quantization"`
	}
	b, _ := os.ReadFile(filepath.Join(out, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil || len(cfg.Q.Tensors) != 5*(4+4*3) {
		t.Fatalf("config.json: %v, %d quantized tensors", err, len(cfg.Q.Tensors))
	}
	experts := 0
	for _, tr := range rep.Tensors {
		if tr.Expert < 0 {
			if tr.Bits != 4 {
				t.Errorf("%s: %d bits, want --bits 4", tr.Name, tr.Bits)
			}
			continue
		}
		experts++
		var l int
		fmt.Sscanf(tr.Name, "model.layers.%d.", &l)
		if want := rep.MoE.Bits[l][tr.Expert]; tr.Bits != want || cfg.Q.Tensors[tr.Name].Bits != want {
			t.Errorf("%s: report %d bits, config %d, allocation %d", tr.Name, tr.Bits, cfg.Q.Tensors[tr.Name].Bits, want)
		}
	}
	if experts != 5*4*3 {
		t.Errorf("%d expert tensors in the report, want 60", experts)
	}
	ev := lmpack(t, nil, "eval", out, "--data", valText(t), "--ctx", "256", "--max-windows", "4", "--threads", "1", "--json")
	wantOK(t, ev)
	var e struct {
		Perplexity float64 `json:"perplexity"`
	}
	if err := json.Unmarshal([]byte(ev.stdout), &e); err != nil || !(e.Perplexity > 1 && e.Perplexity < 1000) {
		t.Errorf("eval of the MoE checkpoint: %v %v", err, e.Perplexity)
	}

	// Text report: the GEMQ allocation with a line per layer.
	txt := filepath.Join(dir, "t")
	r = lmpack(t, nil, "quantize", "weights", moe, "--calib", cal, "-o", txt, "--method", "gptq", "--moe-budget", "2.0", "--moe-weighting", "soft", "--moe-solver", "lagrangian", "--mse-clip", "--act-order", "--threads", "1")
	wantOK(t, r)
	for _, want := range []string{"method gptq (mse clip)", "experts at ", "(moe budget 2)", "GEMQ allocation: budget 2 bits per expert weight (stored bits, fp16 scales and zero-points counted", "solver lagrangian", "layer  bits per expert", "model.layers.4.block_sparse_moe.experts.3.w2.weight"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("text report lacks %q:\n%s", want, r.stdout)
		}
	}

	dense := modelDir(t)
	for _, tc := range []struct {
		model string
		args  []string
		want  string
	}{
		{moe, []string{"--moe-budget", "-1"}, "--moe-budget -1"},
		{moe, []string{"--moe-budget", "0"}, "--moe-budget 0: want > 0"},
		{dense, []string{"--target-bpw", "0", "--bits", "3"}, "--target-bpw 0: want > 0"},
		{moe, []string{"--moe-budget", "1.2"}, "--moe-budget 1.2: want at least the smallest allocation on this model, every expert at 1 bit"},
		{moe, []string{"--moe-budget", "2.5", "--target-bpw", "3"}, "not --target-bpw"},
		{moe, []string{"--moe-rule"}, "--moe-rule: want --moe-budget"},
		{moe, []string{"--moe-budget", "2.5", "--moe-weighting", "grad"}, `--moe-weighting "grad"`},
		{moe, []string{"--moe-budget", "2.5", "--moe-solver", "ilp"}, `--moe-solver "ilp"`},
		{moe, []string{"--moe-budget", "2.5", "--moe-group", "64"}, "does not divide the 172 columns"},
		{moe, []string{"--target-bpw", "3"}, "--target-bpw 3: want a dense model"},
		{dense, []string{"--moe-budget", "2.5"}, "is a dense model"},
	} {
		c := cal
		if tc.model == dense {
			c = filepath.Join(dir, "dense.safetensors")
			if _, err := os.Stat(c); err != nil {
				wantOK(t, lmpack(t, nil, "calibrate", dense, "--data", calibText(t), "--tokens", "256", "--ctx", "128", "--threads", "1", "-o", c))
			}
		}
		wantError(t, lmpack(t, nil, append([]string{"quantize", "weights", tc.model, "--calib", c, "-o", filepath.Join(dir, "x"), "--threads", "1"}, tc.args...)...), tc.want)
	}
}
