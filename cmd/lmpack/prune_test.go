package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/prune"
	"github.com/lmpack/lmpack/prune/depth"
	"github.com/spf13/cobra"
)

// pruneEvalWindows keeps the perplexity comparison quick: 16 windows of
// 512 tokens of heldout.txt.
const pruneEvalWindows = "16"

// layerParams counts, from the original checkpoint, the elements of all
// tensors and of each "model.layers.N." block. The models tie lm_head to
// the embedding: its stored copy (tied elements) is not a parameter, so
// total excludes it (as prune's report and lmpack inspect count).
func layerParams(t *testing.T, dir string) (total int64, perLayer map[int]int64) {
	total, perLayer, _ = layerParamsTied(t, dir)
	return total, perLayer
}

// layerParamsTied is layerParams plus the elements of the stored tied
// lm_head copy.
func layerParamsTied(t *testing.T, dir string) (total int64, perLayer map[int]int64, tied int64) {
	t.Helper()
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	perLayer = map[int]int64{}
	for _, name := range ck.Names() {
		ti, _, err := ck.Info(name)
		if err != nil {
			t.Fatal(err)
		}
		n := int64(1)
		for _, s := range ti.Shape {
			n *= int64(s)
		}
		if name == "lm_head.weight" {
			tied = n
			continue
		}
		total += n
		var l int
		var rest string
		if _, err := fmt.Sscanf(name, "model.layers.%d.%s", &l, &rest); err == nil {
			perLayer[l] += n
		}
	}
	return total, perLayer, tied
}

func heldoutPPL(t *testing.T, model string) float64 {
	t.Helper()
	r := lmpack(t, nil, "eval", model, "--data", shared.Path(t, "tinystories-valid", "heldout.txt"), "--ctx", "512", "--max-windows", pruneEvalWindows, "--threads", "1", "--json")
	wantOK(t, r)
	var out struct {
		Perplexity float64 `json:"perplexity"`
		Windows    int     `json:"windows"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Windows != 16 || !(out.Perplexity > 1) {
		t.Fatalf("eval %s: %v %+v\n%s", model, err, out, r.stdout)
	}
	return out.Perplexity
}

// TestPruneDepth calibrates stories260K, removes one of its 5 layers with
// each method, checks the checkpoints, reports and that inspect and eval
// accept them, and logs the heldout perplexity of every eligible single
// removal with the rank of each method's pick.
func TestPruneDepth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mdir := modelDir(t)
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", mdir, "--data", calibText(t), "--tokens", "2048", "--ctx", "256", "--threads", "1", "-o", cal))
	c, err := calibrate.Read(cal, model.Expect{})
	if err != nil || !c.Has(calibrate.StatLoRP) || len(c.Similarity) != 36 {
		t.Fatalf("calibration: %v, statistics %v, %d similarity values", err, c.Header.Statistics, len(c.Similarity))
	}
	total, perLayer, tied := layerParamsTied(t, mdir)
	if len(perLayer) != 5 {
		t.Fatalf("%d layers in the checkpoint", len(perLayer))
	}

	// Text report of list:2.
	out2 := filepath.Join(dir, "list2")
	r := lmpack(t, nil, "prune", mdir, "-o", out2, "--layer-method", "list:2")
	wantOK(t, r)
	for _, want := range []string{"wrote " + out2 + ": 5 -> 4 layers (method list)", "kept layers [0 1 3 4]",
		fmt.Sprintf("parameters %d -> %d", total, total-perLayer[2])} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("prune list:2 stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	var cfg map[string]any
	b, _ := os.ReadFile(filepath.Join(out2, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil || cfg["num_hidden_layers"] != 4.0 {
		t.Errorf("config.json: %v, num_hidden_layers %v", err, cfg["num_hidden_layers"])
	}
	orig, _ := safetensors.OpenDir(mdir)
	got, err := safetensors.OpenDir(out2)
	if err != nil {
		t.Fatal(err)
	}
	for newL, oldL := range []int{0, 1, 3, 4} {
		for _, name := range orig.Names() {
			suffix, ok := strings.CutPrefix(name, fmt.Sprintf("model.layers.%d.", oldL))
			if !ok {
				continue
			}
			a, err := got.Tensor(fmt.Sprintf("model.layers.%d.%s", newL, suffix))
			if err != nil {
				t.Fatal(err)
			}
			o, _ := orig.Tensor(name)
			if a.DType != o.DType || !slices.Equal(a.Data, o.Data) {
				t.Errorf("new layer %d %s differs from original layer %d", newL, suffix, oldL)
			}
		}
	}
	if _, err := got.Tensor("model.layers.4.mlp.up_proj.weight"); err == nil {
		t.Errorf("pruned checkpoint still has a layer 4")
	}
	orig.Close()
	got.Close()
	r = lmpack(t, nil, "inspect", out2)
	wantOK(t, r)
	if !strings.Contains(r.stdout, "layers: 4") || strings.Contains(r.stdout, "layer 4:") {
		t.Errorf("inspect:\n%s", r.stdout)
	}

	base := heldoutPPL(t, mdir)
	ppl := map[int]float64{}
	for l := 1; l <= 3; l++ {
		o := filepath.Join(dir, fmt.Sprintf("drop%d", l))
		if l == 2 {
			o = out2
		} else {
			wantOK(t, lmpack(t, nil, "prune", mdir, "--calib", cal, "-o", o, "--layer-method", fmt.Sprintf("list:%d", l)))
		}
		ppl[l] = heldoutPPL(t, o)
		if !(ppl[l] > base) {
			t.Logf("removing layer %d lowers perplexity: %.4f vs %.4f", l, ppl[l], base)
		}
	}
	rank := func(l int) int {
		n := 1
		for m, p := range ppl {
			if m != l && p < ppl[l] {
				n++
			}
		}
		return n
	}
	// The ranks of the three eligible removals are 1, 2 and 3 (perplexities
	// are distinct floats; equal ones would share a rank).
	var ranks []int
	for l := 1; l <= 3; l++ {
		ranks = append(ranks, rank(l))
	}
	if slices.Sort(ranks); !slices.Equal(ranks, []int{1, 2, 3}) && ppl[1] != ppl[2] && ppl[2] != ppl[3] && ppl[1] != ppl[3] {
		t.Errorf("ranks %v of distinct perplexities %v are not 1..3", ranks, ppl)
	}
	picks := map[string]int{}
	for _, method := range []string{"lorp", "shortgpt"} {
		o := filepath.Join(dir, method)
		r := lmpack(t, nil, "prune", mdir, "--calib", cal, "-o", o, "--layers", "1", "--layer-method", method, "--json")
		wantOK(t, r)
		var rep prune.Report
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Method != method || len(rep.Removed) != 1 || rep.LayersAfter != 4 {
			t.Fatalf("%s report %+v", method, rep)
		}
		l := rep.Removed[0].Layer
		if l < 1 || l > 3 {
			t.Fatalf("%s removed layer %d; only 1..3 are eligible", method, l)
		}
		if rep.Before.Params != total || rep.After.Params != total-perLayer[l] || rep.Before.Bytes != 4*(total+tied) || rep.After.Bytes != 4*(total+tied-perLayer[l]) {
			t.Errorf("%s sizes %+v -> %+v; want %d -> %d params (F32)", method, rep.Before, rep.After, total, total-perLayer[l])
		}
		bi := 1 - c.Similarity[l*6+l+1]
		if rep.Removed[0].BlockInfluence == nil || *rep.Removed[0].BlockInfluence != bi {
			t.Errorf("%s: block influence %v, want 1 - S[%d][%d] = %v", method, rep.Removed[0].BlockInfluence, l, l+1, bi)
		}
		if method == "lorp" {
			if rep.K < 2 || rep.K > 4 || len(rep.Labels) != 5 || rep.Removed[0].Redundancy == nil || rep.RLS <= 0 {
				t.Errorf("lorp report: RLS %v, K %d, labels %v", rep.RLS, rep.K, rep.Labels)
			}
			t.Logf("lorp: RLS %.4f, K %d, labels %v, redundancy %.4f", rep.RLS, rep.K, rep.Labels, *rep.Removed[0].Redundancy)
		} else {
			// ShortGPT removes the eligible layer of lowest BI = 1 - S[l][l+1].
			best := 1
			for m := 2; m <= 3; m++ {
				if 1-c.Similarity[m*6+m+1] < 1-c.Similarity[best*6+best+1] {
					best = m
				}
			}
			if l != best {
				t.Errorf("shortgpt removed %d, lowest block influence is layer %d", l, best)
			}
		}
		if p := heldoutPPL(t, o); p != ppl[l] {
			t.Errorf("%s checkpoint perplexity %.6f, list:%d gave %.6f", method, p, l, ppl[l])
		}
		picks[method] = l
	}
	var lines []string
	lines = append(lines, fmt.Sprintf("heldout.txt PPL (ctx 512, %s windows): unpruned %.4f", pruneEvalWindows, base))
	for l := 1; l <= 3; l++ {
		lines = append(lines, fmt.Sprintf("  remove layer %d: %.4f (rank %d of 3)", l, ppl[l], rank(l)))
	}
	keys := []string{"lorp", "shortgpt"}
	sort.Strings(keys)
	for _, k := range keys {
		lines = append(lines, fmt.Sprintf("  %s picks layer %d: rank %d of 3", k, picks[k], rank(picks[k])))
	}
	t.Log("\n" + strings.Join(lines, "\n"))

	// --layer-ratio 0.2 of 5 layers removes one.
	r = lmpack(t, nil, "prune", mdir, "--calib", cal, "-o", filepath.Join(dir, "ratio"), "--layer-ratio", "0.2", "--layer-method", "shortgpt", "--json")
	wantOK(t, r)
	var rep prune.Report
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || len(rep.Removed) != 1 || rep.Removed[0].Layer != picks["shortgpt"] {
		t.Errorf("--layer-ratio 0.2: %v %+v", err, rep)
	}
}

// TestPruneBad: bad requests fail with clear messages and leave the model
// directory untouched.
func TestPruneBad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mdir := brokenDir(t, origSafetensors(t))
	snap := func() map[string]string {
		m := map[string]string{}
		ents, _ := os.ReadDir(mdir)
		for _, e := range ents {
			b, _ := os.ReadFile(filepath.Join(mdir, e.Name()))
			m[e.Name()] = string(b)
		}
		return m
	}
	before := snap()
	cal := filepath.Join(dir, "calib.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", mdir, "--data", calibText(t), "--tokens", "256", "--ctx", "256", "--threads", "1", "-o", cal))
	moeCal := filepath.Join(dir, "moe.safetensors")
	wantOK(t, lmpack(t, nil, "calibrate", shared.Path(t, "stories260K-moe-hf"), "--data", calibText(t), "--tokens", "256", "--ctx", "256", "--threads", "1", "-o", moeCal))
	// A calibration file of this model from before the lorp statistic.
	c, err := calibrate.Read(cal, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	c.Similarity = nil
	old := filepath.Join(dir, "old.safetensors")
	if err := calibrate.Write(old, c); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--calib", moeCal, "-o", out, "--layers", "1"}, []string{"calibration file is from another model", moeCal}},
		{[]string{"--calib", old, "-o", out, "--layers", "1"}, []string{"calibration file " + old + " lacks lorp.similarity: re-run lmpack calibrate"}},
		{[]string{"--calib", cal, "-o", filepath.Join(mdir, "out"), "--layers", "1"}, []string{"inside", "input is never modified"}},
		{[]string{"--calib", cal, "-o", mdir, "--layers", "1"}, []string{"is the model directory"}},
		{[]string{"--calib", cal, "-o", out, "--layers", "4"}, []string{"--layers 4: want at most 3 of the 5 layers removed"}},
		{[]string{"--calib", cal, "-o", out, "--layers", "4", "--layer-method", "shortgpt"}, []string{"--layers 4: want at most 3"}},
		{[]string{"--calib", cal, "-o", out, "--layer-method", "list:0"}, []string{"layer is protected", "layer 0"}},
		{[]string{"--calib", cal, "-o", out, "--layer-method", "list:4"}, []string{"layer is protected", "layer 4"}},
		{[]string{"--calib", cal, "-o", out, "--layer-method", "list:9"}, []string{"layer 9 outside [0, 5)"}},
		{[]string{"--calib", cal, "-o", out, "--layer-method", "list:2,2"}, []string{"listed twice"}},
		{[]string{"--calib", cal, "-o", out, "--layer-method", "list:two"}, []string{`--layer-method "list:two": want list:L1,L2,... (comma-separated layer indices)`}},
		{[]string{"--calib", cal, "-o", out, "--layer-method", "list:"}, []string{"want list:L1,L2"}},
		{[]string{"--calib", cal, "-o", out, "--layer-method", "magic", "--layers", "1"}, []string{`method "magic"`}},
		{[]string{"--calib", cal, "-o", out}, []string{"--layers: want something to prune", "--ffn-ratio"}},
		{[]string{"--calib", cal, "-o", out, "--layers", "0"}, []string{"--layers 0: want > 0"}},
		{[]string{"-o", out, "--layer-method", "LIST:1"}, []string{`--layer-method "LIST:1"`}},
		{[]string{"--calib", cal, "-o", out, "--ffn-ratio", "0.25", "--head-method", "proxy"}, []string{`--head-method "proxy": want --head-groups, --head-ratio or --sparsity`}},
		{[]string{"--calib", cal, "-o", out, "--head-groups", "2", "--no-refit"}, []string{"--no-refit: want --ffn-ratio or --sparsity"}},
		{[]string{"--calib", cal, "-o", out, "--layers", "1", "--layer-ratio", "0.2"}, []string{"exactly one of"}},
		{[]string{"--calib", cal, "-o", out, "--layer-ratio", "1.5"}, []string{"--layer-ratio 1.5: want in (0, 1)"}},
		{[]string{"--calib", cal, "-o", out, "--layers", "-1"}, []string{"--layers -1: want > 0"}},
		{[]string{"-o", out, "--layers", "1"}, []string{"--calib: want a calibration file (--layer-method lorp"}},
		{[]string{"--calib", cal, "--layers", "1"}, []string{"-o OUT is required"}},
	} {
		r := lmpack(t, nil, append([]string{"prune", mdir}, tc.args...)...)
		wantError(t, r, tc.want...)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a failed prune created %s", out)
	}
	// OUT that already exists.
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	wantError(t, lmpack(t, nil, "prune", mdir, "-o", out, "--layer-method", "list:2"), "already exists")
	if after := snap(); len(after) != len(before) {
		t.Errorf("model directory: %d files, was %d", len(after), len(before))
	} else {
		for k, v := range before {
			if after[k] != v {
				t.Errorf("model file %s changed", k)
			}
		}
	}
}

// TestPruneReportFallback: a LoRP plan that fell back to block influence
// (4 layers, K = L singleton clusters) says so in the text report and in
// --json.
func TestPruneReportFallback(t *testing.T) {
	const L = 4
	S := []float64{
		1, 0.9, 0.8, 0.65,
		0.9, 1, 0.7, 0.7,
		0.8, 0.7, 1, 0.95,
		0.65, 0.7, 0.95, 1,
	}
	plan, err := depth.LoRP(S, L, 1)
	if err != nil {
		t.Fatal(err)
	}
	r := &prune.Report{Out: "out", Method: plan.Method, LayersBefore: L, LayersAfter: L - 1, RLS: plan.RLS, K: plan.K, Labels: plan.Labels,
		Fallback: plan.Fallback, FallbackReason: plan.FallbackReason, Kept: plan.Kept(), Plan: plan,
		Removed: []prune.RemovedLayer{{Layer: 2}}, Before: prune.Sizes{Params: 10, Bytes: 40}, After: prune.Sizes{Params: 8, Bytes: 32}}
	var out strings.Builder
	cmd := &cobra.Command{}
	cmd.SetOut(&out)
	if err := writePruneReport(cmd, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "fallback block_influence: degenerate LoRP clustering") || !strings.Contains(out.String(), "kept layers [0 1 3]") {
		t.Errorf("text report:\n%s", out.String())
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back["fallback"] != "block_influence" || !strings.Contains(fmt.Sprint(back["fallback_reason"]), "lowest block influence") {
		t.Errorf("JSON report %s", b)
	}
}
