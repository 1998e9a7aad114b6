package oscar

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/lmpack/lmpack/quantize/alloc"
	"github.com/lmpack/lmpack/quantize/kvq"
	lmrt "github.com/lmpack/lmpack/runtime"
)

// ClipGrid is the grid of clipping ratios --clip-search tries for every
// layer, side (K, V) and width.
var ClipGrid = []float64{1, 0.99, 0.98, 0.96, 0.94, 0.92, 0.90, 0.85}

// DefaultSearchTokens is KVOptions.SearchTokens when it is 0: the number
// of calibration tokens whose attention outputs the search measures.
const DefaultSearchTokens = 2048

// DefaultServingCtx is KVOptions.ServingCtx when it is 0: the context at
// which --kv-bits counts bits per element (fixed windows amortised).
const DefaultServingCtx = 32768

// capture is the QKV observer of the search: per window, per layer, the
// post-RoPE q ([T, num_heads*head_dim]), k and v ([T, kvDim]) float32.
type capture struct {
	win     int
	q, k, v [][][]float32 // [window][layer]
}

// QKV implements runtime.QKVObserver.
func (c *capture) QKV(layer, pos, n int, q, k, v []float32) {
	c.q[c.win][layer] = append(c.q[c.win][layer], q...)
	c.k[c.win][layer] = append(c.k[c.win][layer], k...)
	c.v[c.win][layer] = append(c.v[c.win][layer], v...)
}

// layerData is one layer's captured calibration activations.
type layerData struct {
	nh, nkv, hd int
	q, k, v     [][]float32 // [window] rows
}

// errTable holds the measured attention-output errors of one layer:
// err[side][width index][clip index], side 0 = K, 1 = V, widths Widths,
// clips the grid measured (ClipGrid, or one ratio).
type errTable struct {
	err   [2][][]float64
	clips [2][][]float64 // the ratio of each entry
}

// attnWindows gives the served semantics of the measurement: a query at
// position t (decoding, the cache holding positions [0, t)) reads its own
// key and value fresh (float32), keys j < sink and the newest recent
// ones (t − recent ≤ j < t) from the fp16 windows (taken as exact), and
// the others quantized.
type attnWindows struct{ sink, recent int }

func (w attnWindows) quantized(j, t int) bool { return j >= w.sink && j < t-w.recent }

// fakeQuant returns x ([T, kvDim], heads of hd) quantized as
// oscar's store does one side: per (token, head) row x·R, clipped at
// ratio (kvq.Clip, ratio < 1), asymmetric min-max at bits with fp16 scale
// and zero (kvq), dequantized and un-rotated (·Rᵀ), in float64 for the
// rotation.
func fakeQuant(x []float32, hd int, r []float32, ratio float64, bits int) []float32 {
	out := make([]float32, len(x))
	y := make([]float32, hd)
	codes := make([]byte, kvq.PackedLen(hd, bits))
	for row := 0; row < len(x)/hd; row++ {
		xr := x[row*hd : (row+1)*hd]
		for j := 0; j < hd; j++ {
			var s float64
			for i := 0; i < hd; i++ {
				s += float64(xr[i]) * float64(r[i*hd+j])
			}
			y[j] = float32(s)
		}
		if ratio > 0 && ratio < 1 {
			kvq.Clip(y, ratio)
		}
		lo, hi := kvq.MinMax(y)
		sc, z := kvq.AsymParamsF16(lo, hi, bits)
		kvq.EncodeAsym(codes, y, bits, sc, z)
		kvq.DecodeAsym(y, codes, bits, sc, z)
		o := out[row*hd : (row+1)*hd]
		for i := 0; i < hd; i++ {
			var s float64
			for j := 0; j < hd; j++ {
				s += float64(y[j]) * float64(r[i*hd+j])
			}
			o[i] = float32(s)
		}
	}
	return out
}

// attnError returns Σ over the window's queries and query heads of
// ‖softmax(q·Kᵀ/√d)·V − softmax(q·K̂ᵀ/√d)·V̂‖² (float64), causal, with the
// served windows w deciding which keys and values are read quantized (kq,
// vq) and which exact (k, v). GQA: query head h reads KV head h/(nh/nkv).
func attnError(ld *layerData, win int, kq, vq []float32, w attnWindows) float64 {
	q, k, v := ld.q[win], ld.k[win], ld.v[win]
	hd, nh, nkv := ld.hd, ld.nh, ld.nkv
	T := len(k) / (nkv * hd)
	g := nh / nkv
	scale := 1 / math.Sqrt(float64(hd))
	p, ph := make([]float64, T), make([]float64, T)
	o, oh := make([]float64, hd), make([]float64, hd)
	var sum float64
	for t := 0; t < T; t++ {
		for h := 0; h < nh; h++ {
			kh := h / g
			qr := q[t*nh*hd+h*hd : t*nh*hd+(h+1)*hd]
			mx, mxh := math.Inf(-1), math.Inf(-1)
			for j := 0; j <= t; j++ {
				off := j*nkv*hd + kh*hd
				kr, kqr := k[off:off+hd], k[off:off+hd]
				if w.quantized(j, t) {
					kqr = kq[off : off+hd]
				}
				var s, sh float64
				for i := 0; i < hd; i++ {
					s += float64(qr[i]) * float64(kr[i])
					sh += float64(qr[i]) * float64(kqr[i])
				}
				p[j], ph[j] = s*scale, sh*scale
				mx, mxh = max(mx, p[j]), max(mxh, ph[j])
			}
			var z, zh float64
			for j := 0; j <= t; j++ {
				p[j], ph[j] = math.Exp(p[j]-mx), math.Exp(ph[j]-mxh)
				z, zh = z+p[j], zh+ph[j]
			}
			clear(o)
			clear(oh)
			for j := 0; j <= t; j++ {
				off := j*nkv*hd + kh*hd
				vr, vqr := v[off:off+hd], v[off:off+hd]
				if w.quantized(j, t) {
					vqr = vq[off : off+hd]
				}
				a, ah := p[j]/z, ph[j]/zh
				for i := 0; i < hd; i++ {
					o[i] += a * float64(vr[i])
					oh[i] += ah * float64(vqr[i])
				}
			}
			for i := 0; i < hd; i++ {
				d := o[i] - oh[i]
				sum += d * d
			}
		}
	}
	return sum
}

// measure fills the error table of one layer: for each side, width and
// clip ratio in clips[side][width index], the mean over calibration
// tokens of the attention-output error (attnError summed over windows,
// divided by the tokens) when that side alone is quantized.
func measure(ld *layerData, rk, rv []float32, clips [2][][]float64, w attnWindows) errTable {
	var et errTable
	tokens := 0
	for _, k := range ld.k {
		tokens += len(k) / (ld.nkv * ld.hd)
	}
	for side := 0; side < 2; side++ {
		r := rk
		if side == 1 {
			r = rv
		}
		et.clips[side] = clips[side]
		et.err[side] = make([][]float64, len(Widths))
		for wi, bits := range Widths {
			et.err[side][wi] = make([]float64, len(clips[side][wi]))
			for ci, ratio := range clips[side][wi] {
				var s float64
				for win := range ld.k {
					kq, vq := ld.k[win], ld.v[win]
					if side == 0 {
						kq = fakeQuant(ld.k[win], ld.hd, r, ratio, bits)
					} else {
						vq = fakeQuant(ld.v[win], ld.hd, r, ratio, bits)
					}
					s += attnError(ld, win, kq, vq, w)
				}
				et.err[side][wi][ci] = s / float64(tokens)
			}
		}
	}
	return et
}

// best returns the index of the smallest error (the first on ties).
func best(e []float64) int {
	b := 0
	for i, x := range e {
		if x < e[b] {
			b = i
		}
	}
	return b
}

// measureAll runs the calibration windows (at most maxTokens tokens, in
// window order) through m, capturing every layer's q, k and v, and
// measures every layer's error table (measure) with clips(l) giving the
// ratios to try, on up to threads goroutines (one layer each).
func measureAll(ctx context.Context, m lmrt.Model, windows [][]int, maxTokens int, rot []Layer, clips func(l int) [2][][]float64, w attnWindows, threads int) ([]errTable, int, error) {
	d := m.Description()
	L := len(d.Layers)
	var wins [][]int
	n := 0
	for _, win := range windows {
		if n >= maxTokens {
			break
		}
		win = win[:min(len(win), maxTokens-n)]
		wins = append(wins, win)
		n += len(win)
	}
	c := &capture{}
	for range wins {
		c.q, c.k, c.v = append(c.q, make([][]float32, L)), append(c.k, make([][]float32, L)), append(c.v, make([][]float32, L))
	}
	m.SetObserver(c)
	defer m.SetObserver(nil)
	longest := 0
	for _, win := range wins {
		longest = max(longest, len(win))
	}
	cache := m.NewCache(longest)
	logits := make([]float32, d.VocabSize)
	for i, win := range wins {
		c.win = i
		cache.Truncate(0)
		if err := m.Forward(ctx, win, cache, logits, false); err != nil {
			return nil, 0, fmt.Errorf("oscar: error search: calibration window %d: %w", i, err)
		}
	}
	m.SetObserver(nil)
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	out := make([]errTable, L)
	var wg sync.WaitGroup
	sem := make(chan struct{}, threads)
	for l := 0; l < L; l++ {
		ld := &layerData{nh: d.Layers[l].NumHeads, nkv: d.Layers[l].NumKVHeads, hd: d.Layers[l].HeadDim}
		for i := range wins {
			ld.q, ld.k, ld.v = append(ld.q, c.q[i][l]), append(ld.k, c.k[i][l]), append(ld.v, c.v[i][l])
		}
		rk, rv := to32(rot[l].RK), to32(rot[l].RV)
		wg.Add(1)
		sem <- struct{}{}
		go func(l int) {
			defer wg.Done()
			out[l] = measure(ld, rk, rv, clips(l), w)
			<-sem
		}(l)
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	return out, n, nil
}

// to32 rounds a float64 rotation to the float32 the file and the cache
// hold.
func to32(r []float64) []float32 {
	f := make([]float32, len(r))
	for i, x := range r {
		f[i] = float32(x)
	}
	return f
}

// SideReport is one layer's K or V side in a KVSummary: per width of
// Widths, the clip ratio chosen (or given) and the measured
// attention-output error at it (mean over calibration tokens of
// ‖softmax(qKᵀ)V − softmax(qK̂ᵀ)V̂‖² summed over query heads, this side
// alone quantized); Bits is the width --kv-bits chose (0 without).
type SideReport struct {
	Clip  []float64 `json:"clip"`
	Error []float64 `json:"error"`
	Bits  int       `json:"bits,omitempty"`
}

// LayerReport is one layer's K and V sides.
type LayerReport struct {
	Layer int        `json:"layer"`
	K     SideReport `json:"k"`
	V     SideReport `json:"v"`
}

// sideCost returns the bits one side of layer ly stores at serving
// context S with fp16 windows sink+recent: the quantized tokens'
// codes (bits per element) and fp16 scale and zero per (token, head), the
// window tokens at 16 bits per element.
func sideCost(nkv, hd, bits, S, sink, recent int) int64 {
	win := min(S, sink+recent)
	nq := int64(S - win)
	return nq*int64(nkv)*int64(hd*bits+32) + int64(win)*int64(nkv*hd)*16
}

// WidthLayer is one layer of ChooseWidths: its num_key_value_heads and
// head_dim, and the error of its K and V side at each width of Widths
// (any non-negative unit, the same for every layer; QuantizeKV's measured
// attention-output errors).
type WidthLayer struct {
	NumKVHeads, HeadDim int
	ErrK, ErrV          [3]float64
}

// WidthPlan is ChooseWidths' result: the widths per layer, the cost and
// budget in bits at ServingCtx tokens, the achieved average bits per
// element (Cost / (2·ServingCtx·Σ kvDim), windows included), the summed
// error, and the same for every layer at one width (keys "2", "4", "8").
type WidthPlan struct {
	BitsK, BitsV          []int
	ServingCtx            int
	Cost, Budget          int64
	BitsPerElement, Error float64
	UniformError          map[string]float64
	UniformBitsPerElement map[string]float64
}

// ChooseWidths gives every layer's K and V a width of Widths minimising
// the summed error with the average bits per element at servingCtx tokens
// (0: DefaultServingCtx) at most kvBits, by exact DP (alloc.SolveDP) over
// the 2·layers items (layer × {K, V}). An item's cost is sideCost: the
// quantized tokens (servingCtx − sink − recent) at bits + 32/head_dim
// bits per element (asymmetric codes per (token, head) row, fp16 scale
// and zero), plus the fp16 windows at 16 bits, the same at every width
// (fixed window bytes amortised over servingCtx). The budget is
// ⌊kvBits · 2 · servingCtx · Σ kvDim⌋ bits (alloc.BudgetForBPW).
//
// Errors: alloc's ErrInvalid (no layers, NaN or negative errors) and
// ErrInfeasible (kvBits below the all-2-bit cost), wrapped with the
// budget.
func ChooseWidths(layers []WidthLayer, kvBits float64, servingCtx, sink, recent int) (*WidthPlan, error) {
	S := servingCtx
	if S == 0 {
		S = DefaultServingCtx
	}
	p := &WidthPlan{ServingCtx: S, UniformError: map[string]float64{}, UniformBitsPerElement: map[string]float64{}}
	var items []alloc.Item
	var params []int64
	uniCost := make([]int64, len(Widths))
	for l, ly := range layers {
		for side, e := range [2][3]float64{ly.ErrK, ly.ErrV} {
			it := alloc.Item{Name: fmt.Sprintf("layer %d %s", l, [2]string{"k", "v"}[side]), Group: -1}
			for wi, bits := range Widths {
				c := sideCost(ly.NumKVHeads, ly.HeadDim, bits, S, sink, recent)
				it.Options = append(it.Options, alloc.Option{Bits: float64(bits), Cost: c, Error: e[wi]})
				uniCost[wi] += c
				p.UniformError[fmt.Sprint(bits)] += e[wi]
			}
			items = append(items, it)
			params = append(params, int64(S)*int64(ly.NumKVHeads*ly.HeadDim))
		}
	}
	p.Budget = alloc.BudgetForBPW(params, kvBits)
	plan, err := alloc.SolveDP(items, p.Budget, alloc.DPOptions{})
	if err != nil {
		return nil, fmt.Errorf("oscar: --kv-bits %g (%d bits) at serving context %d, windows %d,%d: %w", kvBits, p.Budget, S, sink, recent, err)
	}
	for wi, bits := range Widths {
		p.UniformBitsPerElement[fmt.Sprint(bits)] = float64(uniCost[wi]) / float64(sum(params))
	}
	for l := range layers {
		p.BitsK, p.BitsV = append(p.BitsK, Widths[plan.Choice[2*l]]), append(p.BitsV, Widths[plan.Choice[2*l+1]])
	}
	p.Cost, p.Error, p.BitsPerElement = plan.Cost, plan.Error, plan.BitsPerWeight(params)
	return p, nil
}
