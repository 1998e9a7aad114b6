package gemq

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
)

// TestKLWeighting: on stories260K-moe-hf over 96 calibration tokens, the
// KL coefficients are finite and >= 0; an identity "quantizer" gives
// exactly 0 everywhere; and one coefficient recomputed independently
// (a fake-quantized float checkpoint written to disk, opened with the
// engine, KL of the softmaxes summed naively) matches.
func TestKLWeighting(t *testing.T) {
	ctx := context.Background()
	e, err := engine.Open(ctx, shared.Path(t, "stories260K-moe-hf"), engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ids, err := e.EvalIDs(shared.Path(t, "tinystories-valid", "calib.txt"), 64)
	if err != nil {
		t.Fatal(err)
	}
	windows, err := calibrate.Windows(ids, 96, 64)
	if err != nil {
		t.Fatal(err)
	}
	ident := func(w []float32, rows, cols, bits int) ([]float32, error) { return slices.Clone(w), nil }
	zero, err := Compute(ctx, e.Model, e.Checkpoint, windows, Options{Weighting: WeightKL, Quantizer: ident, Bits: []int{1, 4}, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range zero.Layers {
		for k, x := range l.Experts {
			if x.C[0] != 0 || x.C[1] != 0 {
				t.Errorf("identity quantizer: layer %d expert %d: c = %v, want 0", l.Layer, k, x.C)
			}
		}
	}
	c, err := Compute(ctx, e.Model, e.Checkpoint, windows, Options{Weighting: WeightKL, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if c.Weighting != WeightKL || c.Tokens != 96 || len(c.Layers) != 5 {
		t.Fatalf("weighting %s, %d tokens, %d layers", c.Weighting, c.Tokens, len(c.Layers))
	}
	var routed int64
	for _, l := range c.Layers {
		for k, x := range l.Experts {
			routed += x.Routed
			for bi, v := range x.C {
				if !(v > 0) || math.IsInf(v, 0) {
					t.Errorf("layer %d expert %d: c[%d bits] = %v", l.Layer, k, c.Bits[bi], v)
				}
			}
		}
	}
	if routed != 5*96*2 {
		t.Errorf("%d routed tokens over all layers, want 5·96·2", routed)
	}
	// Independent recomputation of c[layer 3, expert 1, 2 bits].
	a := &Allocation{Layers: []int{3}, Bits: [][]int{{0, 2, 0, 0}}} // 0: kept in float (writeFakeQuant)
	dir := writeFakeQuant(t, e, a)
	q, err := engine.Open(ctx, dir, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	V := e.Desc.VocabSize
	var kl float64
	for _, w := range windows {
		zp, zq := make([]float32, len(w)*V), make([]float32, len(w)*V)
		for _, mz := range []struct {
			e *engine.Engine
			z []float32
		}{{e, zp}, {q, zq}} {
			cache := mz.e.Model.NewCache(len(w))
			if err := mz.e.Model.Forward(ctx, w, cache, mz.z, true); err != nil {
				t.Fatal(err)
			}
		}
		for tk := range w {
			p, qq := softmax64(zp[tk*V:(tk+1)*V]), softmax64(zq[tk*V:(tk+1)*V])
			for i := range p {
				if p[i] > 0 {
					kl += p[i] * math.Log(p[i]/qq[i])
				}
			}
		}
	}
	kl /= 96
	if got := c.Layers[3].Experts[1].C[1]; math.Abs(got-kl) > 1e-9*kl {
		t.Errorf("c[layer 3, expert 1, 2 bits] = %.12g, independent KL %.12g", got, kl)
	}
}

func softmax64(z []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range z {
		mx = max(mx, float64(v))
	}
	p := make([]float64, len(z))
	var s float64
	for i, v := range z {
		p[i] = math.Exp(float64(v) - mx)
		s += p[i]
	}
	for i := range p {
		p[i] /= s
	}
	return p
}
