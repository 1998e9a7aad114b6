package calibrate

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime"
)

// StatHeads is the Header.Statistics name of the per-(layer, KV group)
// head-importance proxy (tensors HeadProxyTensorName(l)).
//
// The proxy is cheap: for GQA group g of layer l (KV head g and its
// G = num_heads/num_key_value_heads query heads g·G .. g·G+G−1), it is the
// mean over calibration tokens of the squared ℓ2 norm of the group's
// attention output at the o_proj input,
//
//	proxy[l][g] = (1/T) Σ_t Σ_{h in group g} ‖att_t,h‖²    (float64, ≥ 0)
//
// A group whose output is small contributes little to the residual stream
// before o_proj mixes it, so it is a candidate for removal. It is a
// stand-in for Putri's masked-perplexity score (arXiv 2605.18331; docs
// docs/METHODS.md §6), which `lmpack prune --head-method putri` computes at
// prune time from the calibration token ids (StatTokens), because it is
// iterative: the scores of a round depend on the groups removed before.
const StatHeads = "heads"

// HeadProxyTensorName returns the tensor of layer's head proxy, e.g.
// "heads.layers.3.proxy": F64 [num_key_value_heads of the layer].
func HeadProxyTensorName(layer int) string {
	return StatHeads + ".layers." + strconv.Itoa(layer) + ".proxy"
}

// headAcc is the runtime.AttnOutputObserver summing each group's squared
// attention output.
type headAcc struct {
	layers []headLayerAcc
}

type headLayerAcc struct {
	nh, nkv, hd int
	tokens      int64
	sum         []float64 // [nkv]
}

func newHeadAcc(layers []arch.Layer) *headAcc {
	a := &headAcc{layers: make([]headLayerAcc, len(layers))}
	for i, l := range layers {
		a.layers[i] = headLayerAcc{nh: l.NumHeads, nkv: l.NumKVHeads, hd: l.HeadDim, sum: make([]float64, l.NumKVHeads)}
	}
	return a
}

// AttnOutput implements runtime.AttnOutputObserver.
func (a *headAcc) AttnOutput(layer, pos, n int, att []float32) {
	la := &a.layers[layer]
	qdim := la.nh * la.hd
	w := la.nh / la.nkv * la.hd // columns per group
	for t := 0; t < n; t++ {
		row := att[t*qdim : (t+1)*qdim]
		for g := 0; g < la.nkv; g++ {
			var s float64
			for _, v := range row[g*w : (g+1)*w] {
				s += float64(v) * float64(v)
			}
			la.sum[g] += s
		}
	}
	la.tokens += int64(n)
}

// result returns proxy[l][g] (means over tokens). Errors: a non-finite
// value (the forward pass overflowed), naming the layer.
func (a *headAcc) result() ([][]float64, error) {
	out := make([][]float64, len(a.layers))
	for l := range a.layers {
		la := &a.layers[l]
		out[l] = make([]float64, la.nkv)
		for g, s := range la.sum {
			if la.tokens > 0 {
				out[l][g] = s / float64(la.tokens)
			}
		}
		if i := firstNonFinite(out[l]); i >= 0 {
			return nil, fmt.Errorf("calibrate: head proxy of layer %d group %d is %v", l, i, out[l][i])
		}
	}
	return out, nil
}

// all3 combines the pass-1 observers.
type all3 struct {
	*oscarAcc
	*simObserver
	*headAcc
}

// Stats are the statistics CollectStats computes.
type Stats struct {
	// OSCAR has one entry per layer (CollectOSCAR).
	OSCAR []OSCARLayer
	// Similarity is the [(L+1)*(L+1)] block-similarity matrix (Collect).
	Similarity []float64
	// HeadProxy is [L][num_key_value_heads of layer l], see StatHeads.
	HeadProxy [][]float64
}

// CollectStats is Collect that also accumulates, during the first pass, the
// head proxy of StatHeads (no extra forward pass). Errors: those of
// Collect, and a non-finite head proxy.
func CollectStats(ctx context.Context, m runtime.Model, windows [][]int, progress func(done, total int)) (*Stats, error) {
	heads := newHeadAcc(m.Description().Layers)
	layers, sim, err := collect(ctx, m, windows, progress, true, heads)
	if err != nil {
		return nil, err
	}
	hp, err := heads.result()
	if err != nil {
		return nil, err
	}
	return &Stats{OSCAR: layers, Similarity: sim, HeadProxy: hp}, nil
}

// headTensors encodes c.HeadProxy. Errors: an empty layer, a negative or
// non-finite value (ErrBadStatistic, naming the tensor).
func headTensors(path string, hp [][]float64) ([]safetensors.WriteTensor, error) {
	var ts []safetensors.WriteTensor
	for l, v := range hp {
		name := HeadProxyTensorName(l)
		if len(v) == 0 {
			return nil, fmt.Errorf("calibrate: %s: tensor %q: no KV groups: %w", path, name, ErrBadStatistic)
		}
		if err := checkProxy(path, name, v); err != nil {
			return nil, err
		}
		ts = append(ts, safetensors.WriteTensor{Name: name, DType: safetensors.F64, Shape: []int{len(v)}, Data: f64Bytes(v)})
	}
	return ts, nil
}

func checkProxy(path, name string, v []float64) error {
	for g, x := range v {
		if firstNonFinite(v[g:g+1]) >= 0 || x < 0 {
			return fmt.Errorf("calibrate: %s: tensor %q: group %d is %v, want finite and >= 0: %w", path, name, g, x, ErrBadStatistic)
		}
	}
	return nil
}

// readHeads reads every layer's head proxy: F64 [num_key_value_heads]
// (from d when not nil; any length >= 1 otherwise), finite, >= 0; the
// layers run 0..L−1 without gaps (L from d when not nil).
func readHeads(f *safetensors.File, path string, d *arch.Description) ([][]float64, error) {
	n := 0
	for _, ti := range f.Tensors() {
		var l int
		if _, err := fmt.Sscanf(ti.Name, StatHeads+".layers.%d.proxy", &l); err == nil && ti.Name == HeadProxyTensorName(l) {
			n = max(n, l+1)
		}
	}
	if n > len(f.Tensors()) {
		return nil, fmt.Errorf("calibrate: %s: %q tensors name layer %d but the file holds only %d tensors: %w", path, StatHeads, n-1, len(f.Tensors()), ErrBadStatistic)
	}
	if d != nil && n != len(d.Layers) {
		return nil, fmt.Errorf("calibrate: %s: %q statistics for %d layers, the model has %d: %w", path, StatHeads, n, len(d.Layers), ErrBadStatistic)
	}
	if n == 0 {
		return nil, fmt.Errorf("calibrate: %s: statistics list %q but the file has no %q tensor: %w", path, StatHeads, HeadProxyTensorName(0), ErrBadStatistic)
	}
	out := make([][]float64, n)
	for l := range out {
		name := HeadProxyTensorName(l)
		t, err := f.Tensor(name)
		if err != nil {
			return nil, fmt.Errorf("calibrate: %w: %w", err, ErrBadStatistic)
		}
		want := -1
		if d != nil {
			want = d.Layers[l].NumKVHeads
		}
		if t.DType != safetensors.F64 || len(t.Shape) != 1 || t.Shape[0] < 1 || (want > 0 && t.Shape[0] != want) {
			return nil, fmt.Errorf("calibrate: %s: tensor %q: %s %v, want F64 [%d] (num_key_value_heads of layer %d): %w", path, name, t.DType, t.Shape, want, l, ErrBadStatistic)
		}
		v := make([]float64, t.Shape[0])
		for i := range v {
			v[i] = f64At(t.Data, i)
		}
		if err := checkProxy(path, name, v); err != nil {
			return nil, err
		}
		out[l] = v
	}
	return out, nil
}

// f64At decodes the i-th little-endian float64 of b.
func f64At(b []byte, i int) float64 {
	return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
}
