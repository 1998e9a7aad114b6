package kvcache

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lmpack/lmpack/runtime"
)

// Probes of the int8-rounded value weights (kernels.CodeAccumQ8, 2-bit
// values at head_dim 64, cache.roundsWeights) through KVAttender.AccumV
// against Read's values, with checkAttend's bound (2e-6 of Σ|p_j|·(‖v_j‖ +
// ‖v_j‖∞), the rounding onto out, and 4·max|p_i|·‖v̂_i‖/254 per row over
// the 31 rows around it).

// breakWeights are attention-weight generators for n rows.
var breakWeights = map[string]func(rng *rand.Rand, p []float32){
	"uniform": func(rng *rand.Rand, p []float32) {
		for i := range p {
			p[i] = float32(rng.Float64())
		}
	},
	"softmax": func(rng *rand.Rand, p []float32) { // exp(s − max s), s ~ N(0, 5²)
		m := math.Inf(-1)
		s := make([]float64, len(p))
		for i := range s {
			s[i] = 5 * rng.NormFloat64()
			m = max(m, s[i])
		}
		for i := range p {
			p[i] = float32(math.Exp(s[i] - m))
		}
	},
	"peaked": func(rng *rand.Rand, p []float32) {
		for i := range p {
			p[i] = 1e-6
		}
		p[rng.IntN(len(p))] = 1
	},
	"zero": func(rng *rand.Rand, p []float32) { clear(p) },
	"huge": func(rng *rand.Rand, p []float32) {
		for i := range p {
			p[i] = float32(1e25 * rng.Float64())
		}
	},
	"signed": func(rng *rand.Rand, p []float32) {
		for i := range p {
			p[i] = float32(rng.NormFloat64())
		}
	},
}

func checkAccumW(t *testing.T, c runtime.KVCache, ka runtime.KVAttender, l Layer, n, nq int, rng *rand.Rand, gen func(*rand.Rand, []float32), zeroBase bool, extra ...[2]int) {
	t.Helper()
	hd := l.HeadDim
	scratch := make([]float32, ka.AttendScratch(0, nq))
	kr, vr := make([]float32, n*hd), make([]float32, n*hd)
	rw := c.(*cache).roundsWeights(0, nq)
	for h := 0; h < l.NumKVHeads; h++ {
		c.Read(0, h, n, kr, vr)
		vmag := make([]float64, n)
		valueMags(vmag, vr, hd)
		for _, r := range append([][2]int{{0, n}, {3, n - 2}, {n - 40, n}}, extra...) {
			p0, p1 := r[0], r[1]
			w := p1 - p0
			ldp, ldo := w+2, hd+1
			p := make([]float32, nq*ldp)
			for i := 0; i < nq; i++ {
				gen(rng, p[i*ldp:i*ldp+w])
			}
			out := make([]float32, nq*ldo)
			if !zeroBase {
				for i := range out {
					out[i] = float32(rng.NormFloat64())
				}
			}
			base := append([]float32(nil), out...)
			ka.AccumV(0, h, p0, p1, nq, p, ldp, out, ldo, scratch)
			for i := 0; i < nq; i++ {
				var q8v float64
				if rw {
					q8v = q8WeightBound(p[i*ldp:i*ldp+w], vmag[p0:p1])
				}
				for ch := 0; ch < hd; ch++ {
					ref, mag := float64(base[i*ldo+ch]), 0.0
					for j := p0; j < p1; j++ {
						pj := float64(p[i*ldp+j-p0])
						ref += pj * float64(vr[j*hd+ch])
						mag += math.Abs(pj) * vmag[j]
					}
					got := float64(out[i*ldo+ch])
					ulp := 0x1p-23 * math.Abs(got)
					if bound := 2e-6*mag + ulp + q8v + 1e-38; !(math.Abs(got-ref) <= bound) {
						t.Fatalf("head %d [%d,%d) nq %d (rounds weights %v): out[%d][%d] = %g, Read gives %g (bound %.3g)", h, p0, p1, nq, rw, i, ch, got, ref, bound)
					}
				}
			}
		}
	}
}

// TestBreakQ8AccumV runs checkAccumW over the 2-bit kinds at head_dim 64
// (New and pools, windows on and off), 1–3 query rows (groups of 4 take
// CodeAccumF16x4), breakWeights, onto random and zero outputs.
func TestBreakQ8AccumV(t *testing.T) {
	layers := []Layer{{NumKVHeads: 1, HeadDim: 64}}
	ran := false
	for name, c := range breakCaches(t, layers, 400) {
		cc, ok := c.(*cache)
		if !ok || !cc.roundsWeights(0, 1) {
			continue
		}
		ran = true
		t.Run(name, func(t *testing.T) {
			ka := c.(runtime.KVAttender)
			rng := rand.New(rand.NewPCG(64, 8))
			breakFill(c, layers[0], rng, 301)
			for _, nq := range []int{1, 2, 3} {
				for _, wn := range slices.Sorted(maps.Keys(breakWeights)) {
					gen := breakWeights[wn]
					for _, zb := range []bool{false, true} {
						t.Run(fmt.Sprintf("nq%d/%s/zerobase%v", nq, wn, zb), func(t *testing.T) {
							checkAccumW(t, c, ka, layers[0], 301, nq, rng, gen, zb)
						})
					}
				}
			}
		})
	}
	if !ran {
		t.Skip("no cache rounds the value weights on this CPU")
	}
}

// TestBreakQ8AccumNonFinite checks AccumV with a NaN or infinite weight
// gives NaN/Inf where the float path (codeQ8 off) does.
func TestBreakQ8AccumNonFinite(t *testing.T) {
	layers := []Layer{{NumKVHeads: 1, HeadDim: 64}}
	c, err := New("quarot2", layers, 400, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.(*cache).roundsWeights(0, 1) {
		t.Skip("no int8 value weights on this CPU")
	}
	ka := c.(runtime.KVAttender)
	rng := rand.New(rand.NewPCG(1, 3))
	n := 64
	breakFill(c, layers[0], rng, n)
	for cn, v := range map[string]float32{"nan": float32(math.NaN()), "inf": float32(math.Inf(1))} {
		for _, at := range []int{0, 5, 15, 17, 63} {
			t.Run(fmt.Sprintf("%s/at%d", cn, at), func(t *testing.T) {
				p := make([]float32, n)
				for i := range p {
					p[i] = float32(rng.Float64())
				}
				p[at] = v
				acc := func(q8 bool) []float32 {
					defer func(v bool) { codeQ8 = v }(codeQ8)
					codeQ8 = q8
					out := make([]float32, 64)
					ka.AccumV(0, 0, 0, n, 1, p, n, out, 64, make([]float32, ka.AttendScratch(0, 1)))
					return out
				}
				ref, got := acc(false), acc(true)
				for ch := range ref {
					rn, gn := math.IsNaN(float64(ref[ch])), math.IsNaN(float64(got[ch]))
					ri, gi := math.IsInf(float64(ref[ch]), 0), math.IsInf(float64(got[ch]), 0)
					if rn != gn || (ri || rn) != (gi || gn) {
						t.Fatalf("out[%d]: int8 weights %g, float path %g", ch, got[ch], ref[ch])
					}
				}
			})
		}
	}
}
