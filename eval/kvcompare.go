package eval

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/lmpack/lmpack/runtime"
)

// KVMethod is one KV-cache configuration to compare: a display name and a
// constructor for an empty cache holding capacity tokens.
type KVMethod struct {
	Name string
	New  func(capacity int) (runtime.KVCache, error)
}

// BitsPerElementer is the optional ability of a cache to report its
// storage cost in bits per cached K/V element, scales, zero-points and
// fp16 windows included.
type BitsPerElementer interface {
	BitsPerElement() float64
}

// KVCompareOptions configures CompareKV.
type KVCompareOptions struct {
	// Ctx is the window length in tokens (>= 2); MaxWindows stops after K
	// windows (0: all).
	Ctx, MaxWindows int
	// Buckets are the position-bucket starts for the long-context view,
	// ascending from 0; nil means 0, 64, 256, 512, 1024, … up to Ctx.
	Buckets []int
	// Progress, when set, is called after each window.
	Progress func(done, total int)
}

// Bucket is the agreement with the fp32 reference over query positions
// [From, To) of every window.
type Bucket struct {
	From          int     `json:"from"`
	To            int     `json:"to"`
	Positions     int     `json:"positions"`
	KL            float64 `json:"kl"`
	Top1Agreement float64 `json:"top1_agreement"`
}

// KVRow is one method's line of the comparison. KL is the mean KL
// divergence KL(p_fp32 ‖ p_method) of the next-token distribution in nats
// over scored positions; Top1Agreement the fraction of positions whose
// argmax equals fp32's; DeltaPPL = Perplexity − the fp32 reference's.
// KVBytes is Bytes() of the cache holding one full window (Ctx tokens);
// BitsPerElement comes from the cache (BitsPerElementer) or from KVBytes.
type KVRow struct {
	KV              string   `json:"kv"`
	BitsPerElement  float64  `json:"bits_per_element"`
	KVBytes         int64    `json:"kv_bytes"`
	Perplexity      float64  `json:"perplexity"`
	DeltaPPL        float64  `json:"delta_ppl"`
	KL              float64  `json:"kl"`
	Top1Agreement   float64  `json:"top1_agreement"`
	TokensPerSecond float64  `json:"tokens_per_second"`
	Buckets         []Bucket `json:"buckets"`
}

// KVReport is the outcome of CompareKV: one row per method, in order.
type KVReport struct {
	Ctx          int     `json:"ctx"`
	Windows      int     `json:"windows"`
	TokensScored int     `json:"tokens_scored"`
	Rows         []KVRow `json:"rows"`
	// Layers, when set, holds per-layer teacher-forced errors
	// (KVLayerErrors) on the first window.
	Layers *KVLayerReport `json:"layers,omitempty"`
}

// CompareKV runs every window once with the reference float32 cache
// (m.NewCache) and once with each method, and scores each method as in
// Perplexity plus its KL divergence and top-1 agreement against the
// reference at every scored position. Statistics accumulate in float64.
//
// Errors: Ctx < 2, ErrTooShort, a method's constructor or forward error,
// ErrNonFinite, ctx cancelled.
func CompareKV(ctx context.Context, m runtime.Model, ids []int, methods []KVMethod, opt KVCompareOptions) (*KVReport, error) {
	n, err := windowCount(len(ids), opt.Ctx, opt.MaxWindows)
	if err != nil {
		return nil, err
	}
	buckets := opt.Buckets
	if buckets == nil {
		buckets = []int{0, 64, 256}
		for b := 512; b < opt.Ctx; b *= 2 {
			buckets = append(buckets, b)
		}
	}
	V := m.Description().VocabSize
	T := opt.Ctx
	ref := make([]float32, T*V)
	got := make([]float32, T*V)
	refCache := m.NewCache(T)
	caches := make([]runtime.KVCache, len(methods))
	for i, meth := range methods {
		c, err := meth.New(T)
		if err != nil {
			return nil, fmt.Errorf("eval: kv %s: %w", meth.Name, err)
		}
		caches[i] = c
	}
	type acc struct {
		nll, kl  float64
		top1     int
		seconds  float64
		bytes    int64
		bits     float64
		bKL      []float64
		bTop1, n []int
	}
	accs := make([]acc, len(methods))
	for i := range accs {
		accs[i].bKL = make([]float64, len(buckets))
		accs[i].bTop1 = make([]int, len(buckets))
		accs[i].n = make([]int, len(buckets))
	}
	var refNLL float64
	refArg := make([]int, T)
	refLogP := make([]float64, V)
	for w := 0; w < n; w++ {
		win := ids[w*T : (w+1)*T]
		refCache.Truncate(0)
		if err := m.Forward(ctx, win, refCache, ref, true); err != nil {
			return nil, fmt.Errorf("eval: window %d (fp32 reference): %w", w, err)
		}
		for t := 0; t+1 < T; t++ {
			nll := NLL(ref[t*V:(t+1)*V], win[t+1])
			if math.IsNaN(nll) || math.IsInf(nll, 0) {
				return nil, fmt.Errorf("eval: window %d position %d (fp32 reference): %w", w, t, ErrNonFinite)
			}
			refNLL += nll
			refArg[t] = runtime.Argmax(ref[t*V : (t+1)*V])
		}
		for i, meth := range methods {
			c := caches[i]
			c.Truncate(0)
			t0 := time.Now()
			if err := m.Forward(ctx, win, c, got, true); err != nil {
				return nil, fmt.Errorf("eval: window %d kv %s: %w", w, meth.Name, err)
			}
			a := &accs[i]
			a.seconds += time.Since(t0).Seconds()
			a.bytes = c.Bytes()
			if b, ok := c.(BitsPerElementer); ok {
				a.bits = b.BitsPerElement()
			}
			bi := 0
			for t := 0; t+1 < T; t++ {
				row := got[t*V : (t+1)*V]
				nll := NLL(row, win[t+1])
				if math.IsNaN(nll) || math.IsInf(nll, 0) {
					return nil, fmt.Errorf("eval: window %d position %d kv %s: %w", w, t, meth.Name, ErrNonFinite)
				}
				a.nll += nll
				LogSoftmax(ref[t*V:(t+1)*V], refLogP)
				kl := klFromLogP(refLogP, row)
				a.kl += kl
				agree := runtime.Argmax(row) == refArg[t]
				if agree {
					a.top1++
				}
				for bi+1 < len(buckets) && t >= buckets[bi+1] {
					bi++
				}
				a.bKL[bi] += kl
				a.n[bi]++
				if agree {
					a.bTop1[bi]++
				}
			}
		}
		if opt.Progress != nil {
			opt.Progress(w+1, n)
		}
	}
	scored := n * (T - 1)
	refPPL := math.Exp(refNLL / float64(scored))
	rep := &KVReport{Ctx: T, Windows: n, TokensScored: scored}
	var kvElems int64
	for i := range m.Description().Layers {
		kvElems += 2 * int64(T) * int64(m.Description().Layers[i].KVDim())
	}
	for i, meth := range methods {
		a := &accs[i]
		r := KVRow{KV: meth.Name, KVBytes: a.bytes, BitsPerElement: a.bits,
			Perplexity:    math.Exp(a.nll / float64(scored)),
			KL:            a.kl / float64(scored),
			Top1Agreement: float64(a.top1) / float64(scored)}
		if r.BitsPerElement == 0 && kvElems > 0 {
			r.BitsPerElement = float64(a.bytes) * 8 / float64(kvElems)
		}
		r.DeltaPPL = r.Perplexity - refPPL
		if a.seconds > 0 {
			r.TokensPerSecond = float64(n*T) / a.seconds
		}
		for b := range buckets {
			to := T - 1
			if b+1 < len(buckets) {
				to = min(buckets[b+1], T-1)
			}
			if a.n[b] == 0 {
				continue
			}
			r.Buckets = append(r.Buckets, Bucket{From: buckets[b], To: to, Positions: a.n[b],
				KL: a.bKL[b] / float64(a.n[b]), Top1Agreement: float64(a.bTop1[b]) / float64(a.n[b])})
		}
		rep.Rows = append(rep.Rows, r)
	}
	return rep, nil
}

// LogSoftmax writes log softmax(logits) into out, in float64 with the
// maximum subtracted first: logits [V] float32, out [V] float64 (len(out)
// >= len(logits)); out[i] = logits[i] − log Σ_j exp(logits[j]) in nats.
func LogSoftmax(logits []float32, out []float64) {
	mx := math.Inf(-1)
	for _, l := range logits {
		mx = math.Max(mx, float64(l))
	}
	var s float64
	for _, l := range logits {
		s += math.Exp(float64(l) - mx)
	}
	lse := mx + math.Log(s)
	for i, l := range logits {
		out[i] = float64(l) - lse
	}
}

// klFromLogP returns KL(p ‖ q) in nats for reference log-probabilities
// logP and the logits of q, computed in float64.
func klFromLogP(logP []float64, qLogits []float32) float64 {
	mx := math.Inf(-1)
	for _, l := range qLogits {
		mx = math.Max(mx, float64(l))
	}
	var s float64
	for _, l := range qLogits {
		s += math.Exp(float64(l) - mx)
	}
	lse := mx + math.Log(s)
	var kl float64
	for i, lp := range logP {
		if p := math.Exp(lp); p > 0 {
			kl += p * (lp - (float64(qLogits[i]) - lse))
		}
	}
	return math.Max(kl, 0)
}
