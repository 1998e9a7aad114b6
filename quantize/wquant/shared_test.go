package wquant

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/synthmoe"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime"
)

// sharedMoE writes the synthetic Qwen2-MoE checkpoint (internal/synthmoe:
// 2 sparse layers, 4 routed experts of 32, a shared expert of 96, hidden
// 64, stories260K's tokenizer) and its calibration file (calib.txt, 4096
// tokens in windows of 512).
func sharedMoE(t *testing.T) (dir, calib string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "qwen2moe")
	if _, err := synthmoe.Write(dir, 7, model260K(t)); err != nil {
		t.Fatal(err)
	}
	return dir, calibMoE(t, dir)
}

// loadFloat loads dir (float or quantized) on the CPU runtime.
func loadFloat(t *testing.T, dir string) (runtime.Model, *arch.Description) {
	t.Helper()
	_, d, ck, err := model.Open(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	// Dequantized at load: these tests measure the quantizer, not the
	// runtime's int8-activation kernels (runtime/qlinear_ext_test.go).
	m, err := runtime.NewCPU().Load(context.Background(), d, ck, runtime.LoadOptions{Threads: 1, DequantizeWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, d
}

// The shared expert's gate/up/down are targets after the routed experts,
// not experts, with the MoE block input for gate/up.
func TestTargetsSharedExpert(t *testing.T) {
	raw := synthmoe.Config()
	d, err := arch.Parse(mustJSON(t, raw))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := Targets(d)
	if err != nil {
		t.Fatal(err)
	}
	if want := synthmoe.Layers * (4 + 3*synthmoe.Experts + 3); len(ts) != want {
		t.Fatalf("%d targets, want %d", len(ts), want)
	}
	var sh []Target
	for _, tg := range ts {
		if tg.Shared {
			sh = append(sh, tg)
		}
	}
	if len(sh) != 3*synthmoe.Layers {
		t.Fatalf("%d shared-expert targets", len(sh))
	}
	want := []struct {
		name, kind     string
		rows, cols, in int
	}{
		{"model.layers.1.mlp.shared_expert.gate_proj.weight", "gate_proj", synthmoe.SharedInter, synthmoe.Hidden, inFFN},
		{"model.layers.1.mlp.shared_expert.up_proj.weight", "up_proj", synthmoe.SharedInter, synthmoe.Hidden, inFFN},
		{"model.layers.1.mlp.shared_expert.down_proj.weight", "down_proj", synthmoe.Hidden, synthmoe.SharedInter, inSharedDown},
	}
	for i, w := range want {
		g := sh[3+i]
		if g.Name != w.name || g.Kind != w.kind || g.Rows != w.rows || g.Cols != w.cols || g.input != w.in || g.Expert != -1 || g.IsExpert() || g.Layer != 1 {
			t.Errorf("shared target %d: %+v, want %+v", i, g, w)
		}
	}
	if last := ts[len(ts)-1]; last.Name != want[2].name {
		t.Errorf("last target %s, want the shared down_proj after the routed experts", last.Name)
	}
}

// The shared down_proj Hessian the observer accumulates (two calls, as
// two windows) equals (2/N)·Σ h hᵀ with h = silu(x·gateᵀ)⊙(x·upᵀ)
// computed directly in float64 on the same inputs.
func TestSharedDownHessian(t *testing.T) {
	const H, I, n1, n2 = 24, 40, 37, 21
	r := rand.New(rand.NewPCG(3, 4))
	randv := func(n int, s float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(s * r.NormFloat64())
		}
		return v
	}
	gate, up := randv(I*H, 0.5), randv(I*H, 0.5)
	x := randv((n1+n2)*H, 1)
	d := &arch.Description{HiddenSize: H}
	mlp := &arch.MLP{Gate: "g", Up: "u", Down: "d", IntermediateSize: I}
	src := &overlay{repl: map[string][]float32{"g": gate, "u": up}, rows: map[string][2]int{"g": {I, H}, "u": {I, H}}}
	sd, err := newSharedDown(src, mlp, d.HiddenSize)
	if err != nil {
		t.Fatal(err)
	}
	l := &arch.Layer{NumHeads: 2, NumKVHeads: 1, HeadDim: 4, MoE: &arch.MoE{Shared: mlp}}
	hs := newHessians(l, H, sd)
	hs.FFNInput(0, 0, n1, x[:n1*H], nil)
	hs.FFNInput(0, n1, n2, x[n1*H:], nil)
	if err := hs.finish(); err != nil {
		t.Fatal(err)
	}
	got := hs.h[inSharedDown].Matrix()
	N := n1 + n2
	want := make([]float64, I*I)
	h := make([]float64, I)
	for tk := 0; tk < N; tk++ {
		for i := 0; i < I; i++ {
			var g, u float64
			for k := 0; k < H; k++ {
				g += float64(gate[i*H+k]) * float64(x[tk*H+k])
				u += float64(up[i*H+k]) * float64(x[tk*H+k])
			}
			h[i] = g / (1 + math.Exp(-g)) * u
		}
		for i := 0; i < I; i++ {
			for j := 0; j < I; j++ {
				want[i*I+j] += 2 * h[i] * h[j] / float64(N)
			}
		}
	}
	var mx, scale float64
	for i := range want {
		mx = math.Max(mx, math.Abs(got[i]-want[i]))
		scale = math.Max(scale, math.Abs(want[i]))
	}
	t.Logf("shared down Hessian: max |Δ| %.3g of max %.3g", mx, scale)
	if !(scale > 0) || mx > 1e-12*scale {
		t.Errorf("shared down Hessian: max |Δ| %.3g > 1e-12 × %.3g", mx, scale)
	}
	// The gate/up Hessian is the plain input Hessian of x.
	ref := weights.NewHessian(H)
	if err := ref.Add(x[:n1*H], n1); err != nil {
		t.Fatal(err)
	}
	if err := ref.Add(x[n1*H:], n2); err != nil {
		t.Fatal(err)
	}
	if gm, rm := hs.h[inFFN].Matrix(), ref.Matrix(); !slices.Equal(gm, rm) {
		t.Errorf("shared gate/up Hessian differs from the input Hessian")
	}
}

// TestSharedExpertQuantize quantizes the synthetic Qwen2-MoE: 8-bit GPTQ
// stays close to the float logits; under --moe-budget the shared expert
// keeps --bits and --group, is reported as a shared expert and is not in
// the expert bits per weight; TrueSequential runs.
func TestSharedExpertQuantize(t *testing.T) {
	dir, calib := sharedMoE(t)
	fm, _ := loadFloat(t, dir)
	e, err := engine.Open(context.Background(), dir, engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ids := heldoutIDs(t, e)[:256]
	ref := logits(t, fm, ids)
	// relRMS is ‖Δlogits‖/‖logits‖ over all positions and the vocabulary.
	relRMS := func(q []float32) float64 {
		var s, r float64
		for i := range q {
			s += float64(q[i]-ref[i]) * float64(q[i]-ref[i])
			r += float64(ref[i]) * float64(ref[i])
		}
		return math.Sqrt(s / r)
	}
	ctx := context.Background()
	out := filepath.Join(t.TempDir(), "q8")
	rep, err := Run(ctx, Options{Model: dir, Calib: calib, Out: out, Method: MethodGPTQ, Bits: 8, GroupSize: 32, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	qm, qd := loadFloat(t, out)
	q8 := logits(t, qm, ids)
	rel, mx := relRMS(q8), maxAbsDiff(q8, ref)
	t.Logf("8-bit GPTQ g32 on 256 heldout tokens: ‖Δlogits‖/‖logits‖ %.4g, max |Δlogit| %.4g", rel, mx)
	// Measured 0.0067 and 0.18 (the random model amplifies the 8-bit
	// rounding, about 2e-5 relative squared error per tensor, to about 1%
	// of its logits; RTN 8-bit gives 0.0098): bounds at about 3×.
	if rel > 0.02 || mx > 0.55 {
		t.Errorf("8-bit GPTQ: ‖Δlogits‖/‖logits‖ %.4g (bound 0.02), max |Δlogit| %.4g (bound 0.55)", rel, mx)
	}
	nShared := 0
	for _, tr := range rep.Tensors {
		if !tr.Shared {
			continue
		}
		nShared++
		if tr.Bits != 8 || tr.GroupSize != 32 || tr.Expert != -1 || !(tr.Error >= 0) || !(tr.RelError < 1e-3) {
			t.Errorf("%s: %+v", tr.Name, tr)
		}
		if q, ok := qd.Quant.Tensors[tr.Name]; !ok || q.Bits != 8 || q.GroupSize != 32 {
			t.Errorf("%s: config %+v %v", tr.Name, q, ok)
		}
	}
	if nShared != 3*synthmoe.Layers {
		t.Errorf("%d shared-expert tensors reported, want %d", nShared, 3*synthmoe.Layers)
	}
	for l := range qd.Layers {
		if g := qd.Layers[l].MoE.SharedGate; qd.Quant.Tensors[g].Bits != 0 {
			t.Errorf("%s quantized", g)
		}
	}

	// --moe-budget: routed experts by GEMQ, the shared expert at --bits.
	const budget = 2.5
	out = filepath.Join(t.TempDir(), "qb")
	rep, err = Run(ctx, Options{Model: dir, Calib: calib, Out: out, Method: MethodGPTQ, Bits: 4, GroupSize: 32, MoEBudget: budget, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	var eBits, eParams, sBits, sParams int64
	nShared = 0
	for _, tr := range rep.Tensors {
		bits := StorageBits(tr.Rows, tr.Cols, tr.Bits, tr.GroupSize, tr.Symmetric, tr.Perm)
		switch {
		case tr.IsExpert():
			eBits += bits
			eParams += int64(tr.Rows * tr.Cols)
		case tr.Shared:
			nShared++
			sBits += bits
			sParams += int64(tr.Rows * tr.Cols)
			if tr.Bits != 4 || tr.GroupSize != 32 || tr.Symmetric {
				t.Errorf("%s: %d bits group %d sym %v, want --bits 4 --group 32", tr.Name, tr.Bits, tr.GroupSize, tr.Symmetric)
			}
		}
	}
	if nShared != 3*synthmoe.Layers || rep.MoE == nil {
		t.Fatalf("%d shared tensors, allocation %v", nShared, rep.MoE)
	}
	got := float64(eBits) / float64(eParams)
	with := float64(eBits+sBits) / float64(eParams+sParams)
	t.Logf("moe budget %g: experts %.4f bits per weight (with the shared experts it would be %.4f), all %.4f; allocation %v", budget, rep.ExpertBitsPerWeight, with, rep.BitsPerWeight, rep.MoE.Bits)
	if rep.ExpertBitsPerWeight != got || rep.ExpertBitsPerWeight > budget || math.Abs(rep.ExpertBitsPerWeight-rep.MoE.BitsPerWeight) > 1e-12 || got == with {
		t.Errorf("expert bits per weight %v, routed experts %v, allocation %v, with shared %v", rep.ExpertBitsPerWeight, got, rep.MoE.BitsPerWeight, with)
	}
	if len(rep.MoE.Bits) != synthmoe.Layers || len(rep.MoE.Bits[0]) != synthmoe.Experts {
		t.Errorf("allocation widths %v: want %d layers of %d routed experts", rep.MoE.Bits, synthmoe.Layers, synthmoe.Experts)
	}
	qb, _ := loadFloat(t, out)
	for _, v := range logits(t, qb, ids) {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("budget checkpoint: logit %v", v)
		}
	}

	// TrueSequential with act-order: the shared down_proj's Hessian pass
	// runs on the block with the quantized shared gate/up.
	out = filepath.Join(t.TempDir(), "qt")
	if _, err := Run(ctx, Options{Model: dir, Calib: calib, Out: out, Method: MethodGPTQ, Bits: 8, GroupSize: 32, ActOrder: true, TrueSequential: true, Threads: 1}); err != nil {
		t.Fatal(err)
	}
	qt, _ := loadFloat(t, out)
	if rel := relRMS(logits(t, qt, ids)); rel > 0.02 {
		t.Errorf("8-bit GPTQ true-sequential act-order: ‖Δlogits‖/‖logits‖ %.4g > 0.02", rel)
	}
}

// GPTQ beats RTN at 3 bits on the shared down_proj: on the float block
// inputs of each layer, only the shared expert's down_proj quantized (RTN
// or GPTQ with the observer's Hessian, group 32), the block output's
// mean squared difference from the float block over the calibration
// tokens, and the Linear output error.
func TestSharedDownGPTQBeatsRTN(t *testing.T) {
	dir, calib := sharedMoE(t)
	_, d, ck, err := model.Open(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	cal, err := calibrate.Read(calib, model.Expect{Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	targets, err := Targets(d)
	if err != nil {
		t.Fatal(err)
	}
	p := &pipeline{opt: Options{Method: MethodGPTQ, Threads: 1}, d: d, ck: ck, targets: targets, wins: cal.CalibrationWindows(),
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx := context.Background()
	xs, err := p.hidden()
	if err != nil {
		t.Fatal(err)
	}
	H := d.HiddenSize
	for l := range d.Layers {
		in := make([][]float32, len(xs))
		for i, x := range xs {
			in[i] = slices.Clone(x)
		}
		hs, err := p.layerHessians(ctx, l, xs, true)
		if err != nil {
			t.Fatal(err)
		}
		var tg Target
		for _, x := range targets {
			if x.Layer == l && x.Shared && x.Kind == "down_proj" {
				tg = x
			}
		}
		if !strings.Contains(tg.Name, "shared_expert.down_proj") || hs.h[inSharedDown] == nil {
			t.Fatalf("layer %d: shared down target %q, Hessian %v", l, tg.Name, hs.h[inSharedDown])
		}
		w, err := p.weight(tg)
		if err != nil {
			t.Fatal(err)
		}
		var lin, blk [2]float64
		for mi, method := range []string{MethodRTN, MethodGPTQ} {
			_, dq, err := quantizeOne(w, tg, method, weights.Options{Bits: 3, GroupSize: 32}, false, 0, hs.h[inSharedDown], 1)
			if err != nil {
				t.Fatal(err)
			}
			lin[mi], _ = outputError(w, dq, tg.Rows, tg.Cols, hs.h[inSharedDown].Matrix())
			m, err := loadLayer(ctx, d, l, ck, map[string][]float32{tg.Name: dq}, map[string][]int{tg.Name: {tg.Rows, tg.Cols}}, 1)
			if err != nil {
				t.Fatal(err)
			}
			out := make([][]float32, len(in))
			for i, x := range in {
				out[i] = slices.Clone(x)
			}
			if err := pushHidden(ctx, m, out, H); err != nil {
				t.Fatal(err)
			}
			m.Close()
			var s float64
			var n int
			for i := range out {
				for j := range out[i] {
					e := float64(out[i][j] - xs[i][j])
					s += e * e
				}
				n += len(out[i]) / H
			}
			blk[mi] = s / float64(n)
		}
		t.Logf("layer %d shared down_proj 3-bit g32: block output ‖Δy‖²/token RTN %.5g GPTQ %.5g (%.1f%%); linear error RTN %.5g GPTQ %.5g",
			l, blk[0], blk[1], 100*blk[1]/blk[0], lin[0], lin[1])
		if !(blk[1] < blk[0]) || !(lin[1] < lin[0]) {
			t.Errorf("layer %d: GPTQ block error %g, linear %g not below RTN %g, %g", l, blk[1], lin[1], blk[0], lin[0])
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSharedDownHessianReplaced: the block's Hessian pass builds the
// shared down_proj Hessian from the gate/up weights the block runs with:
// with replacements for them (TrueSequential's already quantized gate/up)
// it equals a sharedDown fed the same block inputs from the replaced
// weights, and differs from the checkpoint weights' one.
func TestSharedDownHessianReplaced(t *testing.T) {
	dir, _ := sharedMoE(t)
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const l = 1
	mo := d.Layers[l].MoE
	if mo == nil || mo.Shared == nil {
		t.Fatalf("layer %d has no shared expert", l)
	}
	H, I := d.HiddenSize, mo.Shared.IntermediateSize
	p := &pipeline{opt: Options{Threads: 1}, d: d, ck: ck}
	r := rand.New(rand.NewPCG(9, 10))
	xs := make([][]float32, 2)
	for i := range xs {
		xs[i] = make([]float32, 40*H)
		for j := range xs[i] {
			xs[i][j] = float32(r.NormFloat64())
		}
	}
	// The replacement: the checkpoint's gate and up, each scaled by 1.5.
	repl, shapes := map[string][]float32{}, map[string][]int{}
	for _, name := range []string{mo.Shared.Gate, mo.Shared.Up} {
		tt, err := ck.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		v, err := tt.Float32()
		if err != nil {
			t.Fatal(err)
		}
		for i := range v {
			v[i] *= 1.5
		}
		repl[name], shapes[name] = v, []int{I, H}
	}
	ctx := context.Background()
	pass := func(rp map[string][]float32, sh map[string][]int) []float64 {
		hs, err := p.layerHessiansWith(ctx, l, xs, false, rp, sh, nil, true) // finished
		if err != nil {
			t.Fatal(err)
		}
		return hs.h[inSharedDown].Matrix()
	}
	got, float := pass(repl, shapes), pass(nil, nil)
	// The reference: the block inputs (the FFN observer's x, after the
	// attention and post-attention norm, which the replacement does not
	// touch) fed to a sharedDown over the replaced weights.
	var inputs [][]float32
	rec := &ffnInputs{layer: 0, out: &inputs}
	m, err := loadLayer(ctx, d, l, ck, nil, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	m.SetObserver(rec)
	var buf []float32
	for _, x := range xs {
		buf = append(buf[:0], x...)
		if err := pushHidden(ctx, m, [][]float32{buf}, H); err != nil {
			t.Fatal(err)
		}
	}
	m.Close()
	sd, err := newSharedDown(&layerSource{base: ck, embedding: d.Embedding, hidden: H, repl: repl, shapes: shapes}, mo.Shared, H)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range inputs {
		if err := sd.add(x, len(x)/H); err != nil {
			t.Fatal(err)
		}
	}
	ref, err := sd.hessian()
	if err != nil {
		t.Fatal(err)
	}
	want := ref.Matrix()
	var d1, d2, scale float64
	for i := range want {
		d1 = math.Max(d1, math.Abs(got[i]-want[i]))
		d2 = math.Max(d2, math.Abs(float[i]-want[i]))
		scale = math.Max(scale, math.Abs(want[i]))
	}
	t.Logf("shared down Hessian with replaced gate/up: max |Δ| %.3g against the replaced reference, %.3g against the checkpoint weights' (max %.3g)", d1, d2, scale)
	if !(scale > 0) || d1 > 1e-12*scale {
		t.Errorf("the pass with replacements differs from the replaced reference by %.3g (max %.3g)", d1, scale)
	}
	if d2 < 1e-3*scale {
		t.Errorf("the checkpoint weights' Hessian is within %.3g of the replaced one: the replacement was not used", d2)
	}
}

// ffnInputs records the FFN observer's block inputs of one layer.
type ffnInputs struct {
	layer int
	out   *[][]float32
}

// FFNInput implements runtime.FFNObserver.
func (f *ffnInputs) FFNInput(layer, pos, n int, x, h []float32) {
	if layer == f.layer {
		*f.out = append(*f.out, slices.Clone(x))
	}
}
