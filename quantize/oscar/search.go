package oscar

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/lmpack/lmpack/quantize/alloc"
	"github.com/lmpack/lmpack/quantize/kvq"
	lmrt "github.com/lmpack/lmpack/runtime"
)

// ClipGrid is the grid of clipping ratios --clip-search tries for every
// layer, side (K, V) and width of 2 and 4 bits. At 8 bits the search
// measures ratio 1 (and a given --clip-k8/--clip-v8) only: the rounding
// step is 1/255 of the row's range, and on tiny1m-hf and qwen3moe-2m-hf
// the full grid kept 1 for every layer and side.
var ClipGrid = []float64{1, 0.99, 0.98, 0.96, 0.94, 0.92, 0.90, 0.85}

// DefaultSearchTokens is KVOptions.SearchTokens when it is 0: the number
// of calibration tokens on which the search measures the KL.
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

// layerData is one layer's captured activations of one calibration
// window: q [T, nh*hd], k and v [T, nkv*hd], float32.
type layerData struct {
	nh, nkv, hd int
	// window is the layer's sliding window (arch.Layer.SlidingWindow, the
	// query included; 0: full causal attention).
	window  int
	q, k, v []float32
}

// errTable holds the measured errors of one layer: err[side][width
// index][clip index] the KL of the final logits, attn the
// attention-output error, side 0 = K, 1 = V, widths Widths, clips the
// ratios measured (ClipGrid with the default, or one ratio).
type errTable struct {
	err   [2][][]float64   // mean KL of the final logits per token (nats)
	win   [2][][][]float64 // per calibration window: its mean KL per token
	attn  [2][][]float64   // mean attention-output error per token
	clips [2][][]float64   // the ratio of each entry
}

// attnWindows gives the served semantics of the measurement, the
// runtime's (runtime/kvcache doc.go, kvcache.ReadAt): a query at position
// t (decoding, the cache holding positions [0, t)) reads its own key and
// value fresh (float32), keys j < sink and those of the recent window,
// which counts back from the query itself (t + 1 − recent ≤ j < t: the
// recent − 1 newest cached ones), from the fp16 windows (taken as exact),
// and the others quantized.
type attnWindows struct{ sink, recent int }

func (w attnWindows) quantized(j, t int) bool { return j >= w.sink && j < t && j < t+1-w.recent }

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

// attnServed returns the attention output of the window as served, in
// the o_proj input layout ([T, num_heads*head_dim] float32, query head h
// in columns [h*hd, (h+1)*hd)): causal softmax(q·K̂ᵀ/√d)·V̂ in float64,
// with the windows w deciding which keys and values are read quantized
// (kq, vq) and which exact (k, v; a query's own token always exact). GQA:
// query head h reads KV head h/(nh/nkv). It also returns Σ over the
// window's queries and query heads of ‖softmax(q·Kᵀ/√d)·V −
// softmax(q·K̂ᵀ/√d)·V̂‖² (float64), the attention-output error.
func attnServed(ld *layerData, kq, vq []float32, w attnWindows) ([]float32, float64) {
	q, k, v := ld.q, ld.k, ld.v
	hd, nh, nkv := ld.hd, ld.nh, ld.nkv
	T := len(k) / (nkv * hd)
	g := nh / nkv
	scale := 1 / math.Sqrt(float64(hd))
	p, ph := make([]float64, T), make([]float64, T)
	o, oh := make([]float64, hd), make([]float64, hd)
	out := make([]float32, T*nh*hd)
	var sum float64
	for t := 0; t < T; t++ {
		lo := 0 // the first key the query sees (a sliding window hides older ones)
		if ld.window > 0 {
			lo = max(0, t-ld.window+1)
		}
		for h := 0; h < nh; h++ {
			kh := h / g
			qr := q[t*nh*hd+h*hd : t*nh*hd+(h+1)*hd]
			mx, mxh := math.Inf(-1), math.Inf(-1)
			for j := lo; j <= t; j++ {
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
			for j := lo; j <= t; j++ {
				p[j], ph[j] = math.Exp(p[j]-mx), math.Exp(ph[j]-mxh)
				z, zh = z+p[j], zh+ph[j]
			}
			clear(o)
			clear(oh)
			for j := lo; j <= t; j++ {
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
			dst := out[t*nh*hd+h*hd : t*nh*hd+(h+1)*hd]
			for i := 0; i < hd; i++ {
				d := o[i] - oh[i]
				sum += d * d
				dst[i] = float32(oh[i])
			}
		}
	}
	return out, sum
}

// scorer scores a layer's candidate attention output end to end.
type scorer interface {
	// score returns Σ over the positions of calibration window win of
	// KL(p ‖ q) in nats (float64): p the model's next-token distribution,
	// q the same with layer l's attention output (the o_proj input)
	// replaced by att ([T, num_heads*head_dim]), every other layer exact.
	score(l, win int, att []float32) (float64, error)
}

// measure adds window win's share to et, the error table of layer l: for
// each side, width and clip ratio in clips[side][width index], that side
// alone is quantized (fakeQuant), the layer's attention output recomputed
// as served (attnServed) and scored by sc (the KL of the final logits,
// into et.err) and by the attention-output error (into et.attn); both are
// sums over the window's positions (measureAll divides by the tokens).
func measure(et *errTable, ld *layerData, l, win int, rk, rv []float32, clips [2][][]float64, w attnWindows, sc scorer) error {
	for side := 0; side < 2; side++ {
		r := rk
		if side == 1 {
			r = rv
		}
		if et.err[side] == nil {
			et.clips[side] = clips[side]
			et.err[side], et.attn[side], et.win[side] = make([][]float64, len(Widths)), make([][]float64, len(Widths)), make([][][]float64, len(Widths))
			for wi := range Widths {
				n := len(clips[side][wi])
				et.err[side][wi], et.attn[side][wi], et.win[side][wi] = make([]float64, n), make([]float64, n), make([][]float64, n)
			}
		}
		for wi, bits := range Widths {
			for ci, ratio := range clips[side][wi] {
				kq, vq := ld.k, ld.v
				if side == 0 {
					kq = fakeQuant(ld.k, ld.hd, r, ratio, bits)
				} else {
					vq = fakeQuant(ld.v, ld.hd, r, ratio, bits)
				}
				att, ae := attnServed(ld, kq, vq, w)
				kl, err := sc.score(l, win, att)
				if err != nil {
					return err
				}
				et.err[side][wi][ci] += kl
				et.win[side][wi][ci] = append(et.win[side][wi][ci], kl/float64(len(ld.k)/(ld.nkv*ld.hd)))
				et.attn[side][wi][ci] += ae
			}
		}
	}
	return nil
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

// SearchMargin is the number of standard errors by which a searched
// ratio's KL must beat the default ratio's for --clip-search to keep it.
const SearchMargin = 2

// pick returns the index of the ratio --clip-search keeps among the
// entries of e (mean KL per token) with per-window means win[entry]
// [window], ref being the default ratio's entry: the least mean (best)
// when its paired per-window differences from ref, d_w, have mean +
// SearchMargin·SE < 0 (SE = sample standard deviation of d_w / √n, n
// windows ≥ 2); ref otherwise, and always with one window (no noise
// estimate: e.g. --search-tokens below two windows) or when the least
// only ties ref. So a ratio that beats the default by less than the
// spread between calibration windows, which would not carry to other
// text, is not kept.
func pick(e []float64, win [][]float64, ref int) int {
	b := best(e)
	if b == ref || ref < 0 {
		return b
	}
	n := len(win[b])
	if n < 2 || !(e[b] < e[ref]) {
		return ref
	}
	var m, ss float64
	for w := range n {
		m += win[b][w] - win[ref][w]
	}
	m /= float64(n)
	for w := range n {
		d := win[b][w] - win[ref][w] - m
		ss += d * d
	}
	se := math.Sqrt(ss/float64(n-1)) / math.Sqrt(float64(n))
	if m+SearchMargin*se < 0 {
		return b
	}
	return ref
}

// replaceAttn is the observer of a scored forward pass: it overwrites
// layer's attention output with att ([T, num_heads*head_dim], the
// window's rows; runtime.AttnOutputObserver: o_proj reads what it
// leaves).
type replaceAttn struct {
	layer int
	att   []float32
}

// AttnOutput implements runtime.AttnOutputObserver.
func (r *replaceAttn) AttnOutput(layer, pos, n int, att []float32) {
	if layer != r.layer {
		return
	}
	w := len(att) / n
	copy(att, r.att[pos*w:(pos+n)*w])
}

// modelScorer is the scorer of measureAll: one window's reference
// log-probabilities ([T, vocab] float64, from the unquantized forward
// pass) and the model that reruns the window with one layer's attention
// output replaced (one Forward at a time: mu).
type modelScorer struct {
	mu     sync.Mutex
	ctx    context.Context
	m      lmrt.Model
	cache  lmrt.KVCache
	obs    *capture
	tokens []int
	win    int
	logP   []float64 // [T, vocab]
	logits []float32 // [T, vocab]
	vocab  int
}

// reference runs window win (tokens) unquantized with the QKV capture of
// obs, keeping its log-probabilities for score.
func (s *modelScorer) reference(win int, tokens []int) error {
	s.win, s.tokens = win, tokens
	s.obs.win = win
	n := len(tokens) * s.vocab
	if cap(s.logits) < n {
		s.logits, s.logP = make([]float32, n), make([]float64, n)
	}
	s.logits, s.logP = s.logits[:n], s.logP[:n]
	s.m.SetObserver(s.obs)
	s.cache.Truncate(0)
	err := s.m.Forward(s.ctx, tokens, s.cache, s.logits, true)
	s.m.SetObserver(nil)
	if err != nil {
		return fmt.Errorf("oscar: error search: calibration window %d: %w", win, err)
	}
	for t := range tokens {
		logSoftmax(s.logits[t*s.vocab:(t+1)*s.vocab], s.logP[t*s.vocab:(t+1)*s.vocab])
	}
	return nil
}

func (s *modelScorer) score(l, win int, att []float32) (float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if win != s.win {
		return 0, fmt.Errorf("oscar: error search: scoring window %d while window %d is loaded", win, s.win)
	}
	r := &replaceAttn{layer: l, att: att}
	s.m.SetObserver(r)
	s.cache.Truncate(0)
	err := s.m.Forward(s.ctx, s.tokens, s.cache, s.logits, true)
	s.m.SetObserver(nil)
	if err != nil {
		return 0, fmt.Errorf("oscar: error search: calibration window %d, layer %d: %w", win, l, err)
	}
	var kl float64
	for t := range s.tokens {
		kl += klLogits(s.logP[t*s.vocab:(t+1)*s.vocab], s.logits[t*s.vocab:(t+1)*s.vocab])
	}
	return kl, nil
}

// logSoftmax writes log softmax(x) into out (float64, maximum subtracted).
func logSoftmax(x []float32, out []float64) {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = max(mx, float64(v))
	}
	var z float64
	for _, v := range x {
		z += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(z)
	for i, v := range x {
		out[i] = float64(v) - lse
	}
}

// klLogits returns KL(p ‖ q) in nats (float64, ≥ 0) for reference
// log-probabilities logP and the logits of q.
func klLogits(logP []float64, q []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range q {
		mx = max(mx, float64(v))
	}
	var z float64
	for _, v := range q {
		z += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(z)
	var kl float64
	for i, lp := range logP {
		kl += math.Exp(lp) * (lp - (float64(q[i]) - lse))
	}
	return max(kl, 0)
}

// measureAll runs the calibration windows (at most maxTokens tokens, in
// window order) through m one window at a time: an unquantized forward
// pass captures every layer's q, k, v and the reference logits, then for
// every layer (on up to threads goroutines, the forward passes one at a
// time), side, width and ratio of clips(l) the window runs again with
// that layer's attention output as served with that side quantized
// (measure). It returns every layer's error table, its sums divided by
// the tokens (mean KL per token, mean attention-output error per token),
// and the tokens measured. Memory: one window's q, k, v of every layer and
// two [window, vocab] logit buffers.
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
	longest := 0
	for _, win := range wins {
		longest = max(longest, len(win))
	}
	obs := &capture{}
	obs.q, obs.k, obs.v = make([][][]float32, len(wins)), make([][][]float32, len(wins)), make([][][]float32, len(wins))
	sc := &modelScorer{ctx: ctx, m: m, cache: m.NewCache(longest), obs: obs, vocab: d.VocabSize}
	defer m.SetObserver(nil)
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	out := make([]errTable, L)
	rk, rv := make([][]float32, L), make([][]float32, L)
	for l := range L {
		rk[l], rv[l] = to32(rot[l].RK), to32(rot[l].RV)
	}
	for i, win := range wins {
		obs.q[i], obs.k[i], obs.v[i] = make([][]float32, L), make([][]float32, L), make([][]float32, L)
		if err := sc.reference(i, win); err != nil {
			return nil, 0, err
		}
		var wg sync.WaitGroup
		sem := make(chan struct{}, threads)
		errs := make([]error, L)
		for l := 0; l < L; l++ {
			ld := &layerData{nh: d.Layers[l].NumHeads, nkv: d.Layers[l].NumKVHeads, hd: d.Layers[l].HeadDim, window: d.Layers[l].SlidingWindow,
				q: obs.q[i][l], k: obs.k[i][l], v: obs.v[i][l]}
			wg.Add(1)
			sem <- struct{}{}
			go func(l int) {
				defer wg.Done()
				errs[l] = measure(&out[l], ld, l, i, rk[l], rv[l], clips(l), w, sc)
				<-sem
			}(l)
		}
		wg.Wait()
		obs.q[i], obs.k[i], obs.v[i] = nil, nil, nil
		for _, err := range errs {
			if err != nil {
				return nil, 0, err
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
	}
	for l := range out {
		for side := 0; side < 2; side++ {
			for wi := range out[l].err[side] {
				for ci := range out[l].err[side][wi] {
					out[l].err[side][wi][ci] /= float64(n)
					out[l].attn[side][wi][ci] /= float64(n)
				}
			}
		}
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
// Widths, the clip ratio chosen (or given), Error the measured KL at it
// (nats per token, mean over the calibration tokens of KL(p ‖ q), p the
// model's next-token distribution, q the same with this side alone
// quantized as served, every other side exact) and AttnError the
// attention-output error at it (mean over calibration tokens of
// ‖softmax(qKᵀ/√d)V − softmax(qK̂ᵀ/√d)V̂‖² summed over query heads; the
// objective before the KL, reported for comparison); Bits is the width
// --kv-bits chose (0 without).
type SideReport struct {
	Clip      []float64 `json:"clip"`
	Error     []float64 `json:"error"`
	AttnError []float64 `json:"attn_error"`
	Bits      int       `json:"bits,omitempty"`
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
// KL of the final logits, nats per token, which add across layers to
// first order).
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
	for wi, bits := range Widths {
		p.UniformBitsPerElement[fmt.Sprint(bits)] = float64(uniCost[wi]) / float64(sum(params))
	}
	p.Budget = alloc.BudgetForBPW(params, kvBits)
	plan, err := alloc.SolveDP(items, p.Budget, alloc.DPOptions{})
	if errors.Is(err, alloc.ErrInfeasible) {
		// The suggested budget is rounded up (a budget it names is feasible).
		// The fp16 windows are the only part of the floor that the windows
		// or the serving context change: without them only the budget can.
		hint := ""
		if sink+recent > 0 {
			hint = " (or smaller windows, or a longer serving context)"
		}
		return nil, fmt.Errorf("oscar: --kv-bits %g (quantize.kv.kv_bits in a recipe) is below the cheapest widths, every layer at 2 bits: %.4f bits/element at serving context %d with fp16 windows %d,%d; want --kv-bits ≥ %.4f%s: %w",
			kvBits, p.UniformBitsPerElement["2"], S, sink, recent, math.Ceil(p.UniformBitsPerElement["2"]*1e4)/1e4, hint, err)
	}
	if err != nil {
		return nil, fmt.Errorf("oscar: --kv-bits %g (%d bits) at serving context %d, windows %d,%d: %w", kvBits, p.Budget, S, sink, recent, err)
	}
	for l := range layers {
		p.BitsK, p.BitsV = append(p.BitsK, Widths[plan.Choice[2*l]]), append(p.BitsV, Widths[plan.Choice[2*l+1]])
	}
	p.Cost, p.Error, p.BitsPerElement = plan.Cost, plan.Error, plan.BitsPerWeight(params)
	return p, nil
}
