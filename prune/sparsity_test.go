package prune

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/prune/width"
)

// wantBudget is the budget split of docs/METHODS.md §6 computed here from
// the config alone: attention units, head groups and FFN nodes removed per
// layer, and the decoder parameter count (no biases in stories260K).
func wantBudget(t *testing.T, d *arch.Description, s float64) (nAttn, groups, remove int, pAttn, pGroup, P float64) {
	t.Helper()
	ly := d.Layers[0]
	L, D, F := float64(len(d.Layers)), float64(d.HiddenSize), float64(ly.MLP.IntermediateSize)
	q := float64(ly.NumHeads * ly.HeadDim)
	kv := float64(ly.NumKVHeads * ly.HeadDim)
	pAttn = 2*q*D + 2*kv*D
	pMLP := 3 * D * F
	pGroup = pAttn / float64(ly.NumKVHeads)
	nAttn = int(math.Round(L * math.Pow(s, pMLP/pAttn/1.5)))
	groups = nAttn * ly.NumKVHeads
	P = L * (pAttn + pMLP)
	remove = int(math.Round((s*P - float64(nAttn)*pAttn) / L / (3 * D)))
	return
}

// TestSparsity: --sparsity 0.2 (FFN only on stories260K: n_attn rounds to
// 0) and 0.5 (one attention unit = 4 head groups, Putri scores) remove the
// head groups and FFN nodes of the budget formula, hit the requested
// decoder sparsity within half an FFN node per layer, and give a model that
// loads and evaluates.
func TestSparsity(t *testing.T) {
	model := shared.Path(t, "stories260K-hf")
	cal := calibStories(t, model)
	d, err := arch.Load(model)
	if err != nil {
		t.Fatal(err)
	}
	if a := d.Layers[0].Attn; a.QBias != "" || a.OBias != "" {
		t.Fatal("stories260K has attention biases; the expected counts assume none")
	}
	L, D, F, G := len(d.Layers), d.HiddenSize, d.Layers[0].MLP.IntermediateSize, d.Layers[0].NumKVHeads
	base := heldoutPPL(t, model)
	for _, s := range []float64{0.2, 0.5} {
		nAttn, groups, remove, pAttn, pGroup, P := wantBudget(t, d, s)
		if keep, err := width.FFNKeep(L, F, D, s, nAttn, pAttn); err != nil || keep != F-remove {
			t.Fatalf("s=%v: width.FFNKeep %d, %v; want %d", s, keep, err, F-remove)
		}
		out := filepath.Join(t.TempDir(), "sparse")
		r, err := Run(context.Background(), Options{Model: model, Calib: cal, Out: out, Sparsity: s, HeadStep: 2, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		p := r.Sparsity
		if p == nil || p.Sparsity != s || p.AttentionUnits != nAttn || p.HeadGroups != groups || len(r.HeadsRemoved) != groups ||
			p.FFNRemoved != remove || p.FFNKeep != F-remove || p.DecoderParams != int64(P) {
			t.Fatalf("s=%v: plan %+v, %d groups removed; want n_attn %d, %d groups, FFN keep %d of %d, %v decoder params", s, p, len(r.HeadsRemoved), nAttn, groups, F-remove, F, P)
		}
		if (groups > 0) != (r.HeadMethod == HeadPutri) || len(r.FFN) != L || !r.Refit {
			t.Errorf("s=%v: head method %q, FFN %v, refit %v", s, r.HeadMethod, r.FFN, r.Refit)
		}
		kv := 0
		for l, ls := range r.LayerSizes {
			if ls.IntermediateSize != F-remove || ls.NumKeyValueHeads < 1 || ls.NumAttentionHeads != ls.NumKeyValueHeads*d.Layers[l].NumHeads/G {
				t.Errorf("s=%v: layer %d sizes %+v", s, l, ls)
			}
			kv += ls.NumKeyValueHeads
		}
		if kv != L*G-groups {
			t.Errorf("s=%v: %d KV groups left, want %d", s, kv, L*G-groups)
		}
		removed := float64(groups)*pGroup + float64(L*remove*3*D)
		if float64(p.RemovedParams) != removed || float64(r.Before.Params-r.After.Params) != removed ||
			math.Abs(p.Achieved-removed/P) > 1e-12 {
			t.Errorf("s=%v: removed %d (report %d -> %d), achieved %v; want %v", s, p.RemovedParams, r.Before.Params, r.After.Params, p.Achieved, removed)
		}
		// Attention is removed in whole units and the FFNs make up the
		// rest, so the only error is the rounding of the FFN nodes: at
		// most half a node per layer.
		if tol := float64(L) * 1.5 * float64(D) / P; math.Abs(p.Achieved-s) > tol {
			t.Errorf("s=%v: achieved %v, want within %v", s, p.Achieved, tol)
		}
		ppl := heldoutPPL(t, out)
		if math.IsNaN(ppl) || math.IsInf(ppl, 0) || !(ppl > 1) {
			t.Errorf("s=%v: heldout PPL %v", s, ppl)
		}
		t.Logf("sparsity %v: n_attn %d, %d head groups, FFN keep %d/%d, achieved %.4f; heldout PPL (ctx 512, 16 windows) %.4f (unpruned %.4f)",
			s, nAttn, groups, F-remove, F, p.Achieved, ppl, base)
	}
}

// TestSparsityBad: sparsities outside (0, 1), unreachable or rounding to
// nothing, and sparsity with explicit head/FFN budgets or layer removal
// are ErrOptions errors that say why; no output is created. The budget is
// checked before the calibration file is read, so none is needed.
func TestSparsityBad(t *testing.T) {
	model := shared.Path(t, "stories260K-hf")
	out := filepath.Join(t.TempDir(), "out")
	for _, k := range []struct {
		opt  Options
		want []string
	}{
		{Options{Sparsity: math.NaN()}, []string{"Sparsity NaN: want in (0, 1)"}},
		{Options{Sparsity: 1}, []string{"Sparsity 1: want in (0, 1)"}},
		{Options{Sparsity: -0.2}, []string{"Sparsity -0.2: want in (0, 1)"}},
		// 5·0.9^(2.6875/1.5) rounds to 4 units = 16 of 20 groups.
		{Options{Sparsity: 0.9}, []string{"4 attention unit(s) = 16 of 20 KV head groups", "at most 15", "reaches sparsity 0.003 to 0.8"}},
		// 0.001 · 226560 / 5 = 45 parameters per FFN: no 192-parameter node.
		{Options{Sparsity: 0.001}, []string{"rounds to no head group and no FFN node", "reaches sparsity 0.003"}},
		{Options{Sparsity: 0.2, FFNRatio: 0.1}, []string{"Sparsity 0.2: want no HeadGroups, HeadRatio or FFNRatio with it"}},
		{Options{Sparsity: 0.2, HeadGroups: 2}, []string{"Sparsity 0.2: want no HeadGroups"}},
		{Options{Sparsity: 0.2, Layers: 1, Method: "lorp"}, []string{"Sparsity: want no layer removal (Layers) in the same run"}},
		{Options{Sparsity: 0.2, HeadMethod: "magic"}, []string{`HeadMethod "magic": want putri or proxy`}},
	} {
		o := k.opt
		o.Model, o.Out, o.Calib = model, out, filepath.Join(t.TempDir(), "never-read.safetensors")
		_, err := Run(context.Background(), o)
		if err == nil {
			t.Errorf("%+v accepted", k.opt)
			continue
		}
		for _, w := range k.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %v: want %q", k.opt, err, w)
			}
		}
	}
}
