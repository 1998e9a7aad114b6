package wquant

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/gemq"
	"github.com/lmpack/lmpack/runtime"
)

func modelMoE(t testing.TB) string { return shared.Path(t, "stories260K-moe-hf") }

// calibMoE writes a calibration file of the model in dir (calib.txt,
// calibTokens tokens in windows of calibCtx) into a temp dir.
func calibMoE(t testing.TB, dir string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "calib.safetensors")
	if _, err := calibrate.Run(context.Background(), calibrate.Options{Model: dir, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: calibTokens, Ctx: calibCtx, Out: out, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	return out
}

// fakeQuantMoE loads the float model of dir with every weight of rep's
// tensor list replaced in memory by gemq's RTN quantizer (what the GEMQ
// coefficients measure) at the reported width and group.
func fakeQuantMoE(t *testing.T, dir string, rep *Report) runtime.Model {
	t.Helper()
	_, d, ck, err := model.Open(context.Background(), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	ov := &overlay{base: ck, repl: map[string][]float32{}, rows: map[string][2]int{}}
	for _, tr := range rep.Tensors {
		if tr.Symmetric || tr.Perm {
			t.Fatalf("%s: symmetric %v perm %v, the fake quantizer is asymmetric RTN", tr.Name, tr.Symmetric, tr.Perm)
		}
		tt, err := ck.Tensor(tr.Name)
		if err != nil {
			t.Fatal(err)
		}
		w, _ := tt.Float32()
		g := tr.GroupSize
		if g == tr.Cols {
			g = 0
		}
		dq, err := gemq.RTNOptions(g, rep.MSEClip)(w, tr.Rows, tr.Cols, tr.Bits)
		if err != nil {
			t.Fatal(err)
		}
		ov.repl[tr.Name], ov.rows[tr.Name] = dq, [2]int{tr.Rows, tr.Cols}
	}
	m, err := runtime.NewCPU().Load(context.Background(), d, ov, runtime.LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// checkMoEReport checks what must hold of an MoE report: widths per
// layer and expert in MoEWidths matching the checkpoint's config, the
// experts' stored bits per weight within the budget and equal to the
// allocation's cost, finite errors.
func checkMoEReport(t *testing.T, out string, rep *Report, budget float64) {
	t.Helper()
	a := rep.MoE
	if a == nil || len(a.Layers) != 5 || len(a.Bits) != 5 {
		t.Fatalf("budget %v: allocation %+v", budget, a)
	}
	d, err := arch.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range a.Layers {
		if len(a.Bits[i]) != 4 {
			t.Fatalf("layer %d: %d widths", l, len(a.Bits[i]))
		}
		for e, b := range a.Bits[i] {
			if b < 1 || b > 4 {
				t.Errorf("layer %d expert %d: %d bits", l, e, b)
			}
			x := d.Layers[l].MoE.Experts[e]
			for _, n := range []string{x.Gate, x.Up, x.Down} {
				if q := d.Quant.Tensors[n]; q.Bits != b || q.Symmetric {
					t.Errorf("%s: config %+v, allocation %d bits", n, q, b)
				}
			}
		}
	}
	if !a.Overhead || !(a.CodeBitsPerWeight < a.BitsPerWeight) {
		t.Errorf("budget %v: overhead %v, code bits %v, stored %v", budget, a.Overhead, a.CodeBitsPerWeight, a.BitsPerWeight)
	}
	if rep.ExpertBitsPerWeight > budget || math.Abs(rep.ExpertBitsPerWeight-a.BitsPerWeight) > 1e-12 {
		t.Errorf("budget %v: experts stored at %.6f bits per weight, allocation says %.6f", budget, rep.ExpertBitsPerWeight, a.BitsPerWeight)
	}
	for _, tr := range rep.Tensors {
		if math.IsNaN(tr.Error) || math.IsInf(tr.Error, 0) {
			t.Errorf("%s: error %v", tr.Name, tr.Error)
		}
	}
}

// TestMoEBudget quantizes stories260K-moe-hf with GEMQ expert widths at
// budgets 1.5/2.0/2.5/3.0 (attention RTN 4-bit g32), checks each report
// and checkpoint, the 2.5 checkpoint's logits against the fake-quantized
// model with the same widths, and logs the heldout perplexity table of the
// written checkpoints (RTN with min-max and with MSE-clipped grids, and
// GPTQ, with the calibration file's expert Hessians, MSE-clipped).
func TestMoEBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("quantizes and evaluates 8 checkpoints")
	}
	ctx := context.Background()
	model := modelMoE(t)
	cal := calibMoE(t, model)
	fe, err := engine.Open(ctx, model, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fe.Close()
	ids := heldoutIDs(t, fe)
	// The first moeEvalWindows heldout windows keep the test near a minute.
	const moeEvalWindows = 16
	pplN := func(m runtime.Model) float64 {
		r, err := eval.Perplexity(ctx, m, ids, eval.PerplexityOptions{Ctx: 512, MaxWindows: moeEvalWindows})
		if err != nil {
			t.Fatal(err)
		}
		return r.Perplexity
	}
	lines := []string{fmt.Sprintf("%-7s %-9s %7s %9s %12s %9s  %s", "budget", "method", "exp.bpw", "all bpw", "pred. error", "PPL", "experts at 1/2/3/4 bits"),
		fmt.Sprintf("%-7s %-9s %7s %9s %12s %9.4f", "float", "-", "32", "32", "-", pplN(fe.Model))}
	for _, cfg := range []struct {
		method string
		clip   bool
	}{{MethodRTN, false}, {MethodRTN, true}, {MethodGPTQ, true}} {
		method := cfg.method
		name := method
		if cfg.clip {
			name += "+clip"
		}
		prev := math.Inf(1)
		for _, budget := range []float64{1.5, 2.0, 2.5, 3.0} {
			out := filepath.Join(t.TempDir(), "q")
			rep, err := Run(ctx, Options{Model: model, Calib: cal, Out: out, Method: method, MSEClip: cfg.clip, Bits: 4, GroupSize: 32, MoEBudget: budget, Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			checkMoEReport(t, out, rep, budget)
			if method == MethodRTN { // (GPTQ: the same coefficients)
				if rep.MoE.PredictedError > prev {
					t.Errorf("budget %v: predicted error %v above a smaller budget's %v", budget, rep.MoE.PredictedError, prev)
				}
				prev = rep.MoE.PredictedError
			}
			qe, err := engine.Open(ctx, out, engine.Options{Threads: 1, DequantizeWeights: true})
			if err != nil {
				t.Fatal(err)
			}
			if method == MethodRTN && budget == 2.5 { // RTN needs no pipeline to reproduce
				fm := fakeQuantMoE(t, model, rep)
				x := ids[:256]
				if diff := maxAbsDiff(logits(t, qe.Model, x), logits(t, fm, x)); diff > 1e-5 {
					t.Errorf("%s budget 2.5: quantized checkpoint logits differ from the fake-quantized model by %g", name, diff)
				} else {
					t.Logf("%s budget 2.5: max |logit diff| checkpoint vs in-memory fake quantization %.3g", name, diff)
				}
			}
			p := pplN(qe.Model)
			qe.Close()
			if math.IsNaN(p) || math.IsInf(p, 0) || p <= 1 {
				t.Errorf("%s budget %v: PPL %v", name, budget, p)
			}
			w := rep.MoE.Widths
			lines = append(lines, fmt.Sprintf("%-7.1f %-9s %7.4f %9.4f %12.4e %9.4f  %d/%d/%d/%d", budget, name, rep.ExpertBitsPerWeight, rep.BitsPerWeight, rep.MoE.PredictedError, p, w[1], w[2], w[3], w[4]))
		}
	}
	t.Logf("stories260K-moe-hf, heldout.txt (first %d windows), ctx 512; experts per channel with fp16 scale+zero (exp.bpw counts them), attention RTN/GPTQ 4-bit g32; +clip: MSE-clipped grids:\n%s", moeEvalWindows, strings.Join(lines, "\n"))
}

// neverRoutedModel writes a copy of stories260K-moe-hf whose layer-0
// router row of expert 3 is −100·μ, μ the mean of layer 0's FFN inputs
// over the calibration text's tokens: the test checks μ·x > 0 for every
// one of them, so expert 3's logit is below −100·min μ·x, far under the
// others, and it is never among the top 2.
func neverRoutedModel(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	src := modelMoE(t)
	e, err := engine.Open(ctx, src, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cids, err := e.EvalIDs(shared.Path(t, "tinystories-valid", "calib.txt"), calibCtx)
	if err != nil {
		t.Fatal(err)
	}
	wins, err := calibrate.Windows(cids, 2*calibTokens, calibCtx)
	if err != nil {
		t.Fatal(err)
	}
	ins, err := gemq.Capture(ctx, e.Model, wins, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	in := ins[0]
	H := in.Hidden
	mu := make([]float64, H)
	for tk := 0; tk < in.N; tk++ {
		for j := 0; j < H; j++ {
			mu[j] += float64(in.X[tk*H+j]) / float64(in.N)
		}
	}
	minDot := math.Inf(1)
	for tk := 0; tk < in.N; tk++ {
		var s float64
		for j := 0; j < H; j++ {
			s += mu[j] * float64(in.X[tk*H+j])
		}
		minDot = math.Min(minDot, s)
	}
	if !(minDot > 0.5) {
		t.Fatalf("min μ·x over the calibration tokens is %v; the forced routing needs it positive", minDot)
	}
	d, ck := e.Desc, e.Checkpoint
	dir := t.TempDir()
	router := d.Layers[0].MoE.Router
	var ts []safetensors.WriteTensor
	for _, n := range ck.Names() {
		tt, _ := ck.Tensor(n)
		if n == router {
			w, _ := tt.Float32()
			for j := 0; j < H; j++ {
				w[3*H+j] = float32(-100 * mu[j])
			}
			ts = append(ts, safetensors.FromFloat32(n, tt.Shape, w))
			continue
		}
		ts = append(ts, safetensors.WriteTensor{Name: n, DType: tt.DType, Shape: tt.Shape, Data: tt.Data})
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		if e.Type().IsRegular() && !strings.HasSuffix(e.Name(), ".safetensors") {
			b, _ := os.ReadFile(filepath.Join(src, e.Name()))
			if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// TestMoENeverRouted: an expert the router never picks gets GEMQ's
// fallback coefficients and the expert Hessians' fallback, each with a
// warning naming it, and the checkpoint runs to finite logits.
func TestMoENeverRouted(t *testing.T) {
	ctx := context.Background()
	model := neverRoutedModel(t)
	cal := calibMoE(t, model)
	out := filepath.Join(t.TempDir(), "q")
	rep, err := Run(ctx, Options{Model: model, Calib: cal, Out: out, Method: MethodGPTQ, Bits: 4, GroupSize: 32, MoEBudget: 2.0, MeasureTokens: 1024, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkMoEReport(t, out, rep, 2.0)
	var never, hess bool
	for _, w := range rep.Warnings {
		never = never || strings.Contains(w, "layer 0 expert 3: never routed")
		hess = hess || strings.Contains(w, "layer 0 expert 3: 0 calibration samples")
	}
	if !never || !hess {
		t.Errorf("warnings %q lack the never-routed expert's", rep.Warnings)
	}
	t.Logf("warnings:\n%s", strings.Join(rep.Warnings, "\n"))
	qe, err := engine.Open(ctx, out, engine.Options{Threads: 1, DequantizeWeights: true})
	if err != nil {
		t.Fatal(err)
	}
	defer qe.Close()
	for i, v := range logits(t, qe.Model, heldoutIDs(t, qe)[:128]) {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %d is %v", i, v)
		}
	}
}

// TestMoEBadOptions: MoE-specific refusals, before any quantization.
func TestMoEBadOptions(t *testing.T) {
	model := modelMoE(t)
	cal := calibMoE(t, model)
	tmp := t.TempDir()
	ok := Options{Model: model, Calib: cal, Out: filepath.Join(tmp, "q"), Method: MethodRTN, Bits: 4, GroupSize: 32, MoEBudget: 2.5, Threads: 1}
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		want string
	}{
		// 1 bit per channel: gate/up [172, 64] 64+32 bits a row, down
		// [64, 172] 176+32: (2·172·96 + 64·208)/(3·64·172) = 1.4031.
		{"below the 1-bit cost", func(o *Options) { o.MoEBudget = 1.2 }, "MoEBudget 1.2: want at least the smallest allocation on this model, every expert at 1 bit: 1.4032"},
		{"target bpw on MoE", func(o *Options) { o.Bits, o.TargetBPW, o.MoEBudget, o.GroupSize = 0, 3, 0, 0 }, "mixture-of-experts model"},
		{"moe group", func(o *Options) { o.MoEGroup = 64 }, "does not divide the 172 columns"},
		// The rule: per layer 4.3953 + 3.4031 + 2·1.4031 over 4 experts.
		{"rule infeasible", func(o *Options) { o.MoEBudget, o.MoERule = 2.6, true }, "under the per-layer rule (MoERule: one expert at 4 bits and another at 3 in every layer, the rest at 1): 2.6512"},
	} {
		o := ok
		tc.mod(&o)
		_, err := Run(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want it to contain %q", tc.name, err, tc.want)
		} else if !errors.Is(err, ErrOptions) {
			t.Errorf("%s: %v is not ErrOptions", tc.name, err)
		}
	}
	if ents, _ := os.ReadDir(tmp); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// TestMoEKLRule: the KL weighting and the per-layer rule through Run:
// every layer has an expert at 4 bits and another at 3, within budget
// (2.7; the rule needs 2.6512 here).
func TestMoEKLRule(t *testing.T) {
	model := modelMoE(t)
	cal := calibMoE(t, model)
	out := filepath.Join(t.TempDir(), "q")
	rep, err := Run(context.Background(), Options{Model: model, Calib: cal, Out: out, Method: MethodRTN, Bits: 4, GroupSize: 32,
		MoEBudget: 2.7, MoEWeighting: gemq.WeightKL, MoERule: true, MeasureTokens: 512, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkMoEReport(t, out, rep, 2.7)
	for i, row := range rep.MoE.Bits {
		n4, n3 := 0, 0
		for _, b := range row {
			if b == 4 {
				n4++
			}
			if b == 3 {
				n3++
			}
		}
		if n4 == 0 || n3 == 0 {
			t.Errorf("layer %d: widths %v break the rule", rep.MoE.Layers[i], row)
		}
	}
	if rep.MoE.Method != "dp" || rep.MoE.Gap != 0 {
		t.Errorf("solver %s gap %v", rep.MoE.Method, rep.MoE.Gap)
	}
	t.Logf("KL + rule at 2.7: widths %v, predicted KL sum %.4g nats", rep.MoE.Bits, rep.MoE.PredictedError)
}

// TestMoESequentialExpertHessians: the routed experts' GPTQ Hessians
// collected on the quantized prefix's hidden states (the default) against
// those of the calibration file's float model, at the same GEMQ
// allocation: the same expert widths, and a heldout perplexity no worse
// than 2% above the float-Hessian checkpoint's at every budget (it is
// lower in the measurements logged), and a different checkpoint (the
// Hessians did change).
func TestMoESequentialExpertHessians(t *testing.T) {
	if testing.Short() {
		t.Skip("quantizes and evaluates 4 MoE checkpoints")
	}
	ctx := context.Background()
	model := modelMoE(t)
	cal := calibMoE(t, model)
	fe, err := engine.Open(ctx, model, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer fe.Close()
	ids := heldoutIDs(t, fe)
	var lines []string
	for _, budget := range []float64{2.0, 3.0} {
		ppl := map[bool]float64{}
		widths := map[bool]map[int]int{}
		var down [2][]byte
		for i, float := range []bool{true, false} {
			out := filepath.Join(t.TempDir(), "q")
			rep, err := Run(ctx, Options{Model: model, Calib: cal, Out: out, Method: MethodGPTQ, MSEClip: true, Bits: 4, GroupSize: 32, MoEBudget: budget, Threads: 1, floatExpertHessians: float})
			if err != nil {
				t.Fatal(err)
			}
			widths[float] = rep.MoE.Widths
			qe, err := engine.Open(ctx, out, engine.Options{Threads: 1, DequantizeWeights: true})
			if err != nil {
				t.Fatal(err)
			}
			r, err := eval.Perplexity(ctx, qe.Model, ids, eval.PerplexityOptions{Ctx: 512, MaxWindows: 16})
			qe.Close()
			if err != nil {
				t.Fatal(err)
			}
			ppl[float] = r.Perplexity
			ck, err := safetensors.OpenDir(out)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range ck.Names() {
				if strings.Contains(name, ".experts.") && strings.HasSuffix(name, arch.SuffixQWeight) {
					tt, err := ck.Tensor(name)
					if err != nil {
						ck.Close()
						t.Fatal(err)
					}
					down[i] = append(down[i], tt.Data...)
				}
			}
			ck.Close()
		}
		lines = append(lines, fmt.Sprintf("budget %.1f: float-model expert Hessians PPL %.4f, sequential %.4f (experts at bits: %v)", budget, ppl[true], ppl[false], widths[false]))
		if !maps.Equal(widths[true], widths[false]) {
			t.Errorf("budget %v: widths %v vs %v: the allocation must not depend on the Hessians", budget, widths[true], widths[false])
		}
		if !(ppl[false] <= 1.02*ppl[true]) {
			t.Errorf("budget %v: sequential expert Hessians PPL %.4f, more than 2%% above the float model's %.4f", budget, ppl[false], ppl[true])
		}
		if len(down[0]) == 0 || string(down[0]) == string(down[1]) {
			t.Errorf("budget %v: expert codes (%d bytes) identical: the sequential Hessians were not used", budget, len(down[0]))
		}
	}
	t.Logf("stories260K-moe-hf, GPTQ+clip, attention 4-bit g32, heldout.txt first 16 windows of 512:\n%s", strings.Join(lines, "\n"))
}
