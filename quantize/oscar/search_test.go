package oscar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/alloc"
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// ChooseWidths on a constructed error table: 4 layers of 2 KV heads ×
// head_dim 64 (2.5, 4.5, 8.5 bits per element at 2, 4, 8 bits), no
// windows, 3 bits: the budget buys exactly two 4-bit sides over the
// all-2-bit plan, the plan spends it to the bit, its error is the brute
// force optimum over all 3⁸ choices within the budget, and it beats the
// one uniform plan within the budget (all 2 bits).
func TestChooseWidthsConstructed(t *testing.T) {
	layers := []WidthLayer{
		{2, 64, [3]float64{1.0, 0.05, 0.001}, [3]float64{0.8, 0.04, 0.001}},
		{2, 64, [3]float64{5.0, 0.30, 0.002}, [3]float64{0.9, 0.05, 0.001}},
		{2, 64, [3]float64{0.7, 0.03, 0.001}, [3]float64{4.0, 0.20, 0.002}},
		{2, 64, [3]float64{0.6, 0.02, 0.001}, [3]float64{0.5, 0.02, 0.001}},
	}
	const S = 32768
	p, err := ChooseWidths(layers, 3, S, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	perItem := int64(S) * 128
	if want := 3 * 8 * perItem; p.Budget != want || p.Cost != p.Budget || p.BitsPerElement != 3 {
		t.Errorf("budget %d (want %d), cost %d, %.6f bits/element: want the budget met exactly at 3", p.Budget, want, p.Cost, p.BitsPerElement)
	}
	if !slices.Equal(p.BitsK, []int{2, 4, 2, 2}) || !slices.Equal(p.BitsV, []int{2, 2, 4, 2}) {
		t.Errorf("widths K %v V %v, want the two costliest sides (layer 1 K, layer 2 V) at 4 bits", p.BitsK, p.BitsV)
	}
	// Brute force.
	bestErr := math.Inf(1)
	errs := func(i, w int) float64 {
		if i%2 == 0 {
			return layers[i/2].ErrK[w]
		}
		return layers[i/2].ErrV[w]
	}
	for code := 0; code < 6561; code++ {
		var cost int64
		var e float64
		c := code
		for i := 0; i < 8; i++ {
			w := c % 3
			c /= 3
			cost += sideCost(2, 64, Widths[w], S, 0, 0)
			e += errs(i, w)
		}
		if cost <= p.Budget {
			bestErr = min(bestErr, e)
		}
	}
	if math.Abs(p.Error-bestErr) > 1e-12 {
		t.Errorf("DP error %.6g, brute force optimum %.6g", p.Error, bestErr)
	}
	if u := p.UniformError["2"]; !(p.Error < u) || p.UniformBitsPerElement["2"] != 2.5 || p.UniformBitsPerElement["4"] != 4.5 {
		t.Errorf("mixed error %.4g vs uniform 2-bit %.4g (%v bits/element)", p.Error, u, p.UniformBitsPerElement)
	}
	t.Logf("mixed K %v V %v: error %.4g at %.4f bits/element; uniform 2-bit %.4g", p.BitsK, p.BitsV, p.Error, p.BitsPerElement, p.UniformError["2"])

	// Windows 16+64 at 32K cost 0.0342 bits per element at every width:
	// 3 bits then no longer buys two 4-bit sides.
	p, err = ChooseWidths(layers, 3, S, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	n4 := 0
	for _, b := range slices.Concat(p.BitsK, p.BitsV) {
		if b == 4 {
			n4++
		}
	}
	if p.Cost > p.Budget || n4 != 1 || p.BitsPerElement > 3 {
		t.Errorf("with windows: %v %v, cost %d budget %d, %.4f bits/element", p.BitsK, p.BitsV, p.Cost, p.Budget, p.BitsPerElement)
	}
	// Below the all-2-bit cost.
	if _, err := ChooseWidths(layers, 2.4, S, 0, 0); err == nil {
		t.Error("2.4 bits/element accepted below the 2.5 of all 2-bit sides")
	}
}

// fakeQuant, which the error measurement uses, stores what the oscar
// caches store: rows read back from kvcache's oscar-mixed (one side at
// each width, clipped) equal fakeQuant's to float32 rounding of the
// rotation.
func TestFakeQuantMatchesCache(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const nkv, hd, T = 2, 16, 20
	layers := make([]kvcache.Layer, 3)
	rot := &kvcache.Rotations{}
	for i := range layers {
		layers[i] = kvcache.Layer{NumKVHeads: nkv, HeadDim: hd}
		h := make([]float32, hd*hd)
		for j, x := range kvq.HadamardMatrix(hd) {
			h[j] = float32(x)
		}
		rot.K, rot.V = append(rot.K, h), append(rot.V, h)
		rot.BitsK, rot.BitsV = append(rot.BitsK, Widths[i]), append(rot.BitsV, Widths[(i+1)%3])
	}
	rot.ClipK, rot.ClipV = []float64{0.9, 0.9, 0.9}, []float64{0.85, 0.85, 0.85}
	rot.ClipK4, rot.ClipV4 = []float64{0.95, 0.95, 0.95}, []float64{0.9, 0.9, 0.9}
	rot.ClipK8, rot.ClipV8 = []float64{0.99, 0.99, 0.99}, []float64{0.98, 0.98, 0.98}
	c, err := kvcache.New("oscar-mixed", layers, T, kvcache.Options{Rotations: rot})
	if err != nil {
		t.Fatal(err)
	}
	clip := map[int][2]float64{2: {0.9, 0.85}, 4: {0.95, 0.9}, 8: {0.99, 0.98}}
	for l := range layers {
		k, v := make([]float32, T*nkv*hd), make([]float32, T*nkv*hd)
		for i := range k {
			k[i], v[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		c.Write(l, 0, T, k, v)
		c.Commit(0)
		wk := fakeQuant(k, hd, rot.K[l], clip[rot.BitsK[l]][0], rot.BitsK[l])
		wv := fakeQuant(v, hd, rot.V[l], clip[rot.BitsV[l]][1], rot.BitsV[l])
		gk, gv := make([]float32, T*hd), make([]float32, T*hd)
		for h := 0; h < nkv; h++ {
			c.Read(l, h, T, gk, gv)
			var worst float64
			for p := 0; p < T; p++ {
				for i := 0; i < hd; i++ {
					worst = max(worst, math.Abs(float64(gk[p*hd+i]-wk[p*nkv*hd+h*hd+i])), math.Abs(float64(gv[p*hd+i]-wv[p*nkv*hd+h*hd+i])))
				}
			}
			if worst > 1e-4 {
				t.Errorf("layer %d (K %d, V %d bits) head %d: cache and fakeQuant differ by %.3g", l, rot.BitsK[l], rot.BitsV[l], h, worst)
			}
		}
	}
}

// QuantizeKV with ClipSearch and KVBits on stories260K (head_dim 8: 2,
// 4, 8 bits are 6, 8, 12 bits per element with the fp16 scale and zero):
// every ratio is from ClipGrid (8 bits: 1) and its KL at most the
// default ratio's, errors fall with the width, the widths meet 7 bits per
// element at the serving context, beat uniform 6-bit (2-bit codes) and
// are in the file.
func TestQuantizeKVSearch(t *testing.T) {
	cal := calibFile(t)
	dir, d, fp := modelInfo(t, "stories260K-hf")
	out := filepath.Join(t.TempDir(), "mixed.safetensors")
	s, err := QuantizeKV(context.Background(), KVOptions{Model: dir, Calib: cal, ClipK: DefaultClipK, ClipV: DefaultClipV, Out: out,
		ClipSearch: true, KVBits: 7, Sink: 4, Recent: 16, SearchTokens: 256, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	if s.SearchTokens != 256 || len(s.PerLayer) != 5 || !s.ClipSearch {
		t.Fatalf("summary %+v", s)
	}
	for _, l := range s.PerLayer {
		for _, sd := range []SideReport{l.K, l.V} {
			if sd.Clip[2] != 1 {
				t.Errorf("layer %d: 8-bit ratio %v, want 1", l.Layer, sd.Clip[2])
			}
			for wi := range Widths {
				if !slices.Contains(ClipGrid, sd.Clip[wi]) || !(sd.Error[wi] >= 0) || !(sd.AttnError[wi] >= 0) {
					t.Errorf("layer %d: ratio %v error %v", l.Layer, sd.Clip[wi], sd.Error[wi])
				}
			}
			if !(sd.Error[0] > sd.Error[1] && sd.Error[1] > sd.Error[2]) {
				t.Errorf("layer %d: errors %v do not fall with the width", l.Layer, sd.Error)
			}
			if !slices.Contains(Widths, sd.Bits) {
				t.Errorf("layer %d: width %d", l.Layer, sd.Bits)
			}
		}
	}
	if s.BitsPerElement > 7 || s.BitsPerElement < 6.5 || !(s.PredictedError < s.UniformError["2"]) {
		t.Errorf("%.4f bits/element, error %.4g vs uniform 2-bit %.4g", s.BitsPerElement, s.PredictedError, s.UniformError["2"])
	}
	r, h, err := ReadFile(out, model.Expect{ModelFingerprint: fp, Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	for l, lr := range s.PerLayer {
		if r.BitsK[l] != lr.K.Bits || r.BitsV[l] != lr.V.Bits || r.ClipK[l] != lr.K.Clip[0] || r.ClipV4[l] != lr.V.Clip[1] || r.ClipK8[l] != lr.K.Clip[2] {
			t.Errorf("layer %d: file K %d V %d bits, clips %v %v %v; report %+v", l, r.BitsK[l], r.BitsV[l], r.ClipK[l], r.ClipV4[l], r.ClipK8[l], lr)
		}
	}
	if h.KVBits != 7 || h.KVServingCtx != DefaultServingCtx || h.KVSink != 4 || h.KVRecent != 16 {
		t.Errorf("header budget %v ctx %d windows %d,%d", h.KVBits, h.KVServingCtx, h.KVSink, h.KVRecent)
	}
	// The clip search keeps the default or a ratio of less KL: measuring
	// at the defaults only (0.96/0.92 at 2 bits, 1 at 4 and 8) never
	// gives less.
	s1, err := QuantizeKV(context.Background(), KVOptions{Model: dir, Calib: cal, ClipK: DefaultClipK, ClipV: DefaultClipV, Out: out, KVBits: 7, Sink: 4, Recent: 16, SearchTokens: 256, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	for l := range s.PerLayer {
		for wi := range Widths {
			if s.PerLayer[l].K.Error[wi] > s1.PerLayer[l].K.Error[wi]*(1+1e-12) || s.PerLayer[l].V.Error[wi] > s1.PerLayer[l].V.Error[wi]*(1+1e-12) {
				t.Errorf("layer %d width %d: searched errors %v/%v above the defaults' %v/%v", l, Widths[wi], s.PerLayer[l].K.Error, s.PerLayer[l].V.Error, s1.PerLayer[l].K.Error, s1.PerLayer[l].V.Error)
			}
		}
	}
	if _, h1, _ := ReadFile(out, model.Expect{}); h1.ClipK4 != nil || h1.ClipV8 != nil {
		t.Errorf("without the search and without 4-/8-bit ratios the file holds %v %v", h1.ClipK4, h1.ClipV8)
	}
}

// TestQuantizeKVSearchCoveredWindows: windows that cover every
// calibration window leave nothing quantized to measure; the search is
// refused naming --kv-window and the window length, and no file is written.
func TestQuantizeKVSearchCoveredWindows(t *testing.T) {
	cal := calibFile(t)
	dir, _, _ := modelInfo(t, "stories260K-hf")
	out := filepath.Join(t.TempDir(), "covered.safetensors")
	_, err := QuantizeKV(context.Background(), KVOptions{Model: dir, Calib: cal, ClipK: DefaultClipK, ClipV: DefaultClipV, Out: out,
		ClipSearch: true, Sink: 64, Recent: 100000, SearchTokens: 256, Threads: 2})
	if err == nil || !strings.Contains(err.Error(), "--kv-window 64,100000 covers every calibration window") {
		t.Fatalf("covering windows: error %v, want one naming --kv-window 64,100000", err)
	}
	if _, serr := os.Stat(out); !os.IsNotExist(serr) {
		t.Errorf("%s written after the refusal (stat: %v)", out, serr)
	}
}

// The measurement's windows are the runtime's: a query at position t reads
// key j < t quantized exactly when j is in [sink, QuantizedEnd(t+1)) of
// oscar2 holding t tokens, the watermark once the query's own token is
// written (runtime/cpu.go reads the cache after the Write).
func TestAttnWindowsMatchCache(t *testing.T) {
	layers := []kvcache.Layer{{NumKVHeads: 1, HeadDim: 8}}
	h := make([]float32, 64)
	for j, x := range kvq.HadamardMatrix(8) {
		h[j] = float32(x)
	}
	for _, w := range []attnWindows{{0, 0}, {2, 3}, {0, 5}, {4, 0}} {
		c, err := kvcache.New("oscar2", layers, 40, kvcache.Options{Sink: w.sink, Recent: w.recent, Rotations: &kvcache.Rotations{K: [][]float32{h}, V: [][]float32{h}}})
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, 8)
		for tok := 0; tok < 40; tok++ {
			q := c.(lmrtQuantizedKV).QuantizedEnd(0, tok+1)
			for j := 0; j < tok; j++ {
				if got, want := w.quantized(j, tok), j >= w.sink && j < q; got != want {
					t.Errorf("windows %+v, query %d, key %d: quantized %v, cache %v (watermark %d)", w, tok, j, got, want, q)
				}
			}
			c.Write(0, tok, 1, x, x)
			c.Commit(1)
		}
	}
}

// lmrtQuantizedKV is runtime.QuantizedKV's method.
type lmrtQuantizedKV interface{ QuantizedEnd(layer, n int) int }

// readoutScorer is a scorer with a known optimum: the "model" after the
// layer is a linear readout z = W·o of each position's (single-head)
// attention output, scored by KL(softmax(W·o) ‖ softmax(W·ô)) against
// the exact outputs o.
type readoutScorer struct {
	w     [][]float64 // [classes][head_dim]
	exact []float32   // [T, head_dim]
}

func (s readoutScorer) score(_, _ int, att []float32) (float64, error) {
	hd := len(s.w[0])
	var sum float64
	z, zh := make([]float32, len(s.w)), make([]float32, len(s.w))
	lp := make([]float64, len(s.w))
	for t := 0; t < len(att)/hd; t++ {
		for c, row := range s.w {
			var a, b float64
			for i, wi := range row {
				a += wi * float64(s.exact[t*hd+i])
				b += wi * float64(att[t*hd+i])
			}
			z[c], zh[c] = float32(a), float32(b)
		}
		logSoftmax(z, lp)
		sum += klLogits(lp, zh)
	}
	return sum, nil
}

// The search keeps the ratio with the least end-to-end KL, and that
// ratio is known here: every value row (identity rotation, head_dim 8)
// is (10, 1, −1, 1, −1, 1, −1, 1) and the readout ignores coordinate 0.
// At 2 bits without clipping (and at every grid ratio ≥ 0.875, whose τ is
// the 10 itself) the levels are −1, 2.67, 6.33, 10, so each +1 reads back
// 2.67; only 0.85 (τ = sorted|x|[6] = 1) clamps the 10 to 1 and makes the
// seven read coordinates exact up to the fp16 scale. So the KL is least
// at 0.85, by far; the attention-output error instead counts the clamped
// coordinate the readout never reads, (10 − 1)² = 81 per row against
// 4·(5/3)² ≈ 11 unclipped (less the query's own exact row), and would
// keep 1 — the failure of the old
// objective on real models (METHODS §10).
func TestClipSearchKnownBest(t *testing.T) {
	const hd, T = 8, 12
	row := []float32{10, 1, -1, 1, -1, 1, -1, 1}
	ld := &layerData{nh: 1, nkv: 1, hd: hd, q: make([]float32, T*hd), k: make([]float32, T*hd), v: make([]float32, T*hd)}
	rng := rand.New(rand.NewPCG(3, 4))
	for t := 0; t < T; t++ {
		copy(ld.v[t*hd:], row)
		for i := 0; i < hd; i++ {
			ld.q[t*hd+i] = float32(rng.NormFloat64()) // keys all 0: uniform attention
		}
	}
	id := make([]float32, hd*hd)
	for i := 0; i < hd; i++ {
		id[i*hd+i] = 1
	}
	w := attnWindows{}
	exact, e0 := attnServed(ld, ld.k, ld.v, w)
	if e0 != 0 {
		t.Fatalf("attention-output error %g with nothing quantized", e0)
	}
	sc := readoutScorer{exact: exact}
	for c := 0; c < 5; c++ {
		r := make([]float64, hd)
		for i := 1; i < hd; i++ {
			r[i] = rng.NormFloat64()
		}
		sc.w = append(sc.w, r)
	}
	clips := [2][][]float64{{ClipGrid, ClipGrid, ClipGrid}, {ClipGrid, ClipGrid, ClipGrid}}
	var et errTable
	if err := measure(&et, ld, 0, 0, id, id, clips, w, sc); err != nil {
		t.Fatal(err)
	}
	v2 := et.err[1][0]
	b := best(v2)
	if ClipGrid[b] != 0.85 {
		t.Fatalf("V 2-bit: searched ratio %v (KL per grid ratio %v), want 0.85", ClipGrid[b], v2)
	}
	for i, kl := range v2 {
		if i != b && !(kl > 100*v2[b]) {
			t.Errorf("V 2-bit: KL %.3g at ratio %v not far above %.3g at 0.85", kl, ClipGrid[i], v2[b])
		}
	}
	// A query reads its own value exact: at query t, t of its t+1
	// (uniformly weighted, equal) values are quantized, so coordinate 0's
	// output error at 0.85 is 9·t/(t+1).
	var want float64
	for q := 0; q < T; q++ {
		want += math.Pow(9*float64(q)/float64(q+1), 2)
	}
	if a := et.attn[1][0]; ClipGrid[best(a)] != 1 || math.Abs(a[b]-want) > 0.01*want {
		t.Errorf("attention-output error per grid ratio %v: want ratio 1 least and %.4g at 0.85", a, want)
	}
}

// The scored forward pass replaces exactly one layer's attention output:
// on stories260K (GQA 8:4, q/k captured after RoPE), substituting each
// layer's output as attnServed computes it with nothing quantized gives
// the model's own logits (KL per token below 1e-6 nats, float32
// accumulation against float64), while substituting zeros moves them
// (KL per token above 1e-3), so the hook reaches o_proj.
func TestScorerSubstitution(t *testing.T) {
	cal := calibFile(t)
	dir, d, fp := modelInfo(t, "stories260K-hf")
	c, err := calibrate.Read(cal, model.Expect{ModelFingerprint: fp, Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	win := c.CalibrationWindows()[0][:96]
	t.Run("full", func(t *testing.T) { checkSubstitution(t, dir, win) })
	// The same weights as a Mistral with a 16-token sliding window: the
	// 96-token window's queries see only their last 16 keys, and
	// attnServed must too for the exact substitution to hold.
	sw := t.TempDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "config.json" {
			if err := os.Symlink(filepath.Join(dir, e.Name()), filepath.Join(sw, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	var cfg map[string]any
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["architectures"], cfg["model_type"], cfg["sliding_window"] = []string{"MistralForCausalLM"}, "mistral", 16
	if b, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sw, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("sliding window 16", func(t *testing.T) { checkSubstitution(t, sw, win) })
}

// checkSubstitution is TestScorerSubstitution on the model in dir and the
// calibration window win.
func checkSubstitution(t *testing.T, dir string, win []int) {
	ld, err := model.Load(context.Background(), dir, model.LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ld.Close()
	d := ld.Model.Description()
	L := len(d.Layers)
	obs := &capture{q: [][][]float32{make([][]float32, L)}, k: [][][]float32{make([][]float32, L)}, v: [][][]float32{make([][]float32, L)}}
	sc := &modelScorer{ctx: context.Background(), m: ld.Model, cache: ld.Model.NewCache(len(win)), obs: obs, vocab: d.VocabSize}
	if err := sc.reference(0, win); err != nil {
		t.Fatal(err)
	}
	for l := 0; l < L; l++ {
		lyr := &layerData{nh: d.Layers[l].NumHeads, nkv: d.Layers[l].NumKVHeads, hd: d.Layers[l].HeadDim, window: d.Layers[l].SlidingWindow, q: obs.q[0][l], k: obs.k[0][l], v: obs.v[0][l]}
		att, _ := attnServed(lyr, lyr.k, lyr.v, attnWindows{})
		kl, err := sc.score(l, 0, att)
		if err != nil {
			t.Fatal(err)
		}
		if kl/float64(len(win)) > 1e-6 {
			t.Errorf("layer %d (window %d): exact substitution moves the logits by KL %.3g per token", l, d.Layers[l].SlidingWindow, kl/float64(len(win)))
		}
		clear(att)
		if kl, _ = sc.score(l, 0, att); kl/float64(len(win)) < 1e-3 {
			t.Errorf("layer %d: zero attention output gives KL %.3g per token: the substitution does not reach o_proj", l, kl/float64(len(win)))
		}
	}
}

// pick keeps a ratio over the default only when it wins on the
// calibration windows by more than their spread: a ratio 0.001 better on
// each of four windows is kept; one whose mean is better but that loses on
// one window by more than it wins elsewhere is not; one window (no noise
// estimate) and a tie keep the default.
func TestPickMargin(t *testing.T) {
	// entries: 0 = the default, 1 = a candidate.
	steady := [][]float64{{0.010, 0.020, 0.015, 0.012}, {0.009, 0.019, 0.014, 0.011}}
	if got := pick(mean2(steady), steady, 0); got != 1 {
		t.Errorf("steady win: kept %d, want the candidate", got)
	}
	noisy := [][]float64{{0.010, 0.020, 0.015, 0.012}, {0.004, 0.016, 0.011, 0.020}}
	if got := pick(mean2(noisy), noisy, 0); got != 0 {
		t.Errorf("noisy win (differences −0.006, −0.004, −0.004, +0.008): kept %d, want the default", got)
	}
	one := [][]float64{{0.010}, {0.0099}}
	if got := pick(mean2(one), one, 0); got != 0 {
		t.Errorf("one window: kept %d, want the default", got)
	}
	tie := [][]float64{{0, 0, 0}, {0, 0, 0}}
	if got := pick(mean2(tie), tie, 1); got != 1 {
		t.Errorf("all-zero tie: kept %d, want the default 1", got)
	}
	if got := pick(mean2(steady), steady, 1); got != 1 {
		t.Errorf("default already least: kept %d", got)
	}
}

func mean2(win [][]float64) []float64 {
	m := make([]float64, len(win))
	for i, w := range win {
		for _, x := range w {
			m[i] += x / float64(len(w))
		}
	}
	return m
}

// TestChooseWidthsInfeasibleMessage: a budget below the all-2-bit cost is
// refused with alloc.ErrInfeasible and a suggested --kv-bits, rounded up
// so that the budget it names is feasible; the windows hint appears only
// when there are windows.
func TestChooseWidthsInfeasibleMessage(t *testing.T) {
	layers := []WidthLayer{{NumKVHeads: 2, HeadDim: 8}, {NumKVHeads: 2, HeadDim: 8}}
	_, err := ChooseWidths(layers, 6, 32768, 4, 16)
	if !errors.Is(err, alloc.ErrInfeasible) {
		t.Fatalf("--kv-bits 6 with windows 4,16 at head_dim 8: %v, want ErrInfeasible", err)
	}
	msg := err.Error()
	i := strings.Index(msg, "want --kv-bits ≥ ")
	if i < 0 || !strings.Contains(msg, "or smaller windows") {
		t.Fatalf("message %q: want the suggested budget and the windows hint", msg)
	}
	var sug float64
	if _, err := fmt.Sscanf(msg[i+len("want --kv-bits ≥ "):], "%f", &sug); err != nil {
		t.Fatal(err)
	}
	if _, err := ChooseWidths(layers, sug, 32768, 4, 16); err != nil {
		t.Errorf("the suggested --kv-bits %v is refused: %v", sug, err)
	}
	if _, err := ChooseWidths(layers, 5, 32768, 0, 0); err == nil || strings.Contains(err.Error(), "smaller windows") {
		t.Errorf("no windows: %v, want refused without the windows hint", err)
	}
}
