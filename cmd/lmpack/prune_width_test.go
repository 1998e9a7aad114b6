package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/prune"
)

// TestPruneWidth: head groups (proxy, then putri) and FFN units removed
// from stories260K through the CLI; the JSON and text reports, the
// layer_configs in config.json, and that inspect and eval accept the
// result.
func TestPruneWidth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	model := modelDir(t)
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "1024", "--ctx", "256", "--threads", "1", "-o", cal))
	total, _, tied := layerParamsTied(t, model)

	out := filepath.Join(dir, "proxy")
	r := lmpack(t, nil, "prune", model, "--calib", cal, "-o", out, "--head-groups", "4", "--head-method", "proxy", "--ffn-ratio", "0.25", "--threads", "1", "--json")
	wantOK(t, r)
	var rep prune.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	if rep.HeadMethod != "proxy" || len(rep.HeadsRemoved) != 4 || len(rep.FFN) != 5 || !rep.Refit || len(rep.LayerSizes) != 5 || rep.Before.Params != total {
		t.Fatalf("report %+v", rep)
	}
	// Progress off a terminal: log lines, the last with all 5 FFN layers
	// (the proxy method runs no masked perplexity and no o_proj refit).
	if !strings.Contains(r.stderr, "width pruning progress") || !strings.Contains(r.stderr, "steps_done=5 steps=5") {
		t.Errorf("stderr lacks the width pruning progress:\n%s", r.stderr)
	}
	// 4 groups × (q 16 + k 8 + v 8 rows + o 16 columns) × 64, and 43 FFN
	// nodes × 3 × 64 per layer.
	if want := total - 4*48*64 - 5*43*3*64; rep.After.Params != want || rep.After.Bytes != 4*(want+tied) {
		t.Errorf("after %+v, want %d params", rep.After, want)
	}
	var cfg struct {
		LayerConfigs []map[string]int `json:"layer_configs"`
		Heads        int              `json:"num_attention_heads"`
	}
	b, _ := os.ReadFile(filepath.Join(out, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil || len(cfg.LayerConfigs) != 5 || cfg.Heads != 8 {
		t.Fatalf("config.json: %v %+v", err, cfg)
	}
	heads := 0
	for l, lc := range cfg.LayerConfigs {
		s := rep.LayerSizes[l]
		if lc["intermediate_size"] != 129 || lc["num_attention_heads"] != s.NumAttentionHeads || lc["num_key_value_heads"] != s.NumKeyValueHeads ||
			s.NumAttentionHeads != 2*s.NumKeyValueHeads || s.NumKeyValueHeads < 1 {
			t.Errorf("layer %d: layer_configs %v, report %+v", l, lc, s)
		}
		heads += s.NumKeyValueHeads
	}
	if heads != 16 {
		t.Errorf("%d KV groups left, want 20-4", heads)
	}
	r = lmpack(t, nil, "inspect", out)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "intermediate 129") {
		t.Errorf("inspect:\n%s", r.stdout)
	}
	base, p := heldoutPPL(t, model), heldoutPPL(t, out)
	t.Logf("heldout PPL: unpruned %.4f, 4 head groups (proxy) + 25%% FFN %.4f", base, p)

	// Putri heads, text report.
	out2 := filepath.Join(dir, "putri")
	r = lmpack(t, nil, "prune", model, "--calib", cal, "-o", out2, "--head-ratio", "0.1", "--head-step", "2", "--threads", "1")
	wantOK(t, r)
	for _, want := range []string{"width-pruned", "stock loaders cannot load it", "head groups removed: 2 (method putri", "masked_ppl", "intermediate",
		fmt.Sprintf("parameters %d -> %d", total, total-2*48*64)} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("text report lacks %q:\n%s", want, r.stdout)
		}
	}
	heldoutPPL(t, out2)
}

// TestPruneMoE: layer pruning works on the MoE model (experts and routers
// renumbered with their block); width pruning is refused.
func TestPruneMoE(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	model := shared.Path(t, "stories260K-moe-hf")
	cal := filepath.Join(dir, "moe.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "1024", "--ctx", "256", "--threads", "1", "-o", cal))
	total, perLayer := layerParams(t, model)
	for _, method := range []string{"lorp", "shortgpt"} {
		out := filepath.Join(dir, method)
		r := lmpack(t, nil, "prune", model, "--calib", cal, "-o", out, "--layers", "2", "--layer-method", method, "--json")
		wantOK(t, r)
		var rep prune.Report
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Removed) != 2 || rep.LayersAfter != 3 {
			t.Fatalf("%s: %+v", method, rep)
		}
		want := total
		for _, l := range rep.Removed {
			if l.Layer < 1 || l.Layer > 3 {
				t.Errorf("%s removed protected layer %d", method, l.Layer)
			}
			want -= perLayer[l.Layer]
		}
		if rep.After.Params != want {
			t.Errorf("%s: %d params after, want %d", method, rep.After.Params, want)
		}
		r = lmpack(t, nil, "inspect", out)
		wantOK(t, r)
		if !strings.Contains(r.stdout, "layers: 3") || !strings.Contains(r.stdout, "model.layers.2.block_sparse_moe.experts.3.w1.weight") {
			t.Errorf("%s inspect:\n%s", method, r.stdout)
		}
		p := heldoutPPL(t, out)
		t.Logf("MoE %s keeps layers %v: heldout PPL %.4f", method, rep.Kept, p)
	}
	wantError(t, lmpack(t, nil, "prune", model, "--calib", cal, "-o", filepath.Join(dir, "w"), "--ffn-ratio", "0.25"),
		"mixture-of-experts", "supports dense models only")
	wantError(t, lmpack(t, nil, "prune", model, "--calib", cal, "-o", filepath.Join(dir, "w"), "--head-groups", "1"), "mixture-of-experts")
}

// TestPruneWidthBad: bad width requests fail clearly and never touch the
// model directory.
func TestPruneWidthBad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	model := brokenDir(t, origSafetensors(t))
	snap := func() map[string]string {
		m := map[string]string{}
		ents, _ := os.ReadDir(model)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(model, e.Name()))
			m[e.Name()] = string(b)
		}
		return m
	}
	before := snap()
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "256", "--ctx", "256", "--threads", "1", "-o", cal))
	out := filepath.Join(dir, "out")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--head-groups", "16"}, []string{"breaks GQA grouping", "16 of 20", "at most 15"}},
		{[]string{"--head-groups", "20", "--head-method", "proxy"}, []string{"breaks GQA grouping"}},
		{[]string{"--head-ratio", "0.8"}, []string{"breaks GQA grouping", "16 of 20"}},
		{[]string{"--head-ratio", "1"}, []string{"--head-ratio 1: want in (0, 1)"}},
		{[]string{"--head-groups", "0"}, []string{"--head-groups 0: want > 0"}},
		{[]string{"--head-groups", "2", "--head-ratio", "0.1"}, []string{"at most one of --head-groups"}},
		{[]string{"--head-groups", "2", "--head-method", "magic"}, []string{`--head-method "magic"`}},
		{[]string{"--ffn-ratio", "1.5"}, []string{"--ffn-ratio 1.5: want in (0, 1)"}},
		{[]string{"--head-groups", "2", "--layers", "1"}, []string{"--head-groups: want no layer removal (--layers) in the same run"}},
		{[]string{"--ffn-ratio", "0.2", "--layer-method", "list:2"}, []string{"--ffn-ratio: want no layer removal (--layer-method)"}},
		{[]string{"--layers", "1", "--no-refit"}, []string{"--no-refit: want --ffn-ratio or --sparsity"}},
		{[]string{"--layers", "1", "--head-refit"}, []string{"--head-refit: want --head-groups, --head-ratio or --sparsity"}},
		{[]string{"--head-refit"}, []string{"--head-refit: want --head-groups, --head-ratio or --sparsity"}},
		{[]string{"--ffn-ratio", "0.2", "--head-refit"}, []string{"--head-refit: want --head-groups"}},
		{[]string{"--ffn-ratio", "0.2", "-o", model}, []string{"is the model directory"}},
	} {
		args := append([]string{"prune", model, "--calib", cal, "-o", out, "--threads", "1"}, tc.args...)
		wantError(t, lmpack(t, nil, args...), tc.want...)
	}
	wantError(t, lmpack(t, nil, "prune", model, "-o", out, "--ffn-ratio", "0.2"), "--calib: want a calibration file (head and FFN pruning")
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a failed prune created %s", out)
	}
	after := snap()
	if len(after) != len(before) {
		t.Errorf("model directory: %d files, was %d", len(after), len(before))
	}
	for k, v := range before {
		if after[k] != v {
			t.Errorf("model file %s changed", k)
		}
	}
}
