package kvcache

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// Attention against the packed storage (runtime.KVAttender).
//
// A quantized token x_j of one head is stored as raw_j in the side's
// space: x_j = M(ν_j · S(raw_j)) with S the store's own linear decode map
// (identity, or a codec's rotation: q8_0/q4_0's block Hadamard,
// int4_per_token_head's randomized Hadamard), ν_j the OScaR token norm (1
// without) and M the side's un-rotation (x_rot·Rᵀ, or the normalized
// Hadamard, its own inverse). Then
//
//	q·x_j = ν_j · (Sᵀ Mᵀ q)·raw_j     Σ_j p_j x_j = M S(Σ_j p_j ν_j raw_j)
//
// so the query is rotated once per call (Mᵀq = q·R for OSCAR) and the
// accumulated output un-rotated once, instead of every token on Read.
// Tokens are decoded attendTokens at a time into a block of the caller's
// scratch that stays in L1 (codes to float32, the store's scale and zero
// applied) and multiplied there; the history is never written out. The
// fp16 sink and recent window, and the fp16 kind's store, are read in
// place as binary16 rows (kernels.HalfScores, kernels.HalfAccum: widened
// in registers), the windows in the model's space.

// attendTokens is the block of tokens decoded together.
const attendTokens = 64

// rawStore is a store that decodes its rows for attention without
// mutable state (safe for concurrent calls with distinct aux), in its own
// space.
type rawStore interface {
	store
	// attendable reports whether getRaw, toRaw and fromRaw are
	// available (a row store whose codec has no raw form: false).
	attendable() bool
	// auxLen is the float32 scratch getRaw needs.
	auxLen() int
	// getRaw decodes tokens [i0, i1) of kv head h into dst
	// ([i1−i0, head_dim]) in the store's space: raw_j with x_j = S(raw_j).
	getRaw(h, i0, i1 int, dst, aux []float32)
	// toRaw replaces q ([head_dim]) by Sᵀq; fromRaw replaces o by S(o).
	toRaw(q []float32)
	fromRaw(o []float32)
}

// identity transforms for the stores decoded in the side's space.
type noRawMap struct{}

func (noRawMap) attendable() bool  { return true }
func (noRawMap) auxLen() int       { return 0 }
func (noRawMap) toRaw([]float32)   {}
func (noRawMap) fromRaw([]float32) {}

type f16Raw struct {
	*f16Store
	noRawMap
}

func (s f16Raw) getRaw(h, i0, i1 int, dst, _ []float32) { s.get(h, i0, i1, dst) }

type asymRaw struct {
	*asymStore
	noRawMap
}

func (s asymRaw) getRaw(h, i0, i1 int, dst, _ []float32) { s.get(h, i0, i1, dst) }

type sym2Raw struct {
	*sym2Store
	noRawMap
}

func (s sym2Raw) getRaw(h, i0, i1 int, dst, _ []float32) { s.get(h, i0, i1, dst) }

type channelRaw struct {
	*channelStore
	noRawMap
}

func (s channelRaw) auxLen() int { return 2 * s.hd }

func (s channelRaw) getRaw(h, i0, i1 int, dst, aux []float32) {
	s.getWith(h, i0, i1, dst, aux[:s.hd], aux[s.hd:2*s.hd])
}

// rawCodec is the optional raw form of a rowCodec: decodeRaw writes the
// row before the codec's final linear map S (safe for concurrent use),
// toRaw applies Sᵀ and fromRaw S, in place on [head_dim].
type rawCodec interface {
	decodeRaw(dst []float32, src []byte)
	toRaw(q []float32)
	fromRaw(o []float32)
}

type rowRaw struct{ *rowStore }

func (s rowRaw) attendable() bool { _, ok := s.c.(rawCodec); return ok }
func (s rowRaw) auxLen() int      { return 0 }
func (s rowRaw) toRaw(q []float32) {
	s.c.(rawCodec).toRaw(q)
}
func (s rowRaw) fromRaw(o []float32) { s.c.(rawCodec).fromRaw(o) }
func (s rowRaw) getRaw(h, i0, i1 int, dst, _ []float32) {
	rc := s.c.(rawCodec)
	for i := i0; i < i1; i++ {
		rc.decodeRaw(dst[(i-i0)*s.hd:(i-i0+1)*s.hd], s.row(s.p.get(i), h, i))
	}
}

// rawOf returns the raw form of a store (nil: none). float32 rows have
// none: Read only copies them, and attending them through Read keeps a
// Pool's fp32 caches bit-identical to New's (runtime.F32KV).
func rawOf(st store) rawStore {
	switch s := st.(type) {
	case *f16Store:
		return f16Raw{f16Store: s}
	case *asymStore:
		return asymRaw{asymStore: s}
	case *sym2Store:
		return sym2Raw{sym2Store: s}
	case *channelStore:
		return channelRaw{channelStore: s}
	case *rowStore:
		if r := (rowRaw{s}); r.attendable() {
			return r
		}
	}
	return nil
}

var _ runtime.KVAttender = (*cache)(nil)

// AttendsKV implements runtime.KVAttender: true when both stores of the
// layer have a raw form: every kind but the TurboQuant ones' quantized
// layers (Lloyd–Max codecs, served by Read) and a Pool's fp32.
func (c *cache) AttendsKV(layer int) bool {
	L := &c.layers[layer]
	return L.k.raw != nil && L.v.raw != nil
}

// AttendScratch implements runtime.KVAttender: rotated queries, the
// output accumulator and a product buffer ([nq, head_dim] each), the
// decoded block [attendTokens, head_dim], norm-weighted probabilities
// [nq, attendTokens] and the store's own scratch.
func (c *cache) AttendScratch(layer, nq int) int {
	L := &c.layers[layer]
	aux := 0
	for _, sd := range []*side{&L.k, &L.v} {
		if sd.raw != nil {
			aux = max(aux, sd.raw.auxLen())
		}
	}
	return 3*nq*L.hd + attendTokens*L.hd + nq*attendTokens + max(aux, 2*attendTokens+nq)
}

// attendScratch splits scratch for nq rows.
func (c *cache) attendScratch(L *layerState, nq int, scratch []float32) (qs, acc, tmp, blk, pw, aux []float32) {
	hd := L.hd
	if len(scratch) < 3*nq*hd+attendTokens*hd+nq*attendTokens {
		panic(fmt.Sprintf("kvcache: %s: attention scratch has %d elements, want %d", c.name, len(scratch), 3*nq*hd+attendTokens*hd+nq*attendTokens))
	}
	qs, scratch = scratch[:nq*hd], scratch[nq*hd:]
	acc, scratch = scratch[:nq*hd], scratch[nq*hd:]
	tmp, scratch = scratch[:nq*hd], scratch[nq*hd:]
	blk, scratch = scratch[:attendTokens*hd], scratch[attendTokens*hd:]
	pw, aux = scratch[:nq*attendTokens], scratch[nq*attendTokens:]
	return
}

func (c *cache) checkAttend(L *layerState, fn string, layer, p0, p1 int) {
	if p0 < 0 || p1 > L.len || p0 > p1 {
		panic(fmt.Sprintf("kvcache: %s: %s: positions [%d,%d) of layer %d, which holds %d", c.name, fn, p0, p1, layer, L.len))
	}
	if L.k.raw == nil || L.v.raw == nil {
		panic(fmt.Sprintf("kvcache: %s: %s: layer %d has no raw form (AttendsKV is false)", c.name, fn, layer))
	}
}

// fp16Span returns the binary16 rows of kv head h for positions [a, e)
// of the sink (sink true) or the ring, e ≤ b the end of the contiguous
// run from a (the ring wraps at slot ring−1), as [e−a, head_dim]: the
// windows are head-major (row16), read in place by kernels.HalfScores and
// kernels.HalfAccum. a < b.
func (c *cache) fp16Span(L *layerState, kSide, sink bool, h, a, b int) ([]uint16, int) {
	hd := L.hd
	if sink {
		src := L.sinkV
		if kSide {
			src = L.sinkK
		}
		return src[(h*c.sink+a)*hd : (h*c.sink+b)*hd], b
	}
	src := L.ringV
	if kSide {
		src = L.ringK
	}
	r := a % c.ring
	e := min(b, a+c.ring-r)
	return src[(h*c.ring+r)*hd : (h*c.ring+r+e-a)*hd], e
}

// scores writes q_i·x_j of store tokens [i0, i1) of kv head h (x_j the
// binary16 rows, read in place) into out[i·lds + j−i0] for the nq rows of
// q ([nq, head_dim], stride ldq).
func (s f16Raw) scores(h, i0, i1, nq int, q []float32, ldq int, out []float32, lds int) {
	for i := i0; i < i1; {
		e := s.p.runEnd(i, i1)
		o := s.vals.at(s.p, h, i)
		kernels.HalfScores(nq, e-i, s.hd, q, ldq, s.p.get(i).u16[o:o+(e-i)*s.hd], s.hd, out[i-i0:], lds)
		i = e
	}
}

// accum adds Σ_j p[i·ldp + j−i0]·x_j over store tokens [i0, i1) of kv
// head h (binary16 rows, read in place) to acc[i·head_dim:] for the nq
// rows of p.
func (s f16Raw) accum(h, i0, i1, nq int, p []float32, ldp int, acc []float32) {
	for i := i0; i < i1; {
		e := s.p.runEnd(i, i1)
		o := s.vals.at(s.p, h, i)
		kernels.HalfAccum(nq, e-i, s.hd, p[i-i0:], ldp, s.p.get(i).u16[o:o+(e-i)*s.hd], s.hd, acc, s.hd)
		i = e
	}
}

// toSide writes Sᵀ Mᵀ q_i of the nq query rows q (stride ldq) into qs
// ([nq, head_dim]).
func toSide(sd *side, hd, nq int, q []float32, ldq int, qs []float32) {
	if sd.rot == rotMatrix {
		// Mᵀq = q·R = q·(Rᵀ)ᵀ.
		kernels.MatMulNT(nq, hd, hd, q, ldq, sd.rt, hd, qs, hd)
	} else {
		for i := 0; i < nq; i++ {
			copy(qs[i*hd:(i+1)*hd], q[i*ldq:i*ldq+hd])
		}
	}
	for i := 0; i < nq; i++ {
		r := qs[i*hd : (i+1)*hd]
		if sd.rot == rotHadamard {
			kvq.FWHT(r)
		}
		sd.raw.toRaw(r)
	}
}

// norm returns the OScaR norm of store index i.
func (c *cache) norm(sd *side, i int) float32 { return c.pg.get(i).f32[sd.norms.at(c.pg, 0, i)] }

// Scores implements runtime.KVAttender.
func (c *cache) Scores(layer, h, p0, p1, nq int, q []float32, ldq int, s []float32, lds int, scratch []float32) {
	L := &c.layers[layer]
	c.checkAttend(L, "Scores", layer, p0, p1)
	hd := L.hd
	qs, _, _, blk, _, aux := c.attendScratch(L, nq, scratch)
	// fp16 rows: the sink [p0, min(p1, sink)) and the ring [max(q, sink), p1).
	fp16 := func(sink bool, a0, a1 int) {
		for a := a0; a < a1; {
			rows, e := c.fp16Span(L, true, sink, h, a, a1)
			kernels.HalfScores(nq, e-a, hd, q, ldq, rows, hd, s[a-p0:], lds)
			a = e
		}
	}
	fp16(true, p0, min(p1, c.sink))
	sd := &L.k
	if a0, a1 := max(p0, c.sink), min(p1, L.q); a1 > a0 {
		toSide(sd, hd, nq, q, ldq, qs)
		if cs, bits, ok := codesOf(sd); ok && codeScores(cs, bits, hd, h, a0-c.sink, a1-c.sink, nq, qs, s[a0-p0:], lds, blk, aux[:2*attendTokens], aux[2*attendTokens:2*attendTokens+nq]) {
			a1 = a0 // done
		} else if ch, ok := sd.raw.(channelRaw); ok && !sd.norm && ch.rowsOK(nq) {
			ch.scoresRows(h, a0-c.sink, a1-c.sink, nq, qs, s[a0-p0:], lds, blk)
			a1 = a0
		} else if rr, g, ok := ggmlRows(sd, nq); ok {
			rr.ggmlScores(g, h, a0-c.sink, a1-c.sink, nq, qs, s[a0-p0:], lds, blk)
			a1 = a0
		} else if f, ok := sd.raw.(f16Raw); ok && !sd.norm {
			f.scores(h, a0-c.sink, a1-c.sink, nq, qs, hd, s[a0-p0:], lds)
			a1 = a0
		}
		for a := a0; a < a1; a += attendTokens {
			b := min(a1, a+attendTokens)
			sd.raw.getRaw(h, a-c.sink, b-c.sink, blk, aux)
			kernels.MatMulNT(nq, b-a, hd, qs, hd, blk, hd, s[a-p0:], lds)
			if sd.norm {
				for j := a; j < b; j++ {
					nu := c.norm(sd, j-c.sink)
					for i := 0; i < nq; i++ {
						s[i*lds+j-p0] *= nu
					}
				}
			}
		}
	}
	fp16(false, max(p0, L.q, c.sink), p1)
}

// AccumV implements runtime.KVAttender.
func (c *cache) AccumV(layer, h, p0, p1, nq int, p []float32, ldp int, out []float32, ldo int, scratch []float32) {
	L := &c.layers[layer]
	c.checkAttend(L, "AccumV", layer, p0, p1)
	hd := L.hd
	_, acc, tmp, blk, pw, aux := c.attendScratch(L, nq, scratch)
	addRows := func(src []float32) {
		for i := 0; i < nq; i++ {
			kernels.Axpy(1, src[i*hd:(i+1)*hd], out[i*ldo:i*ldo+hd])
		}
	}
	fp16 := func(sink bool, a0, a1 int) {
		for a := a0; a < a1; {
			rows, e := c.fp16Span(L, false, sink, h, a, a1)
			kernels.HalfAccum(nq, e-a, hd, p[a-p0:], ldp, rows, hd, out, ldo)
			a = e
		}
	}
	fp16(true, p0, min(p1, c.sink))
	sd := &L.v
	if a0, a1 := max(p0, c.sink), min(p1, L.q); a1 > a0 {
		clear(acc[:nq*hd])
		if cs, bits, ok := codesOf(sd); ok && codeAccum(cs, bits, hd, h, a0-c.sink, a1-c.sink, nq, p[a0-p0:], ldp, acc, blk, pw, tmp, aux[:2*attendTokens], aux[2*attendTokens:2*attendTokens+nq]) {
			a0 = a1 // done
		} else if rr, g, ok := ggmlRows(sd, nq); ok {
			rr.ggmlAccum(g, h, a0-c.sink, a1-c.sink, nq, p[a0-p0:], ldp, acc, blk)
			a0 = a1
		} else if f, ok := sd.raw.(f16Raw); ok && !sd.norm {
			f.accum(h, a0-c.sink, a1-c.sink, nq, p[a0-p0:], ldp, acc)
			a0 = a1
		}
		for a := a0; a < a1; a += attendTokens {
			b := min(a1, a+attendTokens)
			sd.raw.getRaw(h, a-c.sink, b-c.sink, blk, aux)
			pp, ldpp := p[a-p0:], ldp
			if sd.norm {
				for i := 0; i < nq; i++ {
					for j := a; j < b; j++ {
						pw[i*attendTokens+j-a] = p[i*ldp+j-p0] * c.norm(sd, j-c.sink)
					}
				}
				pp, ldpp = pw, attendTokens
			}
			kernels.MatMulNN(nq, hd, b-a, pp, ldpp, blk, hd, tmp, hd)
			kernels.Axpy(1, tmp[:nq*hd], acc[:nq*hd])
		}
		// o = M S(acc), once per row.
		for i := 0; i < nq; i++ {
			r := acc[i*hd : (i+1)*hd]
			sd.raw.fromRaw(r)
			if sd.rot == rotHadamard {
				kvq.FWHT(r)
			}
		}
		if sd.rot == rotMatrix {
			kernels.MatMulNT(nq, hd, hd, acc, hd, sd.r, hd, tmp, hd)
			addRows(tmp)
		} else {
			addRows(acc)
		}
	}
	fp16(false, max(p0, L.q, c.sink), p1)
}

// Raw forms of the serving-engine codecs (the TurboQuant key and value
// codecs have none: their layers are served by Read).

// q8_0/q4_0: raw = the rotated row, S = the block Hadamard (symmetric).
func (c *ggmlCodec) decodeRaw(dst []float32, src []byte) {
	bb := c.blockBytes()
	for b := 0; b < c.hd/ggmlBlock; b++ {
		xb, sb := dst[b*ggmlBlock:(b+1)*ggmlBlock], src[b*bb:(b+1)*bb]
		if c.bits == 8 {
			decodeQ8_0(xb, sb)
		} else {
			decodeQ4_0(xb, sb)
		}
	}
}
func (c *ggmlCodec) toRaw(q []float32)   { c.rotate(q) }
func (c *ggmlCodec) fromRaw(o []float32) { c.rotate(o) }

// int4_per_token_head: raw = ŷ, S(ŷ) = D∘(H_n·ŷ)/√d, Sᵀq = H_n·(D∘q)/√d.
func (c *int4PTHCodec) decodeRaw(dst []float32, src []byte) { decodeInt4PTH(dst, src) }
func (c *int4PTHCodec) toRaw(q []float32) {
	r := float32(1 / math.Sqrt(float64(len(q))))
	for i := range q {
		q[i] *= c.signs[i]
	}
	kvq.FWHT(q)
	kernels.Scale(r, q)
}
func (c *int4PTHCodec) fromRaw(o []float32) {
	r := float32(1 / math.Sqrt(float64(len(o))))
	kvq.FWHT(o)
	for i := range o {
		o[i] *= r * c.signs[i]
	}
}

// fp8: decode has no state; S is the identity.
func (c *fp8Codec) decodeRaw(dst []float32, src []byte) { c.decode(dst, src) }
func (c *fp8Codec) toRaw([]float32)                     {}
func (c *fp8Codec) fromRaw([]float32)                   {}
