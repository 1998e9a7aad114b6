package oscar

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lmpack/lmpack/model"
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
// every ratio is from ClipGrid and its error the least of the grid's,
// errors fall with the width, the widths meet 7 bits per element at the
// serving context, beat uniform 6-bit (2-bit codes) and are in the file.
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
			for wi := range Widths {
				if !slices.Contains(ClipGrid, sd.Clip[wi]) || !(sd.Error[wi] >= 0) {
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
	// The clip search is the grid's minimum: measuring at ratio 1 only
	// (4- and 8-bit defaults) never gives less.
	s1, err := QuantizeKV(context.Background(), KVOptions{Model: dir, Calib: cal, ClipK: 1, ClipV: 1, Out: out, KVBits: 7, Sink: 4, Recent: 16, SearchTokens: 256, Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	for l := range s.PerLayer {
		for wi := range Widths {
			if s.PerLayer[l].K.Error[wi] > s1.PerLayer[l].K.Error[wi]*(1+1e-12) || s.PerLayer[l].V.Error[wi] > s1.PerLayer[l].V.Error[wi]*(1+1e-12) {
				t.Errorf("layer %d width %d: searched errors %v/%v above ratio 1's %v/%v", l, Widths[wi], s.PerLayer[l].K.Error, s.PerLayer[l].V.Error, s1.PerLayer[l].K.Error, s1.PerLayer[l].V.Error)
			}
		}
	}
	if _, h1, _ := ReadFile(out, model.Expect{}); h1.ClipK4 != nil || h1.ClipV8 != nil {
		t.Errorf("without the search and without 4-/8-bit ratios the file holds %v %v", h1.ClipK4, h1.ClipV8)
	}
}

// The measurement's windows are the cache's: a query at position t reads
// key j quantized exactly when oscar2 holding t tokens has j in
// [sink, QuantizedEnd).
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
			q := c.(lmrtQuantizedKV).QuantizedEnd(0, tok)
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
