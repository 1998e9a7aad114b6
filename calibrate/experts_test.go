package calibrate

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
)

// routerRecorder copies the MoE block inputs and the router selections.
type routerRecorder struct {
	H, K int
	x    map[int][]float32
	sel  map[int][]int32
}

func (r *routerRecorder) FFNInput(l, pos, n int, x, h []float32) {
	if h == nil {
		r.x[l] = append(r.x[l], x[:n*r.H]...)
	}
}
func (r *routerRecorder) RouterLogits(l, pos, n int, logits []float32, sel []int32) {
	r.sel[l] = append(r.sel[l], sel[:n*r.K]...)
}

// directExpert is the naive reference of one expert's statistics from the
// recorded rows: Σ x xᵀ / S and Σ h hᵀ / S over the rows in use.
func directExpert(t *testing.T, e *engineT, x []float32, use []bool, mlp *arch.MLP) (hin, hdown []float64, S int64) {
	H, I := e.H, mlp.IntermediateSize
	g := tensorF32(t, e, mlp.Gate)
	u := tensorF32(t, e, mlp.Up)
	hin, hdown = make([]float64, H*H), make([]float64, I*I)
	h := make([]float64, I)
	for tk := range use {
		if !use[tk] {
			continue
		}
		S++
		xt := x[tk*H : (tk+1)*H]
		for a := 0; a < H; a++ {
			for b := 0; b < H; b++ {
				hin[a*H+b] += float64(xt[a]) * float64(xt[b])
			}
		}
		for i := 0; i < I; i++ {
			var gi, ui float64
			for a := 0; a < H; a++ {
				gi += float64(g[i*H+a]) * float64(xt[a])
				ui += float64(u[i*H+a]) * float64(xt[a])
			}
			h[i] = gi / (1 + math.Exp(-gi)) * ui
		}
		for a := 0; a < I; a++ {
			for b := 0; b < I; b++ {
				hdown[a*I+b] += h[a] * h[b]
			}
		}
	}
	for i := range hin {
		hin[i] /= float64(S)
	}
	for i := range hdown {
		hdown[i] /= float64(S)
	}
	return hin, hdown, S
}

type engineT struct {
	H  int
	ck *safetensors.Checkpoint
}

func tensorF32(t *testing.T, e *engineT, name string) []float32 {
	t.Helper()
	tt, err := e.ck.Tensor(name)
	if err != nil {
		t.Fatal(err)
	}
	v, err := tt.Float32()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestCollectExperts: on stories260K-moe-hf the routing counts add up to
// T·top_k per layer and match the router hook, the Hessians equal the
// naive sums over the routed tokens (and over every token with
// AllExperts), the file round-trips, and with AllExperts the counts are
// unchanged while every expert's h_in equals the pooled Hessian.
func TestCollectExperts(t *testing.T) {
	e := openEngine(t, "stories260K-moe-hf")
	d := e.Desc
	text, err := os.ReadFile(shared.Path(t, "tinystories-valid", "calib.txt"))
	if err != nil {
		t.Fatal(err)
	}
	ids := tokenize(e, string(text))
	windows, err := Windows(ids, 160, 64) // 64 + 64 + 32 tokens
	if err != nil {
		t.Fatal(err)
	}
	T := 160
	ctx := context.Background()
	rec := &routerRecorder{H: d.HiddenSize, K: d.Layers[0].MoE.TopK, x: map[int][]float32{}, sel: map[int][]int32{}}
	e.Model.SetObserver(rec)
	cache := e.Model.NewCache(64)
	logits := make([]float32, d.VocabSize)
	for _, w := range windows {
		cache.Truncate(0)
		if err := e.Model.Forward(ctx, w, cache, logits, false); err != nil {
			t.Fatal(err)
		}
	}
	e.Model.SetObserver(nil)

	var calls []int
	routed, err := CollectExperts(ctx, e.Model, d, e.Checkpoint, windows, ExpertOptions{}, func(done, total int) { calls = append(calls, done, total) })
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 6 || calls[4] != T || calls[5] != T {
		t.Errorf("progress calls %v, want 3 windows ending at (%d, %d)", calls, T, T)
	}
	all, err := CollectExperts(ctx, e.Model, d, e.Checkpoint, windows, ExpertOptions{AllExperts: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(routed) != len(d.Layers) || len(all) != len(d.Layers) {
		t.Fatalf("%d and %d expert layers, want %d", len(routed), len(all), len(d.Layers))
	}
	some, err := CollectExperts(ctx, e.Model, d, e.Checkpoint, windows, ExpertOptions{Layers: []int{3, 1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(some) != 2 || some[0].Layer != 1 || some[1].Layer != 3 || relErr(some[1].Experts[2].HDown, routed[3].Experts[2].HDown) != 0 {
		t.Errorf("Layers {3, 1}: %d layers, want layers 1 and 3 equal to the full collection", len(some))
	}
	if _, err := CollectExperts(ctx, e.Model, d, e.Checkpoint, windows, ExpertOptions{Layers: []int{5}}, nil); err == nil || !strings.Contains(err.Error(), "layer 5 is not an MoE layer") {
		t.Errorf("Layers {5}: %v", err)
	}
	et := &engineT{H: d.HiddenSize, ck: e.Checkpoint}
	for li, l := range routed {
		mo := d.Layers[li].MoE
		if l.Layer != li || len(l.Experts) != mo.NumExperts {
			t.Fatalf("layer entry %d: layer %d with %d experts", li, l.Layer, len(l.Experts))
		}
		var sum int64
		for ex := range l.Experts {
			use := make([]bool, T)
			for tk := 0; tk < T; tk++ {
				for _, s := range rec.sel[li][tk*mo.TopK : (tk+1)*mo.TopK] {
					use[tk] = use[tk] || int(s) == ex
				}
			}
			hin, hdown, S := directExpert(t, et, rec.x[li], use, &mo.Experts[ex])
			st := l.Experts[ex]
			sum += st.Routed
			if st.Routed != S || st.Samples != S {
				t.Errorf("layer %d expert %d: routed %d samples %d, the router hook routed %d", li, ex, st.Routed, st.Samples, S)
			}
			if r := relErr(st.HIn, hin); r > 1e-12 {
				t.Errorf("layer %d expert %d: h_in rel err %g", li, ex, r)
			}
			if r := relErr(st.HDown, hdown); r > 1e-12 {
				t.Errorf("layer %d expert %d: h_down rel err %g", li, ex, r)
			}
			// All experts: every token, same routing counts.
			allUse := make([]bool, T)
			for i := range allUse {
				allUse[i] = true
			}
			hinA, hdownA, _ := directExpert(t, et, rec.x[li], allUse, &mo.Experts[ex])
			sa := all[li].Experts[ex]
			if sa.Routed != st.Routed || sa.Samples != int64(T) {
				t.Errorf("all experts: layer %d expert %d: routed %d samples %d, want %d and %d", li, ex, sa.Routed, sa.Samples, st.Routed, T)
			}
			if r := relErr(sa.HIn, hinA); r > 1e-12 {
				t.Errorf("all experts: layer %d expert %d: h_in rel err %g", li, ex, r)
			}
			if r := relErr(sa.HIn, all[li].Pooled); r > 1e-12 {
				t.Errorf("all experts: layer %d expert %d: h_in differs from the pooled Hessian by %g", li, ex, r)
			}
			if r := relErr(sa.HDown, hdownA); r > 1e-12 {
				t.Errorf("all experts: layer %d expert %d: h_down rel err %g", li, ex, r)
			}
		}
		if sum != int64(T*mo.TopK) {
			t.Errorf("layer %d: %d routed tokens in all, want T·top_k = %d", li, sum, T*mo.TopK)
		}
	}

	// Round trip through the file, checked against the model.
	c := &Calibration{Header: Header{ModelFingerprint: testFP, DataFingerprint: testFP, Tokens: T, Ctx: 64}, Experts: routed}
	path := filepath.Join(t.TempDir(), "c.safetensors")
	if err := Write(path, c); err != nil {
		t.Fatal(err)
	}
	back, err := Read(path, model.Expect{Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	if !back.Has(StatExperts) || len(back.Experts) != len(routed) {
		t.Fatalf("read back %v with %d expert layers", back.Header.Statistics, len(back.Experts))
	}
	for li := range routed {
		for ex, s := range routed[li].Experts {
			b := back.Experts[li].Experts[ex]
			if b.Routed != s.Routed || b.Samples != s.Samples || b.Inter != s.Inter || relErr(b.HIn, s.HIn) != 0 || relErr(b.HDown, s.HDown) != 0 {
				t.Errorf("layer %d expert %d differs after the round trip", li, ex)
			}
		}
	}
	if back2, err := Read(path, model.Expect{}); err != nil || len(back2.Experts) != len(routed) || back2.Experts[4].Layer != 4 {
		t.Errorf("reading without a description: %v", err)
	}
}

// TestExpertFallback: an expert the router never picks (synthetic
// observer calls) has zero counts and zero, finite Hessians; it is
// reported as sparse, and Hessians falls back to the pooled Hessian and
// the identity; the file round-trips. With AllExperts it has data.
func TestExpertFallback(t *testing.T) {
	e := openEngine(t, "stories260K-moe-hf")
	d := e.Desc
	for _, all := range []bool{false, true} {
		acc, err := newExpertsAcc(d, e.Checkpoint, all, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(3, 4))
		H, K, n := d.HiddenSize, 2, 40
		for li := range d.Layers {
			x := make([]float32, n*H)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			sel := make([]int32, n*K)
			for tk := 0; tk < n; tk++ {
				sel[tk*K], sel[tk*K+1] = int32(tk%3), int32((tk+1)%3) // never expert 3
			}
			acc.FFNInput(li, 0, n, x, nil)
			acc.RouterLogits(li, 0, n, make([]float32, n*4), sel)
		}
		ls, err := acc.result(n)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			s := l.Experts[3]
			sp := l.Sparse(16)
			if s.Routed != 0 || len(sp) != 1 || sp[0].Expert != 3 || sp[0].Layer != l.Layer {
				t.Fatalf("all=%v layer %d: routed %d, sparse %v; want expert 3 alone with 0 tokens", all, l.Layer, s.Routed, sp)
			}
			hin, hdown, fb := l.Hessians(3, 16)
			if all {
				if fb || s.Samples != int64(n) || relErr(hin, l.Pooled) > 1e-12 {
					t.Errorf("all experts: layer %d: fallback %v, samples %d", l.Layer, fb, s.Samples)
				}
				continue
			}
			if !fb || firstNonFinite(hin) >= 0 || firstNonFinite(hdown) >= 0 || relErr(hin, l.Pooled) != 0 {
				t.Errorf("layer %d: fallback %v; want the pooled Hessian", l.Layer, fb)
			}
			I := s.Inter
			for i := 0; i < I; i++ {
				if hdown[i*I+i] != 1 {
					t.Fatalf("layer %d: fallback h_down[%d,%d] = %v, want the identity", l.Layer, i, i, hdown[i*I+i])
				}
			}
			for _, v := range s.HIn {
				if v != 0 {
					t.Fatalf("layer %d: the unrouted expert's own h_in holds %v, want zeros", l.Layer, v)
				}
			}
			if _, _, fb := l.Hessians(0, 16); fb {
				t.Errorf("layer %d: expert 0 (27 tokens) falls back", l.Layer)
			}
		}
		c := &Calibration{Header: Header{ModelFingerprint: testFP, DataFingerprint: testFP, Tokens: n, Ctx: n}, Experts: ls}
		path := filepath.Join(t.TempDir(), "c.safetensors")
		if err := Write(path, c); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(path, model.Expect{Desc: d}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExpertsBad: Write refuses and Read rejects malformed expert
// statistics with ErrBadStatistic naming the tensor.
func TestExpertsBad(t *testing.T) {
	e := openEngine(t, "stories260K-moe-hf")
	d := e.Desc
	mk := func() *Calibration {
		var ls []ExpertLayer
		H := d.HiddenSize
		for li := range d.Layers {
			l := ExpertLayer{Layer: li, Hidden: H, Pooled: make([]float64, H*H)}
			for ex := 0; ex < 4; ex++ {
				I := d.Layers[li].MoE.Experts[ex].IntermediateSize
				l.Experts = append(l.Experts, ExpertStat{Routed: 10, Samples: 10, Inter: I, HIn: make([]float64, H*H), HDown: make([]float64, I*I)})
			}
			ls = append(ls, l)
		}
		return &Calibration{Header: Header{ModelFingerprint: testFP, DataFingerprint: testFP, Tokens: 100, Ctx: 50}, Experts: ls}
	}
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		edit func(c *Calibration)
		want string
	}{
		{"nan", func(c *Calibration) { c.Experts[1].Experts[2].HDown[5] = math.NaN() }, `"experts.layers.1.experts.2.h_down": element 5 is NaN`},
		{"shape", func(c *Calibration) { c.Experts[0].Experts[0].HIn = c.Experts[0].Experts[0].HIn[:10] }, `"experts.layers.0.experts.0.h_in": 10 values`},
		{"count", func(c *Calibration) { c.Experts[2].Experts[1].Samples = 101 }, "layer 2 expert 1: routed 10, samples 101"},
		{"negative", func(c *Calibration) { c.Experts[2].Experts[1].Routed = -1 }, "routed -1"},
		{"order", func(c *Calibration) { c.Experts[1].Layer = 0 }, "layer 0 after layer 0"},
	} {
		cal := mk()
		c.edit(cal)
		err := Write(filepath.Join(dir, c.name), cal)
		if !errors.Is(err, ErrBadStatistic) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Write: %v; want ErrBadStatistic containing %q", c.name, err, c.want)
		}
	}

	// Read: a valid file with one tensor replaced or removed.
	good := filepath.Join(dir, "good")
	if err := Write(good, mk()); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(good)
	if err != nil {
		t.Fatal(err)
	}
	h := f.Metadata()[model.MetadataKey]
	var base []safetensors.WriteTensor
	for _, ti := range f.Tensors() {
		tt, err := f.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		base = append(base, safetensors.WriteTensor{Name: ti.Name, DType: tt.DType, Shape: tt.Shape, Data: append([]byte(nil), tt.Data...)})
	}
	f.Close()
	i64 := func(v ...int64) []byte {
		b := make([]byte, 8*len(v))
		for i, x := range v {
			for k := 0; k < 8; k++ {
				b[8*i+k] = byte(uint64(x) >> (8 * k))
			}
		}
		return b
	}
	for _, c := range []struct {
		name string
		t    *safetensors.WriteTensor // replacement (Name selects); nil Data removes
		want string
	}{
		{"missing", &safetensors.WriteTensor{Name: ExpertTensorName(3, 2, "h_down")}, "experts.layers.3.experts.2.h_down"},
		{"routed dtype", &safetensors.WriteTensor{Name: ExpertTensorName(0, -1, "routed"), DType: safetensors.F64, Shape: []int{4}, Data: i64(1, 2, 3, 4)}, `"experts.layers.0.routed": F64 [4], want I64 [4] (num_experts)`},
		{"routed count", &safetensors.WriteTensor{Name: ExpertTensorName(0, -1, "routed"), DType: safetensors.I64, Shape: []int{3}, Data: i64(1, 2, 3)}, "want I64 [4]"},
		{"too many tokens", &safetensors.WriteTensor{Name: ExpertTensorName(4, -1, "samples"), DType: safetensors.I64, Shape: []int{4}, Data: i64(1, 2, 300, 4)}, "element 2 is 300, want a token count in [0, 100]"},
		{"h_down shape", &safetensors.WriteTensor{Name: ExpertTensorName(1, 0, "h_down"), DType: safetensors.F64, Shape: []int{2, 2}, Data: make([]byte, 32)}, `"experts.layers.1.experts.0.h_down": shape [2 2], want [172 172]`},
		{"not moe layer", &safetensors.WriteTensor{Name: ExpertTensorName(7, -1, "routed"), DType: safetensors.I64, Shape: []int{4}, Data: i64(1, 2, 3, 4)}, "layer 7 is not an MoE layer"},
	} {
		var ts []safetensors.WriteTensor
		replaced := false
		for _, b := range base {
			if b.Name == c.t.Name {
				replaced = true
				if c.t.Data != nil {
					ts = append(ts, *c.t)
				}
				continue
			}
			ts = append(ts, b)
		}
		if !replaced {
			ts = append(ts, *c.t)
		}
		p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "_"))
		writeRaw(t, p, ts, h)
		_, err := Read(p, model.Expect{Desc: d})
		if !errors.Is(err, ErrBadStatistic) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p) && c.name != "missing" {
			t.Errorf("%s: Read: %v; want ErrBadStatistic containing %q and the path", c.name, err, c.want)
		}
	}
}
