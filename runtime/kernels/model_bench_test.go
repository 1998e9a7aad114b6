package kernels

import (
	"fmt"
	"math"
	"testing"
)

// A synthetic F32 Llama built from this package's kernels only, to check
// that they can carry the runtime's speed targets: dim 512, 8 layers, 8
// heads of 64, 2 KV heads, FFN 1408, vocab 512 (22.6M parameters). It
// mirrors what a forward pass does (RMSNorm, QKV, RoPE, causal GQA
// attention, output projection, SwiGLU FFN, residuals, LM head for the last
// position) but is not the runtime: the runtime package has its own.
const (
	synDim     = 512
	synLayers  = 8
	synHeads   = 8
	synKVHeads = 2
	synHeadDim = 64
	synFFN     = 1408
	synVocab   = 512
	synKV      = synKVHeads * synHeadDim
)

type synLayer struct {
	attnNorm, ffnNorm []float32
	wq, wk, wv, wo    []float32
	w1, w2, w3        []float32
	kCache, vCache    []float32 // [ctx, synKV]
}

type synModel struct {
	layers []synLayer
	norm   []float32
	lmHead []float32
	ctx    int
	rope   []float32 // [ctx, headDim/2] cos, sin interleaved
}

func newSynModel(ctx int) *synModel {
	r := newRand(99)
	scaled := func(n int, s float32) []float32 {
		v := randSlice(r, n)
		Scale(s, v)
		return v
	}
	ones := func(n int) []float32 {
		v := make([]float32, n)
		fill(v, 1)
		return v
	}
	m := &synModel{ctx: ctx, norm: ones(synDim), lmHead: scaled(synVocab*synDim, 0.05)}
	for l := 0; l < synLayers; l++ {
		m.layers = append(m.layers, synLayer{
			attnNorm: ones(synDim), ffnNorm: ones(synDim),
			wq: scaled(synDim*synDim, 0.05), wk: scaled(synKV*synDim, 0.05), wv: scaled(synKV*synDim, 0.05),
			wo: scaled(synDim*synDim, 0.05), w1: scaled(synFFN*synDim, 0.05), w3: scaled(synFFN*synDim, 0.05),
			w2: scaled(synDim*synFFN, 0.03), kCache: make([]float32, ctx*synKV), vCache: make([]float32, ctx*synKV),
		})
	}
	m.rope = make([]float32, ctx*synHeadDim)
	for p := 0; p < ctx; p++ {
		for i := 0; i < synHeadDim/2; i++ {
			a := float64(p) * math.Pow(10000, -2*float64(i)/synHeadDim)
			m.rope[p*synHeadDim+2*i] = float32(math.Cos(a))
			m.rope[p*synHeadDim+2*i+1] = float32(math.Sin(a))
		}
	}
	return m
}

func (m *synModel) applyRoPE(v []float32, pos int) {
	c := m.rope[pos*synHeadDim : (pos+1)*synHeadDim]
	for h := 0; h+synHeadDim <= len(v); h += synHeadDim {
		for i := 0; i < synHeadDim/2; i++ {
			a, b := v[h+i], v[h+i+synHeadDim/2]
			cs, sn := c[2*i], c[2*i+1]
			v[h+i], v[h+i+synHeadDim/2] = a*cs-b*sn, a*sn+b*cs
		}
	}
}

// synState holds activations for t positions.
type synState struct {
	t             int
	x, xb, q, att []float32
	h1, h3, out   []float32
	scores        [][]float32 // per head scratch [qBlock, ctx]
	logits        []float32
	attnTask      synAttnTask
}

const synQBlock = 32

func newSynState(t, ctx int) *synState {
	s := &synState{t: t,
		x: make([]float32, t*synDim), xb: make([]float32, t*synDim), q: make([]float32, t*synDim),
		att: make([]float32, t*synDim), out: make([]float32, t*synDim),
		h1: make([]float32, t*synFFN), h3: make([]float32, t*synFFN), logits: make([]float32, synVocab)}
	for h := 0; h < synHeads; h++ {
		s.scores = append(s.scores, make([]float32, synQBlock*ctx))
	}
	return s
}

// synAttnTask computes causal attention for heads [lo, hi) of t queries at
// positions pos0..pos0+t-1 against cache rows 0..pos0+t-1.
type synAttnTask struct {
	l    *synLayer
	s    *synState
	pos0 int
}

func (a *synAttnTask) Run(lo, hi int) {
	s, l := a.s, a.l
	scale := float32(1 / math.Sqrt(synHeadDim))
	for h := lo; h < hi; h++ {
		kvh := h / (synHeads / synKVHeads)
		sc := s.scores[h]
		for i0 := 0; i0 < s.t; i0 += synQBlock {
			bs := min(synQBlock, s.t-i0)
			keys := a.pos0 + i0 + bs // causal: the block sees keys [0, keys)
			MatMulNT(bs, keys, synHeadDim, s.q[i0*synDim+h*synHeadDim:], synDim,
				l.kCache[kvh*synHeadDim:], synKV, sc, keys)
			for i := 0; i < bs; i++ {
				row := sc[i*keys : (i+1)*keys]
				visible := a.pos0 + i0 + i + 1
				Scale(scale, row[:visible])
				Softmax(row[:visible])
				clear(row[visible:])
			}
			MatMulNN(bs, synHeadDim, keys, sc, keys, l.vCache[kvh*synHeadDim:], synKV,
				s.att[i0*synDim+h*synHeadDim:], synDim)
		}
	}
}

// forward runs t positions starting at pos0 (t > 1: prefill; t == 1:
// decode) and leaves the last position's logits in s.logits.
func (m *synModel) forward(p *Pool, s *synState, pos0 int) {
	t := s.t
	for li := range m.layers {
		l := &m.layers[li]
		for i := 0; i < t; i++ {
			RMSNorm(s.xb[i*synDim:(i+1)*synDim], s.x[i*synDim:(i+1)*synDim], l.attnNorm, 1e-5)
		}
		p.MatMulNT(t, synDim, synDim, s.xb, synDim, l.wq, synDim, s.q, synDim)
		kc := l.kCache[pos0*synKV:]
		vc := l.vCache[pos0*synKV:]
		p.MatMulNT(t, synKV, synDim, s.xb, synDim, l.wk, synDim, kc, synKV)
		p.MatMulNT(t, synKV, synDim, s.xb, synDim, l.wv, synDim, vc, synKV)
		for i := 0; i < t; i++ {
			m.applyRoPE(s.q[i*synDim:(i+1)*synDim], pos0+i)
			m.applyRoPE(kc[i*synKV:(i+1)*synKV], pos0+i)
		}
		s.attnTask = synAttnTask{l: l, s: s, pos0: pos0}
		p.Run(synHeads, &s.attnTask)
		p.MatMulNT(t, synDim, synDim, s.att, synDim, l.wo, synDim, s.out, synDim)
		Axpy(1, s.out, s.x)
		for i := 0; i < t; i++ {
			RMSNorm(s.xb[i*synDim:(i+1)*synDim], s.x[i*synDim:(i+1)*synDim], l.ffnNorm, 1e-5)
		}
		p.MatMulNT(t, synFFN, synDim, s.xb, synDim, l.w1, synDim, s.h1, synFFN)
		p.MatMulNT(t, synFFN, synDim, s.xb, synDim, l.w3, synDim, s.h3, synFFN)
		SiLUMul(s.h1, s.h3)
		p.MatMulNT(t, synDim, synFFN, s.h1, synFFN, l.w2, synFFN, s.out, synDim)
		Axpy(1, s.out, s.x)
	}
	last := s.x[(t-1)*synDim : t*synDim]
	RMSNorm(s.xb[:synDim], last, m.norm, 1e-5)
	p.MatMulNT(1, synVocab, synDim, s.xb, synDim, m.lmHead, synDim, s.logits, synVocab)
}

// BenchmarkSyntheticLlama reports prefill of 512 tokens and decode of one
// token at context 64 (the middle of a 128-token generation), in tokens per
// second, on 1 and 2 threads.
func BenchmarkSyntheticLlama(b *testing.B) {
	const ctx = 1024
	m := newSynModel(ctx)
	r := newRand(5)
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("prefill512/t=%d", threads), func(b *testing.B) {
			p := NewPool(threads)
			defer p.Close()
			s := newSynState(512, ctx)
			for b.Loop() {
				fillRand(r, s.x)
				m.forward(p, s, 0)
			}
			b.ReportMetric(512*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
		b.Run(fmt.Sprintf("decode@64/t=%d", threads), func(b *testing.B) {
			p := NewPool(threads)
			defer p.Close()
			s := newSynState(1, ctx)
			for b.Loop() {
				fillRand(r, s.x)
				m.forward(p, s, 64)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
