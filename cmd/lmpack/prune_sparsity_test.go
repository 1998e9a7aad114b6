package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/prune"
)

// sparsityBudget is Putri's budget split (docs/METHODS.md §6) for model
// at sparsity s, computed from its config: attention units, head groups,
// FFN nodes kept, and the decoder (attention + FFN projection) parameters
// counted from the checkpoint.
func sparsityBudget(t *testing.T, model string, s float64) (nAttn, groups, keep int, decoder int64) {
	t.Helper()
	d, err := arch.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(model)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for _, name := range ck.Names() {
		if strings.HasPrefix(name, "model.layers.") && strings.Contains(name, "_proj.") {
			ti, _, err := ck.Info(name)
			if err != nil {
				t.Fatal(err)
			}
			n := int64(1)
			for _, x := range ti.Shape {
				n *= int64(x)
			}
			decoder += n
		}
	}
	ly := d.Layers[0]
	L, D, F := float64(len(d.Layers)), float64(d.HiddenSize), ly.MLP.IntermediateSize
	pAttn := 2*D*float64(ly.NumHeads*ly.HeadDim) + 2*D*float64(ly.NumKVHeads*ly.HeadDim)
	pMLP := 3 * D * float64(F)
	if got := L * (pAttn + pMLP); got != float64(decoder) {
		t.Fatalf("decoder parameters %d in the checkpoint, %v from the config", decoder, got)
	}
	nAttn = int(math.Round(L * math.Pow(s, pMLP/pAttn/1.5)))
	groups = nAttn * ly.NumKVHeads
	remove := int(math.Round((s*float64(decoder) - float64(nAttn)*pAttn) / L / (3 * D)))
	return nAttn, groups, F - remove, decoder
}

// TestPruneSparsity: --sparsity through the CLI on stories260K (proxy
// heads with --json; Putri heads, no refit, text report): the head groups
// and FFN sizes of the budget formula, the achieved sparsity within half
// an FFN node per layer, layer_configs, and that eval accepts the result.
func TestPruneSparsity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	model := modelDir(t)
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "1024", "--ctx", "256", "--threads", "1", "-o", cal))
	total, _, _ := layerParamsTied(t, model)

	out := filepath.Join(dir, "s50")
	nAttn, groups, keep, decoder := sparsityBudget(t, model, 0.5)
	r := lmpack(t, nil, "prune", model, "--calib", cal, "-o", out, "--sparsity", "0.5", "--head-method", "proxy", "--threads", "1", "--json")
	wantOK(t, r)
	var rep prune.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.stdout)
	}
	p := rep.Sparsity
	if p == nil || p.Sparsity != 0.5 || p.AttentionUnits != nAttn || p.HeadGroups != groups || len(rep.HeadsRemoved) != groups || rep.HeadMethod != "proxy" ||
		p.FFNKeep != keep || p.DecoderParams != decoder || p.RemovedParams != rep.Before.Params-rep.After.Params || rep.Before.Params != total {
		t.Fatalf("report %+v, plan %+v; want n_attn %d, %d groups, FFN keep %d, %d decoder params", rep, p, nAttn, groups, keep, decoder)
	}
	if tol := 5 * 1.5 * 64 / float64(decoder); math.Abs(p.Achieved-0.5) > tol || p.Achieved != float64(p.RemovedParams)/float64(decoder) {
		t.Errorf("achieved %v (%d of %d), want 0.5 within %v", p.Achieved, p.RemovedParams, decoder, tol)
	}
	var cfg struct {
		LayerConfigs []map[string]int `json:"layer_configs"`
	}
	b, _ := os.ReadFile(filepath.Join(out, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil || len(cfg.LayerConfigs) != 5 {
		t.Fatalf("config.json: %v %+v", err, cfg)
	}
	kv := 0
	for l, lc := range cfg.LayerConfigs {
		if lc["intermediate_size"] != keep {
			t.Errorf("layer %d: layer_configs %v, want intermediate_size %d", l, lc, keep)
		}
		kv += lc["num_key_value_heads"]
	}
	if kv != 20-groups {
		t.Errorf("%d KV groups left, want %d", kv, 20-groups)
	}
	base, ppl := heldoutPPL(t, model), heldoutPPL(t, out)
	t.Logf("heldout PPL (ctx 512, 16 windows): unpruned %.4f, sparsity 0.5 (proxy heads, achieved %.4f) %.4f", base, p.Achieved, ppl)

	// Putri heads, no refit, text report.
	out2 := filepath.Join(dir, "s30")
	nAttn, groups, keep, _ = sparsityBudget(t, model, 0.3)
	r = lmpack(t, nil, "prune", model, "--calib", cal, "-o", out2, "--sparsity", "0.3", "--no-refit", "--head-step", "2", "--threads", "1")
	wantOK(t, r)
	for _, want := range []string{fmt.Sprintf("sparsity 0.3: %d attention unit(s) -> %d head group(s) removed, every FFN keeps %d", nAttn, groups, keep),
		"achieved sparsity 0.", fmt.Sprintf("head groups removed: %d (method putri", groups), "FFN sizes (no refit)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("text report lacks %q:\n%s", want, r.stdout)
		}
	}
	t.Logf("sparsity 0.3 (putri, no refit): heldout PPL %.4f\n%s", heldoutPPL(t, out2), r.stdout)
}

// TestPruneSparsityBad: bad --sparsity values and combinations exit 1 with
// a message naming the flag, and create nothing.
func TestPruneSparsityBad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	model := modelDir(t)
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", model, "--data", calibText(t), "--tokens", "256", "--ctx", "256", "--threads", "1", "-o", cal))
	out := filepath.Join(dir, "out")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--sparsity", "0"}, []string{"--sparsity 0: want in (0, 1)"}},
		{[]string{"--sparsity", "1"}, []string{"--sparsity 1: want in (0, 1)"}},
		{[]string{"--sparsity", "NaN"}, []string{"--sparsity NaN: want in (0, 1)"}},
		{[]string{"--sparsity", "0.2", "--ffn-ratio", "0.2"}, []string{"--sparsity 0.2: want no --head-groups, --head-ratio or --ffn-ratio with it"}},
		{[]string{"--sparsity", "0.2", "--head-groups", "2"}, []string{"--sparsity 0.2: want no --head-groups"}},
		{[]string{"--sparsity", "0.2", "--layers", "1"}, []string{"--sparsity: want no layer removal (--layers)"}},
		{[]string{"--sparsity", "0.9"}, []string{"16 of 20 KV head groups", "at most 15", "reaches sparsity"}},
		{[]string{"--sparsity", "0.001"}, []string{"rounds to no head group and no FFN node"}},
		// 256 tokens cannot refit 172-node FFNs.
		{[]string{"--sparsity", "0.2"}, []string{"holds 256 tokens", "--no-refit"}},
	} {
		args := append([]string{"prune", model, "--calib", cal, "-o", out, "--threads", "1"}, tc.args...)
		wantError(t, lmpack(t, nil, args...), tc.want...)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a failed prune created %s", out)
	}
}
