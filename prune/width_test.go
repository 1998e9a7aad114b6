package prune

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/runtime"
)

// calibStories calibrates stories260K on calib.txt (2048 tokens, windows
// of 256) into a temp file.
func calibStories(t *testing.T, model string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "calib.safetensors")
	if _, err := calibrate.Run(context.Background(), calibrate.Options{Model: model, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 2048, Ctx: 256, Out: out, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	return out
}

func openModel(t *testing.T, dir string) *engine.Engine {
	t.Helper()
	e, err := engine.Open(context.Background(), dir, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// heldout returns heldout.txt's token ids for e.
func heldout(t *testing.T, e *engine.Engine) []int {
	t.Helper()
	ids, err := e.EvalIDs(shared.Path(t, "tinystories-valid", "heldout.txt"), 512)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// heldoutPPL is the perplexity of model dir on heldout.txt, ctx 512,
// first 16 windows.
func heldoutPPL(t *testing.T, dir string) float64 {
	t.Helper()
	e := openModel(t, dir)
	r, err := e.EvalFile(context.Background(), shared.Path(t, "tinystories-valid", "heldout.txt"), engine.EvalOptions{Ctx: 512, MaxWindows: 16})
	if err != nil {
		t.Fatal(err)
	}
	return r.Perplexity
}

func logitsOf(t *testing.T, m runtime.Model, ids []int) []float32 {
	t.Helper()
	V := m.Description().VocabSize
	out := make([]float32, len(ids)*V)
	if err := m.Forward(context.Background(), ids, m.NewCache(len(ids)), out, true); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHeadPruneMatchesMasked is the heterogeneous-layer acceptance test: a
// head-pruned stories260K (Putri, 6 of 20 groups) gives the logits of the
// unpruned model run with the same KV groups masked, within 1e-5.
func TestHeadPruneMatchesMasked(t *testing.T) {
	mdir := shared.Path(t, "stories260K-hf")
	cal := calibStories(t, mdir)
	out := filepath.Join(t.TempDir(), "heads")
	r, err := Run(context.Background(), Options{Model: mdir, Calib: cal, Out: out, HeadGroups: 6, HeadMethod: HeadPutri, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.HeadsRemoved) != 6 || r.HeadMethod != HeadPutri || !(r.HeadBasePPL > 1) || r.Plan != nil || r.LayersAfter != 5 {
		t.Fatalf("report %+v", r)
	}
	t.Logf("Putri removed %+v (base PPL %.4f over every calibration window)", r.HeadsRemoved, r.HeadBasePPL)
	// Config and shapes.
	d, err := arch.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	gone := map[int][]bool{}
	for l := 0; l < 5; l++ {
		gone[l] = make([]bool, 4)
	}
	for _, g := range r.HeadsRemoved {
		if gone[g.Layer][g.Group] {
			t.Fatalf("group %d/%d removed twice", g.Layer, g.Group)
		}
		gone[g.Layer][g.Group] = true
	}
	var removedParams int64
	for l, ly := range d.Layers {
		n := 0
		for _, x := range gone[l] {
			if !x {
				n++
			}
		}
		if n == 0 || ly.NumKVHeads != n || ly.NumHeads != 2*n || ly.MLP.IntermediateSize != 172 || r.LayerSizes[l].NumKeyValueHeads != n {
			t.Errorf("layer %d: %d heads, %d KV heads, FFN %d; want %d KV groups kept", l, ly.NumHeads, ly.NumKVHeads, ly.MLP.IntermediateSize, n)
		}
		// q: 16 rows per group, k and v: 8, o: 16 columns; H = 64.
		removedParams += int64(4-n) * (16 + 8 + 8 + 16) * 64
	}
	if r.Before.Params-r.After.Params != removedParams || r.Before.Bytes-r.After.Bytes != 4*removedParams {
		t.Errorf("sizes %+v -> %+v: want %d fewer parameters", r.Before, r.After, removedParams)
	}
	// Logits vs the masked unpruned model.
	full := openModel(t, mdir)
	small := openModel(t, out)
	mk := full.Model.(runtime.KVGroupMasker)
	for l, m := range gone {
		if err := mk.MaskKVGroups(l, m); err != nil {
			t.Fatal(err)
		}
	}
	ids := heldout(t, full)[:200]
	a, b := logitsOf(t, full.Model, ids), logitsOf(t, small.Model, ids)
	var diff, scale float64
	for i := range a {
		diff = math.Max(diff, math.Abs(float64(a[i]-b[i])))
		scale = math.Max(scale, math.Abs(float64(a[i])))
	}
	// Both runs are float32; o_proj sums over 64 columns (some zero) in one
	// and fewer in the other, in a different order, so the bound is 1e-5
	// relative to the largest logit (as in runtime's reference tests).
	t.Logf("head-pruned vs masked unpruned: max abs logit diff %.3g over %d tokens, largest |logit| %.3g, relative %.3g", diff, len(ids), scale, diff/scale)
	if diff > 1e-5*math.Max(1, scale) {
		t.Errorf("max abs logit diff %.3g > 1e-5 × max(1, %.3g)", diff, scale)
	}

	// Putri's first pick: masking it alone gives the lowest perplexity of
	// all 20 single-group masks over every calibration window (8 windows
	// of 256 tokens: eval.Perplexity over the 2048 tokens), and the base
	// perplexity is that of the unmasked model over the same windows.
	c, err := calibrate.Read(cal, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	ws := c.CalibrationWindows()
	if len(ws) != 8 || len(ws[7]) != 256 {
		t.Fatalf("%d calibration windows, want 8 of 256 tokens", len(ws))
	}
	allPPL := func() float64 {
		p, err := eval.Perplexity(context.Background(), full.Model, c.TokenIDs, eval.PerplexityOptions{Ctx: 256})
		if err != nil {
			t.Fatal(err)
		}
		if p.Windows != 8 {
			t.Fatalf("%d windows scored, want 8", p.Windows)
		}
		return p.Perplexity
	}
	for l := 0; l < 5; l++ {
		mk.MaskKVGroups(l, nil)
	}
	if base := allPPL(); math.Abs(r.HeadBasePPL-base) > 1e-9*base {
		t.Errorf("base PPL %.12g, want %.12g (unmasked, all 8 windows)", r.HeadBasePPL, base)
	}
	var first RemovedGroup
	for _, g := range r.HeadsRemoved {
		if g.Round == 0 {
			first = g
		}
	}
	best := math.Inf(1)
	for l := 0; l < 5; l++ {
		for g := 0; g < 4; g++ {
			m := make([]bool, 4)
			m[g] = true
			mk.MaskKVGroups(l, m)
			p := allPPL()
			mk.MaskKVGroups(l, nil)
			best = math.Min(best, p)
			if l == first.Layer && g == first.Group && math.Abs(p-first.Score) > 1e-9*p {
				t.Errorf("round-0 group %d/%d: report score %v, masked perplexity over all windows %v", l, g, first.Score, p)
			}
		}
	}
	if math.Abs(first.Score-best) > 1e-9*best {
		t.Errorf("round-0 pick %+v, but the lowest single-group masked perplexity over all windows is %v", first, best)
	}
}

// TestHeadProxy: the proxy method removes the lowest-proxy groups while
// every layer keeps one, and the ratio form rounds.
func TestHeadProxy(t *testing.T) {
	mdir := shared.Path(t, "stories260K-hf")
	cal := calibStories(t, mdir)
	c, err := calibrate.Read(cal, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "proxy")
	r, err := Run(context.Background(), Options{Model: mdir, Calib: cal, Out: out, HeadRatio: 0.5, HeadMethod: HeadProxy})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.HeadsRemoved) != 10 {
		t.Fatalf("head ratio 0.5 of 20 groups removed %d", len(r.HeadsRemoved))
	}
	left := []int{4, 4, 4, 4, 4}
	isGone := map[[2]int]bool{}
	for _, g := range r.HeadsRemoved {
		left[g.Layer]--
		isGone[[2]int{g.Layer, g.Group}] = true
		if g.Score != c.HeadProxy[g.Layer][g.Group] {
			t.Errorf("group %d/%d: score %v, proxy %v", g.Layer, g.Group, g.Score, c.HeadProxy[g.Layer][g.Group])
		}
	}
	for _, g := range r.HeadsRemoved {
		for l := 0; l < 5; l++ {
			for k := 0; k < 4; k++ {
				if !isGone[[2]int{l, k}] && c.HeadProxy[l][k] < g.Score && left[l] > 1 {
					t.Errorf("kept group %d/%d (proxy %v, layer keeps %d) scores below removed %d/%d (%v)", l, k, c.HeadProxy[l][k], left[l], g.Layer, g.Group, g.Score)
				}
			}
		}
	}
	t.Logf("proxy removed %d groups; groups left per layer %v", len(r.HeadsRemoved), left)
	if p := heldoutPPL(t, out); !(p > 1) {
		t.Errorf("pruned model perplexity %v", p)
	}
}

// TestFFNRefit: 25% of every FFN removed, with and without the
// least-squares down_proj refit; the refit gives the lower heldout
// perplexity. A ratio that removes no node makes the refit reproduce
// down_proj within 1e-6.
func TestFFNRefit(t *testing.T) {
	model := shared.Path(t, "stories260K-hf")
	cal := calibStories(t, model)
	dir := t.TempDir()
	ppl := map[bool]float64{}
	for _, noRefit := range []bool{false, true} {
		out := filepath.Join(dir, map[bool]string{false: "refit", true: "norefit"}[noRefit])
		r, err := Run(context.Background(), Options{Model: model, Calib: cal, Out: out, FFNRatio: 0.25, NoRefit: noRefit, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.FFN) != 5 || r.Refit == noRefit {
			t.Fatalf("report FFN %+v refit %v", r.FFN, r.Refit)
		}
		for _, f := range r.FFN {
			if f.Before != 172 || f.After != 129 {
				t.Errorf("layer %d FFN %d -> %d, want 172 -> 129", f.Layer, f.Before, f.After)
			}
		}
		d, err := arch.Load(out)
		if err != nil {
			t.Fatal(err)
		}
		for l, ly := range d.Layers {
			if ly.MLP.IntermediateSize != 129 || ly.NumHeads != 8 || ly.NumKVHeads != 4 {
				t.Errorf("layer %d config: %+v", l, ly)
			}
		}
		if want := int64(5 * 43 * 3 * 64); r.Before.Params-r.After.Params != want {
			t.Errorf("removed %d parameters, want %d", r.Before.Params-r.After.Params, want)
		}
		ppl[noRefit] = heldoutPPL(t, out)
	}
	base := heldoutPPL(t, model)
	t.Logf("heldout.txt PPL (ctx 512, 16 windows): unpruned %.4f, FFN -25%% with refit %.4f, without refit %.4f", base, ppl[false], ppl[true])
	if !(ppl[false] < ppl[true]) {
		t.Errorf("refit PPL %.4f is not below no-refit PPL %.4f", ppl[false], ppl[true])
	}

	// Nothing pruned: the refit with every node kept.
	out := filepath.Join(dir, "keepall")
	r, err := Run(context.Background(), Options{Model: model, Calib: cal, Out: out, FFNRatio: 0.5, keepAllFFN: true, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	orig, _ := safetensors.OpenDir(model)
	defer orig.Close()
	got, err := safetensors.OpenDir(out)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	var worst float64
	for _, f := range r.FFN {
		if f.After != 172 {
			t.Fatalf("layer %d kept %d of 172", f.Layer, f.After)
		}
		for _, part := range []string{"down_proj", "gate_proj", "up_proj"} {
			name := "model.layers." + string(rune('0'+f.Layer)) + ".mlp." + part + ".weight"
			a, _ := orig.Tensor(name)
			b, err := got.Tensor(name)
			if err != nil {
				t.Fatal(err)
			}
			av, _ := a.Float32()
			bv, _ := b.Float32()
			if !slices.Equal(a.Shape, b.Shape) {
				t.Fatalf("%s: shape %v, want %v", name, b.Shape, a.Shape)
			}
			for i := range av {
				d := math.Abs(float64(av[i] - bv[i]))
				if part != "down_proj" && d != 0 {
					t.Fatalf("%s changed", name)
				}
				worst = math.Max(worst, d)
			}
		}
	}
	t.Logf("refit keeping every node: max |W' - W| over the 5 down_proj = %.3g", worst)
	if worst > 1e-6 {
		t.Errorf("refit with nothing pruned changes down_proj by %.3g > 1e-6", worst)
	}
}

// TestWidthBad: width requests that cannot be met fail clearly and write
// nothing.
func TestWidthBad(t *testing.T) {
	mdir := shared.Path(t, "stories260K-hf")
	cal := calibStories(t, mdir)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	noTok := filepath.Join(dir, "old.safetensors")
	c, err := calibrate.Read(cal, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := calibrate.Read(cal, model.Expect{})
	if err != nil {
		t.Fatal(err)
	}
	c.TokenIDs, c.HeadProxy = nil, nil
	if err := calibrate.Write(noTok, c); err != nil {
		t.Fatal(err)
	}
	few := filepath.Join(dir, "few.safetensors")
	c.TokenIDs, c.Header.Tokens = c2.TokenIDs[:256], 256
	if err := calibrate.Write(few, c); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.safetensors")
	c.TokenIDs, c.Header.Tokens, c.Header.Ctx = c2.TokenIDs[:16], 16, 16
	if err := calibrate.Write(short, c); err != nil {
		t.Fatal(err)
	}
	c.Header.Ctx = c2.Header.Ctx
	tiny := filepath.Join(dir, "tiny.safetensors")
	c.TokenIDs, c.Header.Tokens = c2.TokenIDs[:128], 128
	if err := calibrate.Write(tiny, c); err != nil {
		t.Fatal(err)
	}
	for _, k := range []struct {
		opt  Options
		want []string
	}{
		{Options{HeadGroups: 1, Calib: short}, []string{"calibration file has 16 tokens", "needs at least 32", "--head-method proxy"}},
		{Options{HeadGroups: 1, HeadRefit: true, Calib: tiny}, []string{"holds 128 tokens", "o_proj refit", "needs at least 144", "--head-refit"}},
		{Options{FFNRatio: 0.25, HeadRefit: true}, []string{"HeadRefit: want HeadGroups, HeadRatio or Sparsity"}},
		{Options{Sparsity: 0.2, HeadRefit: true}, []string{"sparsity 0.2 removes no KV head group", "nothing to refit"}},
		{Options{FFNRatio: 0.001}, []string{"removes round(0.001·172) = 0 of the 172"}},
		{Options{FFNRatio: 0.999}, []string{"removes all 172", "at most 171"}},
		{Options{FFNRatio: 0.25, Calib: few}, []string{"holds 256 tokens", "needs at least 516", "--no-refit"}},
		{Options{HeadGroups: 16}, []string{"breaks GQA grouping", "16 of 20", "at most 15"}},
		{Options{HeadRatio: 0.9}, []string{"breaks GQA grouping", "18 of 20"}},
		{Options{HeadGroups: 2, HeadRatio: 0.1}, []string{"HeadGroups 2: want at most one of HeadGroups and HeadRatio"}},
		{Options{HeadGroups: 2, HeadMethod: "magic"}, []string{`HeadMethod "magic": want putri or proxy`}},
		{Options{FFNRatio: 1}, []string{"FFNRatio 1: want in (0, 1)"}},
		{Options{HeadGroups: 2, Layers: 1, Method: "lorp"}, []string{"HeadGroups: want no layer removal (Layers) in the same run"}},
		{Options{HeadGroups: 2, HeadMethod: HeadProxy, Calib: noTok}, []string{"lacks heads.layers.0.proxy", "re-run lmpack calibrate"}},
		{Options{FFNRatio: 0.25, Calib: noTok}, []string{"lacks calibration.tokens"}},
		{Options{HeadGroups: 2, Calib: "-"}, []string{"Calib: want a calibration file"}},
	} {
		o := k.opt
		o.Model, o.Out = mdir, out
		if o.Calib == "" {
			o.Calib = cal
		} else if o.Calib == "-" {
			o.Calib = ""
		}
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
	// MoE models: width pruning refused.
	moe := shared.Path(t, "stories260K-moe-hf")
	_, err = Run(context.Background(), Options{Model: moe, Out: out, FFNRatio: 0.25, Calib: cal})
	if !errors.Is(err, ErrOptions) || !strings.Contains(err.Error(), "mixture-of-experts") {
		t.Errorf("MoE FFN pruning: %v", err)
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a failed run created %s", out)
	}

}

// TestHeadRefit: the same head groups removed with and without the
// least-squares o_proj refit (proxy scores, so the choice is fixed); the
// refit keeps the sliced shapes, changes only o_proj of the layers that
// lost groups, and gives the lower heldout perplexity.
func TestHeadRefit(t *testing.T) {
	model := shared.Path(t, "stories260K-hf")
	cal := calibStories(t, model)
	dir := t.TempDir()
	ppl := map[bool]float64{}
	reports := map[bool]*Report{}
	for _, refit := range []bool{false, true} {
		out := filepath.Join(dir, map[bool]string{false: "slice", true: "refit"}[refit])
		r, err := Run(context.Background(), Options{Model: model, Calib: cal, Out: out, HeadGroups: 6, HeadMethod: HeadProxy, HeadRefit: refit, Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		if r.HeadRefit != refit || len(r.HeadsRemoved) != 6 {
			t.Fatalf("report: head refit %v, %d groups removed", r.HeadRefit, len(r.HeadsRemoved))
		}
		reports[refit] = r
		ppl[refit] = heldoutPPL(t, out)
	}
	if !slices.Equal(reports[false].HeadsRemoved, reports[true].HeadsRemoved) {
		t.Fatalf("removed groups differ: %v vs %v", reports[false].HeadsRemoved, reports[true].HeadsRemoved)
	}
	lost := map[int]bool{}
	for _, g := range reports[true].HeadsRemoved {
		lost[g.Layer] = true
	}
	a, err := safetensors.OpenDir(filepath.Join(dir, "slice"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := safetensors.OpenDir(filepath.Join(dir, "refit"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	changed := 0
	for _, name := range a.Names() {
		ta, _ := a.Tensor(name)
		tb, err := b.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ta.Shape, tb.Shape) {
			t.Errorf("%s: shape %v with refit, %v without", name, tb.Shape, ta.Shape)
			continue
		}
		if string(ta.Data) == string(tb.Data) {
			continue
		}
		changed++
		isO := strings.HasSuffix(name, ".self_attn.o_proj.weight")
		layer := -1
		if isO {
			layer = int(name[len("model.layers.")] - '0')
		}
		if !isO || !lost[layer] {
			t.Errorf("%s changed by the o_proj refit", name)
		}
	}
	if changed != len(lost) {
		t.Errorf("%d tensors changed, want the o_proj of the %d layers that lost groups", changed, len(lost))
	}
	base := heldoutPPL(t, model)
	t.Logf("heldout.txt PPL (ctx 512, 16 windows): unpruned %.4f; 6 head groups removed (proxy) sliced %.4f, o_proj refit %.4f", base, ppl[false], ppl[true])
	if !(ppl[true] < ppl[false]) {
		t.Errorf("o_proj refit PPL %.4f is not below the sliced model's %.4f", ppl[true], ppl[false])
	}
}

// TestWidthProgress: width pruning reports progress like every long
// stage: steps are counted one by one, the expected total never falls
// below what is done, and at the end both equal the masked-perplexity runs
// (1 unmasked + 20 candidates in round 0 + 19 in round 1 for 2 of the 20
// groups of stories260K), the o_proj refit layers and the 5 FFN layers.
func TestWidthProgress(t *testing.T) {
	model := shared.Path(t, "stories260K-hf")
	cal := calibStories(t, model)
	type call struct{ done, total int }
	var calls []call
	r, err := Run(context.Background(), Options{Model: model, Calib: cal, Out: filepath.Join(t.TempDir(), "w"), HeadGroups: 2, HeadMethod: HeadPutri,
		HeadRefit: true, FFNRatio: 0.25, Threads: 1, Progress: func(done, total int) { calls = append(calls, call{done, total}) }})
	if err != nil {
		t.Fatal(err)
	}
	layers := map[int]bool{}
	for _, g := range r.HeadsRemoved {
		layers[g.Layer] = true
	}
	want := 1 + 20 + 19 + len(layers) + 5
	if len(calls) == 0 {
		t.Fatal("no progress reported")
	}
	prev := 0
	for i, c := range calls {
		if c.done != prev && c.done != prev+1 || c.total < c.done {
			t.Fatalf("call %d: %+v after done %d", i, c, prev)
		}
		prev = c.done
	}
	if last := calls[len(calls)-1]; last.done != want || last.total != want {
		t.Errorf("last progress %+v, want %d of %d", last, want, want)
	}
}
