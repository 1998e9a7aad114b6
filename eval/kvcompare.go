package eval

import (
	"cmp"
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
	// Method is the cache kind (the plot's legend; rows of one kind with
	// different windows share its marker); "" means Name.
	Method string
	// BitsAt, when set, returns the cache's bits per element once it holds
	// ctx tokens (kvcache.BitsAt): the row's figure at the serving context.
	BitsAt func(ctx int) float64
	// Quantized, when set, returns how many of ctx tokens the cache holds
	// quantised (kvcache.QuantizedAt): under fake-quant, 0 at the
	// evaluated context marks the row "nothing quantised".
	Quantized func(ctx int) int
	// ReadAt, when set, returns what the query at position p of a call
	// that begins at c0 reads of the c0 cached tokens, in a cache of
	// capacity tokens (kvcache.ReadAt, averaged over layers): how many it
	// attends to (fewer than c0 under a sliding window), how many of those
	// it reads quantised, and their bits per element as read. Under the
	// decode protocol it gives KVRow.FP16PerQuery, BitsRead and
	// NothingQuantized.
	ReadAt func(capacity, c0, p int) (read, quantized, bits float64)
}

// BitsPerElementer is the optional ability of a cache to report its
// storage cost in bits per cached K/V element, scales, zero-points and
// fp16 windows included.
type BitsPerElementer interface {
	BitsPerElement() float64
}

// Protocol names of KVCompareOptions.Protocol (docs/METHODS.md §10).
const (
	// ProtocolDecode: an optional full-precision prompt, then teacher-forced
	// decode, every scored position attending as in generation.
	ProtocolDecode = "decode"
	// ProtocolFakeQuant: KVQuant's fake quantisation: each window in one
	// call through caches that read every token back as stored, the
	// query's own key included, without windows.
	ProtocolFakeQuant = "fake-quant"
)

// KVCompareOptions configures CompareKV.
type KVCompareOptions struct {
	// Ctx is the window length in tokens (>= 2); MaxWindows stops after K
	// windows (0: all).
	Ctx, MaxWindows int
	// Prompt is the number of first tokens of each window fed in one call
	// (full precision among themselves) and not scored, in [0, Ctx−2];
	// Chunk the tokens per call after it (0 means 1: decode one token per
	// call; Ctx: the whole window in one call). Protocol names the
	// protocol in the report (the methods' caches implement it).
	Prompt, Chunk int
	Protocol      string
	// ServingCtx is the context at which KVRow.BitsServing is computed
	// (through KVMethod.BitsAt); 0: not reported.
	ServingCtx int
	// Batch is how many windows go through one runtime.ForwardBatch call
	// per step; 0 picks a number that keeps the logits buffers near
	// 256 MiB.
	Batch int
	// Buckets are the position-bucket starts for the long-context view,
	// ascending from 0; nil means 0, 64, 256, 512, 1024, … up to Ctx.
	Buckets []int
	// Progress, when set, is called after each batch of windows.
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
// BitsPerElement comes from the cache (BitsPerElementer) or from KVBytes,
// at the evaluated context; BitsServing is KVMethod.BitsAt at
// KVCompareOptions.ServingCtx (0: not known). NothingQuantized: the
// method's fp16 windows cover the whole evaluated context, so its numbers
// are fp16's and say nothing about its quantiser. TokensPerSecond is the
// tokens fed through the method's caches per second of its forward calls.
type KVRow struct {
	KV               string  `json:"kv"`
	Method           string  `json:"method"`
	BitsPerElement   float64 `json:"bits_per_element"`
	BitsServing      float64 `json:"bits_per_element_serving,omitempty"`
	NothingQuantized bool    `json:"nothing_quantized,omitempty"`
	KVBytes          int64   `json:"kv_bytes"`
	Perplexity       float64 `json:"perplexity"`
	DeltaPPL         float64 `json:"delta_ppl"`
	KL               float64 `json:"kl"`
	Top1Agreement    float64 `json:"top1_agreement"`
	TokensPerSecond  float64 `json:"tokens_per_second"`
	// FP16PerQuery is the mean, over scored positions, of the cached
	// tokens (those written by earlier calls) a query reads from the fp16
	// windows rather than quantised: the sink and recent windows (the
	// recent one counted back from the query itself), and a per-channel
	// block kind's unfinished 32-token block (kivi2, oscars2 keep it in
	// fp16 even with no windows until the query's own write completes
	// it). From KVMethod.ReadAt under the decode protocol; 0 under
	// fake-quant and for fp32/fp16, whose one format is not a window
	// (FP16PerQueryKnown, JSON fp16_tokens_per_query_known, false there).
	FP16PerQuery      float64 `json:"fp16_tokens_per_query"`
	FP16PerQueryKnown bool    `json:"fp16_tokens_per_query_known"`
	// BitsRead is the bits per K/V element of the cached tokens the
	// scored queries read, averaged over every element they read: Σ_t
	// b_t·c_t / Σ_t c_t, where c_t is the number of tokens cached before
	// position t's call and b_t their bits per element as query t reads
	// them (KVMethod.ReadAt: the windows counted from t, a block kind's
	// block quantised once t's write completes it). BitsPerElement is the
	// layout once the whole window is cached, which for kivi2 and oscars2
	// at a context that is a multiple of 32 holds no fp16 block although
	// most of their queries read a partial one; BitsRead is the figure to
	// compare methods by at the evaluated context under the decode
	// protocol. 0 (not reported) under fake-quant, whose queries read the
	// whole window in its one layout, or without ReadAt.
	BitsRead float64  `json:"bits_per_element_read,omitempty"`
	Buckets  []Bucket `json:"buckets"`
}

// KVReport is the outcome of CompareKV: one row per method, in order.
// Protocol, Prompt and Chunk are the options'; scored positions are
// Prompt..Ctx−2 of each window (the logits at t predict token t+1).
type KVReport struct {
	Ctx          int     `json:"ctx"`
	Protocol     string  `json:"protocol"`
	Prompt       int     `json:"prompt"`
	Chunk        int     `json:"chunk"`
	ServingCtx   int     `json:"serving_ctx,omitempty"`
	Windows      int     `json:"windows"`
	TokensScored int     `json:"tokens_scored"`
	Rows         []KVRow `json:"rows"`
	// Layers, when set, holds per-layer teacher-forced errors
	// (KVLayerErrors) on the first window.
	Layers *KVLayerReport `json:"layers,omitempty"`
}

// CompareKV computes the float32 reference logits of every window once
// (m.NewCache, the whole window in one call) and runs each method's
// caches through TeacherForce (opt.Prompt tokens in one call, then
// opt.Chunk tokens per call, opt.Batch windows per batched step), and
// scores each method as in Perplexity, over positions Prompt..Ctx−2, plus
// its KL divergence and top-1 agreement against the reference at every
// scored position. Statistics accumulate in float64.
//
// Errors: Ctx < 2, Prompt outside [0, Ctx−2], Chunk < 0, ErrTooShort, a
// method's constructor or forward error, ErrNonFinite, ctx cancelled.
func CompareKV(ctx context.Context, m runtime.Model, ids []int, methods []KVMethod, opt KVCompareOptions) (*KVReport, error) {
	n, err := windowCount(len(ids), opt.Ctx, opt.MaxWindows)
	if err != nil {
		return nil, err
	}
	T := opt.Ctx
	P, C := opt.Prompt, max(opt.Chunk, 1)
	if P < 0 || P > T-2 || opt.Chunk < 0 {
		return nil, fmt.Errorf("eval: prompt %d, chunk %d: want 0 <= prompt <= ctx-2 = %d and chunk >= 0", P, opt.Chunk, T-2)
	}
	buckets := opt.Buckets
	if buckets == nil {
		buckets = []int{0, 64, 256}
		for b := 512; b < opt.Ctx; b *= 2 {
			buckets = append(buckets, b)
		}
	}
	V := m.Description().VocabSize
	B := opt.Batch
	if B <= 0 {
		B = max(1, min(64, (256<<20)/(8*T*V)))
	}
	B = min(B, n)
	ref, got := make([][]float32, B), make([][]float32, B)
	refCaches := make([]runtime.KVCache, B)
	for b := range B {
		ref[b], got[b] = make([]float32, T*V), make([]float32, T*V)
		refCaches[b] = m.NewCache(T)
	}
	caches := make([][]runtime.KVCache, len(methods))
	for i, meth := range methods {
		for range B {
			c, err := meth.New(T)
			if err != nil {
				return nil, fmt.Errorf("eval: kv %s: %w", meth.Name, err)
			}
			caches[i] = append(caches[i], c)
		}
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
	refArg := make([][]int, B)
	for b := range refArg {
		refArg[b] = make([]int, T)
	}
	refLogP := make([]float64, V)
	for w0 := 0; w0 < n; w0 += B {
		nb := min(B, n-w0)
		wins := make([][]int, nb)
		for b := range nb {
			wins[b] = ids[(w0+b)*T : (w0+b+1)*T]
			refCaches[b].Truncate(0)
		}
		// The reference once per window: float32 K/V, the whole window in
		// one call (fresh float32 K/V are what decode reads too).
		if err := TeacherForce(ctx, m, wins, refCaches[:nb], ref[:nb], 0, T); err != nil {
			return nil, fmt.Errorf("eval: windows %d..%d (fp32 reference): %w", w0, w0+nb-1, err)
		}
		for b, win := range wins {
			for t := P; t+1 < T; t++ {
				nll := NLL(ref[b][t*V:(t+1)*V], win[t+1])
				if math.IsNaN(nll) || math.IsInf(nll, 0) {
					return nil, fmt.Errorf("eval: window %d position %d (fp32 reference): %w", w0+b, t, ErrNonFinite)
				}
				refNLL += nll
				refArg[b][t] = runtime.Argmax(ref[b][t*V : (t+1)*V])
			}
		}
		for i, meth := range methods {
			cs := caches[i][:nb]
			for _, c := range cs {
				c.Truncate(0)
			}
			t0 := time.Now()
			if err := TeacherForce(ctx, m, wins, cs, got[:nb], P, C); err != nil {
				return nil, fmt.Errorf("eval: windows %d..%d kv %s: %w", w0, w0+nb-1, meth.Name, err)
			}
			a := &accs[i]
			a.seconds += time.Since(t0).Seconds()
			a.bytes = cs[0].Bytes()
			if bp, ok := cs[0].(BitsPerElementer); ok {
				a.bits = bp.BitsPerElement()
			}
			for b, win := range wins {
				bi := 0
				for t := P; t+1 < T; t++ {
					row := got[b][t*V : (t+1)*V]
					nll := NLL(row, win[t+1])
					if math.IsNaN(nll) || math.IsInf(nll, 0) {
						return nil, fmt.Errorf("eval: window %d position %d kv %s: %w", w0+b, t, meth.Name, ErrNonFinite)
					}
					a.nll += nll
					LogSoftmax(ref[b][t*V:(t+1)*V], refLogP)
					kl := klFromLogP(refLogP, row)
					a.kl += kl
					agree := runtime.Argmax(row) == refArg[b][t]
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
		}
		if opt.Progress != nil {
			opt.Progress(w0+nb, n)
		}
	}
	scored := n * (T - 1 - P)
	refPPL := math.Exp(refNLL / float64(scored))
	rep := &KVReport{Ctx: T, Protocol: opt.Protocol, Prompt: P, Chunk: C, ServingCtx: opt.ServingCtx, Windows: n, TokensScored: scored}
	var kvElems int64
	for i := range m.Description().Layers {
		kvElems += 2 * int64(T) * int64(m.Description().Layers[i].KVDim())
	}
	for i, meth := range methods {
		a := &accs[i]
		r := KVRow{KV: meth.Name, Method: cmp.Or(meth.Method, meth.Name), KVBytes: a.bytes, BitsPerElement: a.bits,
			Perplexity:    math.Exp(a.nll / float64(scored)),
			KL:            a.kl / float64(scored),
			Top1Agreement: float64(a.top1) / float64(scored)}
		if r.BitsPerElement == 0 && kvElems > 0 {
			r.BitsPerElement = float64(a.bytes) * 8 / float64(kvElems)
		}
		if meth.BitsAt != nil && opt.ServingCtx > 0 {
			r.BitsServing = meth.BitsAt(opt.ServingCtx)
		}
		if meth.Quantized != nil && opt.Protocol == ProtocolFakeQuant {
			r.NothingQuantized = meth.Quantized(T) == 0
		}
		if meth.ReadAt != nil && opt.Protocol != ProtocolFakeQuant {
			rd := readStats(meth.ReadAt, P, C, T)
			// No scored position reads a quantised token (windows of ctx−1
			// tokens, one call holding the whole window, a sliding window
			// inside the fp16 windows).
			r.NothingQuantized = rd.quantized == 0
			if r.Method != "fp32" && r.Method != "fp16" {
				r.FP16PerQuery, r.FP16PerQueryKnown = rd.fp16PerQuery, true
			}
			r.BitsRead = rd.bits
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

// callStart is the first position of the call that holds scored position
// t under the decode protocol: a prompt of P tokens (t ≥ P), then calls
// of C tokens.
func callStart(P, C, t int) int {
	if C > 1 {
		return P + (t-P)/C*C
	}
	return t
}

// readSummary is what the decode protocol's scored positions read of the
// cached tokens (readStats).
type readSummary struct {
	// bits is KVRow.BitsRead; 0 when no scored position reads a cached
	// token.
	bits float64
	// fp16PerQuery is KVRow.FP16PerQuery.
	fp16PerQuery float64
	// quantized is the sum over scored positions of the cached tokens
	// each reads quantised (0: nothing is read quantised).
	quantized float64
}

// readStats summarises readAt over the scored positions t in [P, T−2]
// of a window of T tokens (a prompt of P tokens in one call, then calls
// of C): each reads some of the c0 tokens cached before its call, of
// which readAt says how many, how many quantised and at what bits per
// element.
func readStats(readAt func(capacity, c0, p int) (float64, float64, float64), P, C, T int) readSummary {
	var r readSummary
	var bitSum, elems, fp16 float64
	n := 0
	for t := P; t <= T-2; t++ {
		rd, q, b := readAt(T, callStart(P, C, t), t)
		bitSum += b * rd
		elems += rd
		fp16 += rd - q
		r.quantized += q
		n++
	}
	if elems > 0 {
		r.bits = bitSum / elems
	}
	if n > 0 {
		r.fp16PerQuery = fp16 / float64(n)
	}
	return r
}
