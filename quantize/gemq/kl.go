package gemq

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime"
)

// overlay is a runtime.TensorSource that serves replaced tensors (float32)
// before those of base.
type overlay struct {
	base runtime.TensorSource
	repl map[string]*safetensors.Tensor
}

func (o overlay) Tensor(name string) (*safetensors.Tensor, error) {
	if t, ok := o.repl[name]; ok {
		return t, nil
	}
	return o.base.Tensor(name)
}

// routeCounter is a RouterObserver counting routed tokens per layer and
// expert.
type routeCounter struct{ n map[int][]int64 }

func (r *routeCounter) RouterLogits(layer, pos, n int, logits []float32, sel []int32) {
	c := r.n[layer]
	for _, e := range sel {
		if int(e) < len(c) {
			c[e]++
		}
	}
}

// logSoftmaxRows turns each row of z [n, V] into log-probabilities, in
// float64.
func logSoftmaxRows(z []float32, n, V int) []float64 {
	out := make([]float64, n*V)
	for t := 0; t < n; t++ {
		eval.LogSoftmax(z[t*V:(t+1)*V], out[t*V:(t+1)*V])
	}
	return out
}

// computeKL is Compute for WeightKL: for every MoE layer l, expert e and
// width b it loads a copy of m (runtime.NewCPU, tensors from src with only
// expert e of layer l replaced by its fake-quantized weights) and
// records c[l,e,b] = (1/N) Σ_t KL(P_t ‖ Q_t), the mean over all N window
// positions of the KL divergence of the quantized model's next-token
// distribution Q_t from the float model's P_t (nats). Cost: L·E·|Bits|
// forward passes over the calibration windows; memory: the float model's
// log-probabilities, 8·N·vocab bytes, plus one model copy.
func computeKL(ctx context.Context, m runtime.Model, src runtime.TensorSource, windows [][]int, opt Options) (*Coefficients, error) {
	d := m.Description()
	V := d.VocabSize
	N, longest := 0, 0
	for i, w := range windows {
		if len(w) == 0 {
			return nil, fmt.Errorf("gemq: window %d is empty", i)
		}
		N += len(w)
		longest = max(longest, len(w))
	}
	if N == 0 {
		return nil, fmt.Errorf("gemq: no calibration windows")
	}
	cnt := &routeCounter{n: map[int][]int64{}}
	var layers []int
	for l := range d.Layers {
		if mo := d.Layers[l].MoE; mo != nil {
			layers = append(layers, l)
			cnt.n[l] = make([]int64, mo.NumExperts)
		}
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("gemq: the model (%s) has no MoE layer", d.Architecture)
	}
	logits := make([]float32, longest*V)
	run := func(mm runtime.Model, each func(w int, lp []float64)) error {
		cache := mm.NewCache(longest)
		for wi, w := range windows {
			cache.Truncate(0)
			if err := mm.Forward(ctx, w, cache, logits[:len(w)*V], true); err != nil {
				return fmt.Errorf("gemq: KL weighting: %w", err)
			}
			each(wi, logSoftmaxRows(logits[:len(w)*V], len(w), V))
		}
		return nil
	}
	ref := make([][]float64, len(windows))
	m.SetObserver(cnt)
	err := run(m, func(w int, lp []float64) { ref[w] = lp })
	m.SetObserver(nil)
	if err != nil {
		return nil, err
	}
	c := &Coefficients{Bits: slices.Clone(opt.Bits), Weighting: WeightKL, Tokens: N}
	for _, l := range layers {
		ex, err := LoadExperts(src, d, l)
		if err != nil {
			return nil, err
		}
		lc := LayerCoeffs{Layer: l}
		for e := range ex {
			x := &ex[e]
			ec := ExpertCoeffs{Params: x.Params(), Inter: x.Inter, Routed: cnt.n[l][e], C: make([]float64, len(opt.Bits))}
			names := d.Layers[l].MoE.Experts[e]
			for bi, b := range opt.Bits {
				q, err := FakeQuantize(x, b, opt.Quantizer)
				if err != nil {
					return nil, fmt.Errorf("gemq: layer %d expert %d: %w", l, e, err)
				}
				H := d.HiddenSize
				ov := overlay{base: src, repl: map[string]*safetensors.Tensor{
					names.Gate: {Name: names.Gate, DType: safetensors.F32, Shape: []int{x.Inter, H}, Data: safetensors.F32Bytes(q.Gate)},
					names.Up:   {Name: names.Up, DType: safetensors.F32, Shape: []int{x.Inter, H}, Data: safetensors.F32Bytes(q.Up)},
					names.Down: {Name: names.Down, DType: safetensors.F32, Shape: []int{H, x.Inter}, Data: safetensors.F32Bytes(q.Down)},
				}}
				mq, err := runtime.NewCPU().Load(ctx, d, ov, runtime.LoadOptions{Threads: opt.Threads})
				if err != nil {
					return nil, fmt.Errorf("gemq: layer %d expert %d at %d bits: %w", l, e, b, err)
				}
				var kl float64
				err = run(mq, func(w int, lq []float64) {
					lp := ref[w]
					for i, v := range lp {
						if v > -745 { // exp underflows to 0 below: no contribution
							kl += math.Exp(v) * (v - lq[i])
						}
					}
				})
				mq.Close()
				if err != nil {
					return nil, err
				}
				kl /= float64(N)
				if math.IsNaN(kl) || math.IsInf(kl, 0) {
					return nil, fmt.Errorf("gemq: layer %d expert %d at %d bits: KL %v", l, e, b, kl)
				}
				ec.C[bi] = max(kl, 0)
			}
			lc.Experts = append(lc.Experts, ec)
		}
		c.Layers = append(c.Layers, lc)
	}
	return c, nil
}
