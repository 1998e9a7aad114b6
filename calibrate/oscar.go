package calibrate

import (
	"context"
	"fmt"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/runtime"
)

// CollectOSCAR computes the OSCAR key and value target covariances of every
// decoder layer of m over the token windows (docs/METHODS.md §1; arXiv
// 2605.17757; FutureMLS-Lab/OSCAR rotation/compute_kv_rotation.py, "qqt" and
// "sst"). Each window runs from position 0 in a fresh cache; ids must be in
// [0, vocab). The returned slice has one entry per layer.
//
// With T the total number of tokens, H_kv = num_key_value_heads, g the GQA
// group size, and for KV head h the post-RoPE queries Q_h of its g query
// heads, keys k_t and values v_t (after q/k norm), all float64:
//
//	C_Q,h = (1/(T·g)) Q_hᵀ Q_h                                 [d, d]
//	C_Q   = (1/H_kv) Σ_h C_Q,h
//	w_t,h = k_tᵀ C_Q k_t   (≥ 0; renormalised to mean 1 over t per head)
//	C_S   = (1/H_kv) Σ_h (1/T) Σ_t (w_t,h / mean_t w_t,h) v_t vᵀ_t
//	      = (1/H_kv) Σ_h (Σ_t w_t,h v_t v_tᵀ) / (Σ_t w_t,h)
//
// The weights use the layer's C_Q, as docs/METHODS.md §1 states: the
// rotation R_K = U(C_Q)·H·P_br is shared by every head, so the key error
// that matters is δkᵀ C_Q δk for every head alike. (The reference code
// weighs with each head's own C_Q,h; the two agree when H_kv = 1. On
// tiny1m-hf and qwen3moe-2m-hf the layer's C_Q gave the lower KL at
// sink 16 + recent 64: oscar2 0.00991 against 0.01120 and 0.00246
// against 0.00269.) A head whose weights sum to 0 (all its keys
// orthogonal to the queries) adds nothing to C_S.
//
// Two passes over the data, because the weights need C_Q,h from all T
// tokens: pass 1 accumulates Σ qqᵀ per KV head, pass 2 accumulates Σ w and
// Σ w v vᵀ per KV head; the last line of the formula above is how the
// renormalisation is done without storing any per-token value. Memory is
// O(L·H_kv·d²) float64 whatever T is; the upper triangles are accumulated
// and mirrored at the end. Unlike the reference, no warm-up chunk is
// skipped: every window starts at position 0 with real text.
//
// progress, when not nil, is called after each window with the tokens
// forwarded so far and the total, 2·T (both passes). The observer is
// removed from m before CollectOSCAR returns.
//
// Errors: no windows or an empty window, a Forward error (ctx cancelled,
// an id out of range, ...), and non-finite statistics (the forward pass
// overflowed), naming the layer.
func CollectOSCAR(ctx context.Context, m runtime.Model, windows [][]int, progress func(done, total int)) ([]OSCARLayer, error) {
	layers, _, err := collect(ctx, m, windows, progress, false, nil)
	return layers, err
}

// Collect is CollectOSCAR that also accumulates, during the first pass, the
// block-similarity statistic StatLoRP (see SimilarityTensor): it returns
// the OSCAR layers and the row-major [(L+1)*(L+1)] float64 matrix of mean
// cosine similarities between the inputs of blocks 0..L−1 and the
// final-norm input (state L), computed by depth.SimilarityAcc over every
// token of every window. The extra memory is (L+1) block activations of
// the longest window (float32), independent of the number of windows.
// Errors: those of CollectOSCAR, and depth errors (non-finite states).
func Collect(ctx context.Context, m runtime.Model, windows [][]int, progress func(done, total int)) ([]OSCARLayer, []float64, error) {
	return collect(ctx, m, windows, progress, true, nil)
}

// collect runs both OSCAR passes; withSim adds the similarity and heads,
// when not nil, the head proxy (both during pass 1).
func collect(ctx context.Context, m runtime.Model, windows [][]int, progress func(done, total int), withSim bool, heads *headAcc) ([]OSCARLayer, []float64, error) {
	d := m.Description()
	T, longest := 0, 0
	for i, w := range windows {
		if len(w) == 0 {
			return nil, nil, fmt.Errorf("calibrate: window %d is empty", i)
		}
		T += len(w)
		longest = max(longest, len(w))
	}
	if T == 0 {
		return nil, nil, fmt.Errorf("calibrate: no calibration windows")
	}
	acc := newOSCARAcc(d.Layers)
	var sim *simObserver
	if withSim {
		var err error
		if sim, err = newSimObserver(len(d.Layers), d.HiddenSize); err != nil {
			return nil, nil, err
		}
	}
	defer m.SetObserver(nil)
	if heads != nil && sim != nil {
		m.SetObserver(all3{acc, sim, heads})
	} else if sim != nil {
		m.SetObserver(both{acc, sim})
	} else {
		m.SetObserver(acc)
	}
	cache := m.NewCache(longest)
	logits := make([]float32, d.VocabSize)
	done := 0
	for pass := 1; pass <= 2; pass++ {
		acc.pass = pass
		for _, w := range windows {
			cache.Truncate(0)
			if err := m.Forward(ctx, w, cache, logits, false); err != nil {
				return nil, nil, fmt.Errorf("calibrate: OSCAR pass %d: %w", pass, err)
			}
			done += len(w)
			if progress != nil {
				progress(done, 2*T)
			}
		}
		if pass == 1 {
			if err := acc.finishPass1(T); err != nil {
				return nil, nil, err
			}
			if sim != nil {
				m.SetObserver(acc) // pass 2 needs only the QKV hook
			}
		}
	}
	layers, err := acc.result()
	if err != nil {
		return nil, nil, err
	}
	if sim == nil {
		return layers, nil, nil
	}
	if sim.err != nil {
		return nil, nil, sim.err
	}
	S, err := sim.acc.Matrix()
	if err != nil {
		return nil, nil, fmt.Errorf("calibrate: similarity: %w", err)
	}
	return layers, S, nil
}

// oscarAcc is the QKVObserver accumulating the OSCAR statistics.
type oscarAcc struct {
	pass   int
	layers []oscarLayerAcc
}

// oscarLayerAcc holds one layer's running sums; matrices are [H_kv][d*d]
// row-major (upper triangle while accumulating).
type oscarLayerAcc struct {
	d, nh, nkv int
	tokens     int
	qq         [][]float64 // pass 1: Σ_t Σ_{j in group h} q qᵀ
	cqh        [][]float64 // after pass 1: C_Q,h, full symmetric
	cq         []float64   // after pass 1: C_Q = mean_h C_Q,h, the weights' metric
	wvv        [][]float64 // pass 2: Σ_t w v vᵀ
	w          []float64   // pass 2: Σ_t w
	x, y       []float64   // [d] scratch
}

func newOSCARAcc(layers []arch.Layer) *oscarAcc {
	a := &oscarAcc{pass: 1, layers: make([]oscarLayerAcc, len(layers))}
	for i, l := range layers {
		la := &a.layers[i]
		la.d, la.nh, la.nkv = l.HeadDim, l.NumHeads, l.NumKVHeads
		la.qq, la.wvv = mats(l.NumKVHeads, l.HeadDim), mats(l.NumKVHeads, l.HeadDim)
		la.w = make([]float64, l.NumKVHeads)
		la.x, la.y = make([]float64, l.HeadDim), make([]float64, l.HeadDim)
	}
	return a
}

func mats(n, d int) [][]float64 {
	out := make([][]float64, n)
	for i := range out {
		out[i] = make([]float64, d*d)
	}
	return out
}

// QKV implements runtime.QKVObserver.
func (a *oscarAcc) QKV(layer, pos, n int, q, k, v []float32) {
	la := &a.layers[layer]
	d, g := la.d, la.nh/la.nkv
	qdim, kvdim := la.nh*d, la.nkv*d
	if a.pass == 1 {
		la.tokens += n
		for t := 0; t < n; t++ {
			for h := 0; h < la.nkv; h++ {
				for j := 0; j < g; j++ {
					off := t*qdim + (h*g+j)*d
					toF64(la.x, q[off:off+d])
					addOuterUpper(la.qq[h], 1, la.x, la.x)
				}
			}
		}
		return
	}
	for t := 0; t < n; t++ {
		for h := 0; h < la.nkv; h++ {
			off := t*kvdim + h*d
			toF64(la.x, k[off:off+d])
			w := quadForm(la.cq, la.x)
			la.w[h] += w
			toF64(la.y, v[off:off+d])
			addOuterUpper(la.wvv[h], w, la.y, la.y)
		}
	}
}

// finishPass1 turns the query sums into C_Q,h.
func (a *oscarAcc) finishPass1(T int) error {
	for i := range a.layers {
		la := &a.layers[i]
		if la.tokens != T {
			return fmt.Errorf("calibrate: layer %d: the observer saw %d tokens, want %d", i, la.tokens, T)
		}
		g := la.nh / la.nkv
		la.cqh = make([][]float64, la.nkv)
		la.cq = make([]float64, la.d*la.d)
		for h := range la.cqh {
			c := mirror(la.qq[h], la.d)
			scale(c, 1/float64(T*g))
			la.cqh[h] = c
			for j, x := range c {
				la.cq[j] += x / float64(la.nkv)
			}
		}
	}
	return nil
}

// result averages over KV heads and checks finiteness.
func (a *oscarAcc) result() ([]OSCARLayer, error) {
	out := make([]OSCARLayer, len(a.layers))
	for i := range a.layers {
		la := &a.layers[i]
		d := la.d
		cq, cs := make([]float64, d*d), make([]float64, d*d)
		for h := 0; h < la.nkv; h++ {
			for j, x := range la.cqh[h] {
				cq[j] += x
			}
			if la.w[h] > 0 {
				s := mirror(la.wvv[h], d)
				inv := 1 / la.w[h]
				for j, x := range s {
					cs[j] += x * inv
				}
			}
		}
		scale(cq, 1/float64(la.nkv))
		scale(cs, 1/float64(la.nkv))
		if j := firstNonFinite(cq); j >= 0 {
			return nil, fmt.Errorf("calibrate: layer %d: C_Q element %d is %v (the forward pass overflowed): %w", i, j, cq[j], ErrBadStatistic)
		}
		if j := firstNonFinite(cs); j >= 0 {
			return nil, fmt.Errorf("calibrate: layer %d: C_S element %d is %v (the forward pass overflowed): %w", i, j, cs[j], ErrBadStatistic)
		}
		out[i] = OSCARLayer{HeadDim: d, CQ: cq, CS: cs}
	}
	return out, nil
}

func toF64(dst []float64, src []float32) {
	for i, x := range src {
		dst[i] = float64(x)
	}
}

// addOuterUpper adds s·x yᵀ to the upper triangle (j >= i) of m [d, d].
func addOuterUpper(m []float64, s float64, x, y []float64) {
	d := len(x)
	for i, xi := range x {
		xi *= s
		row := m[i*d+i : i*d+d]
		for j, yj := range y[i:] {
			row[j] += xi * yj
		}
	}
}

// quadForm returns xᵀ C x for C [d, d].
func quadForm(c, x []float64) float64 {
	d := len(x)
	var s float64
	for i, xi := range x {
		row := c[i*d : i*d+d]
		var r float64
		for j, xj := range x {
			r += row[j] * xj
		}
		s += xi * r
	}
	return s
}

// mirror returns a full symmetric copy of the upper triangle of u [d, d].
func mirror(u []float64, d int) []float64 {
	m := make([]float64, d*d)
	for i := 0; i < d; i++ {
		for j := i; j < d; j++ {
			m[i*d+j], m[j*d+i] = u[i*d+j], u[i*d+j]
		}
	}
	return m
}

func scale(m []float64, s float64) {
	for i := range m {
		m[i] *= s
	}
}
