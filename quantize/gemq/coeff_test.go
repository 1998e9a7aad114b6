package gemq

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// synthLayer returns a random MoE layer: E experts of intermediate I on
// hidden H, N tokens routed to their top-K by softmax probability.
func synthLayer(seed uint64, N, H, I, E, K int, norm bool) (*LayerInput, []Expert) {
	r := rand.New(rand.NewPCG(seed, 7))
	in := &LayerInput{Layer: 3, Hidden: H, NumExperts: E, TopK: K, NormTopK: norm, N: N,
		X: randW(r, N*H), Logits: randW(r, N*E), Selected: make([]int32, N*K)}
	for i := range in.X {
		in.X[i] *= 10
	}
	for i := range in.Logits {
		in.Logits[i] *= 20
	}
	for t := 0; t < N; t++ {
		taken := map[int]bool{}
		for j := 0; j < K; j++ {
			best := -1
			for e := 0; e < E; e++ {
				if !taken[e] && (best < 0 || in.Logits[t*E+e] > in.Logits[t*E+best]) {
					best = e
				}
			}
			taken[best] = true
			in.Selected[t*K+j] = int32(best)
		}
	}
	ex := make([]Expert, E)
	for e := range ex {
		ex[e] = Expert{Inter: I, Gate: randW(r, I*H), Up: randW(r, I*H), Down: randW(r, H*I)}
	}
	return in, ex
}

// naiveExpert evaluates one expert on x in float64, written out.
func naiveExpert(x *Expert, xs []float32, H int) []float64 {
	I := x.Inter
	h := make([]float64, I)
	for i := 0; i < I; i++ {
		var g, u float64
		for k := 0; k < H; k++ {
			g += float64(x.Gate[i*H+k]) * float64(xs[k])
			u += float64(x.Up[i*H+k]) * float64(xs[k])
		}
		h[i] = g / (1 + math.Exp(-g)) * u
	}
	y := make([]float64, H)
	for k := 0; k < H; k++ {
		for i := 0; i < I; i++ {
			y[k] += float64(x.Down[k*I+i]) * h[i]
		}
	}
	return y
}

// naiveBlock is the MoE block output of token t: Σ over its top-k of the
// routing weight times the expert output, with expert q replaced by
// repl when repl is not nil; soft uses every expert with its softmax
// probability instead of the top-k.
func naiveBlock(in *LayerInput, ex []Expert, t, q int, repl *Expert, soft bool) []float64 {
	E, K, H := in.NumExperts, in.TopK, in.Hidden
	p := make([]float64, E)
	var s float64
	for e := range p {
		p[e] = math.Exp(float64(in.Logits[t*E+e]))
		s += p[e]
	}
	use := map[int]float64{}
	if soft {
		for e := range p {
			use[e] = p[e] / s
		}
	} else {
		var sk float64
		for _, e := range in.Selected[t*K : (t+1)*K] {
			sk += p[e] / s
		}
		for _, e := range in.Selected[t*K : (t+1)*K] {
			use[int(e)] = p[e] / s
			if in.NormTopK {
				use[int(e)] /= sk
			}
		}
	}
	y := make([]float64, H)
	for e, w := range use {
		x := &ex[e]
		if e == q && repl != nil {
			x = repl
		}
		for k, v := range naiveExpert(x, in.X[t*H:(t+1)*H], H) {
			y[k] += w * v
		}
	}
	return y
}

// refCoeff is the mean over tokens of ‖ŷ − y‖² with only expert e
// quantized at b bits, from full naive block outputs.
func refCoeff(t *testing.T, in *LayerInput, ex []Expert, e, b int, soft bool) float64 {
	q := RTN(0)
	x := ex[e]
	H, I := in.Hidden, x.Inter
	var err error
	r := Expert{Inter: I}
	if r.Gate, err = q(x.Gate, I, H, b); err != nil {
		t.Fatal(err)
	}
	if r.Up, err = q(x.Up, I, H, b); err != nil {
		t.Fatal(err)
	}
	if r.Down, err = q(x.Down, H, I, b); err != nil {
		t.Fatal(err)
	}
	var c float64
	for tk := 0; tk < in.N; tk++ {
		y := naiveBlock(in, ex, tk, e, nil, soft)
		yq := naiveBlock(in, ex, tk, e, &r, soft)
		for k := range y {
			c += (yq[k] - y[k]) * (yq[k] - y[k])
		}
	}
	return c / float64(in.N)
}

// TestLayerCoefficients: WeightRouted equals the mean squared change of
// the whole block output (computed naively from all experts) when one
// expert is quantized, with and without top-k renormalisation; WeightSoft
// equals the same with every expert weighted by its softmax probability;
// coefficients are positive and routed counts add up to N·K.
func TestLayerCoefficients(t *testing.T) {
	for _, norm := range []bool{true, false} {
		in, ex := synthLayer(5, 40, 8, 12, 4, 2, norm)
		for _, w := range []Weighting{WeightRouted, WeightSoft} {
			lc, warns, err := LayerCoefficients(in, ex, Options{Weighting: w, MinTokens: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(warns) != 0 || lc.Layer != 3 || len(lc.Experts) != 4 {
				t.Fatalf("norm %v %s: layer %d, %d experts, warnings %v", norm, w, lc.Layer, len(lc.Experts), warns)
			}
			var routed int64
			for e, x := range lc.Experts {
				routed += x.Routed
				if x.Params != 3*8*12 || x.Inter != 12 || x.Fallback {
					t.Errorf("expert %d: params %d inter %d fallback %v", e, x.Params, x.Inter, x.Fallback)
				}
				for bi, b := range DefaultBits {
					if x.Routed == 0 && w == WeightRouted {
						continue
					}
					want := refCoeff(t, in, ex, e, b, w == WeightSoft)
					if got := x.C[bi]; !(want > 0) || math.Abs(got-want) > 1e-9*want {
						t.Errorf("norm %v %s expert %d %d bits: c = %.12g, block reference %.12g", norm, w, e, b, got, want)
					}
				}
			}
			if routed != 80 {
				t.Errorf("routed %d tokens in all, want N·K = 80", routed)
			}
		}
	}
}

// TestFallback: an expert never selected gets, under WeightRouted, the
// WeightSoft coefficients (finite, positive) and a warning naming it;
// with the fallback disabled its coefficients are 0, never NaN.
func TestFallback(t *testing.T) {
	in, ex := synthLayer(6, 30, 8, 12, 4, 2, true)
	for tk := 0; tk < in.N; tk++ { // move expert 2's tokens to the free one of 0, 1, 3
		for j := 0; j < 2; j++ {
			if in.Selected[tk*2+j] == 2 {
				o := in.Selected[tk*2+1-j]
				for _, c := range []int32{0, 1, 3} {
					if c != o {
						in.Selected[tk*2+j] = c
						break
					}
				}
			}
		}
	}
	lc, warns, err := LayerCoefficients(in, ex, Options{MinTokens: 1})
	if err != nil {
		t.Fatal(err)
	}
	soft, _, err := LayerCoefficients(in, ex, Options{Weighting: WeightSoft})
	if err != nil {
		t.Fatal(err)
	}
	x := lc.Experts[2]
	if x.Routed != 0 || !x.Fallback || len(warns) != 1 || !strings.Contains(warns[0], "layer 3 expert 2: routed 0") {
		t.Fatalf("routed %d fallback %v warnings %q", x.Routed, x.Fallback, warns)
	}
	for bi := range x.C {
		if x.C[bi] != soft.Experts[2].C[bi] || !(x.C[bi] > 0) {
			t.Errorf("fallback c[%d] = %v, soft %v", bi, x.C[bi], soft.Experts[2].C[bi])
		}
	}
	off, warns, err := LayerCoefficients(in, ex, Options{MinTokens: -1})
	if err != nil || len(warns) != 0 {
		t.Fatal(err, warns)
	}
	for bi, c := range off.Experts[2].C {
		if c != 0 {
			t.Errorf("no fallback: c[%d] = %v, want 0", bi, c)
		}
	}
	for _, bad := range []struct {
		opt  Options
		want string
	}{
		{Options{Bits: []int{2}}, "at least two widths"},
		{Options{Bits: []int{3, 2}}, "increasing widths"},
		{Options{Weighting: "grad"}, `weighting "grad"`},
	} {
		if _, _, err := LayerCoefficients(in, ex, bad.opt); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want %q", bad.opt, err, bad.want)
		}
	}
	if _, _, err := LayerCoefficients(in, ex[:3], Options{}); err == nil || !strings.Contains(err.Error(), "3 experts, the router has 4") {
		t.Errorf("3 experts: %v", err)
	}
	in.Selected[5] = 9
	if _, _, err := LayerCoefficients(in, ex, Options{}); err == nil || !strings.Contains(err.Error(), "selects expert 9 of 4") {
		t.Errorf("expert 9: %v", err)
	}
}
