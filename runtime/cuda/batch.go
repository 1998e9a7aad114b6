package cuda

import (
	"context"
	"fmt"

	"github.com/lmpack/lmpack/runtime"
)

// The CUDA model's ragged batch (runtime.BatchForwarder): B sequences, each
// with its own one-sequence DeviceCache, position and number of new
// tokens, run as the R = ΣT rows of one activation. Every row-wise launch
// (embedding, RMSNorm, the linear maps through matmulX, biases, q/k norm,
// the MoE) runs once over all rows, so each weight is read once per call;
// RoPE, attention (attn_split + attn_merge) and the cache append run per
// sequence on its rows, against its own cache, with the launches Forward
// makes for it alone; the final norm gathers the rows that want logits
// (one per sequence, or all of its rows) and lm_head runs once on them.
//
// Exactness: a sequence's logits equal those it gets alone up to float32
// rounding, not bit for bit as on the CPU: matmulX picks its kernel by the
// call's row count (the GEMV for up to 16 rows, gemv_q for up to 64 rows
// of a packed weight, the tiled GEMM beyond), and those kernels sum in
// different orders. GPU test: TestGPUForwardBatchMatchesAlone.

var _ runtime.BatchForwarder = (*Model)(nil)

// raggedSeq is one sequence of a ForwardBatch call: rows [r0, r0+T) of the
// activations at positions [pos, pos+T) of c; its logits rows start at
// row lr0 of m.s.logits.
type raggedSeq struct {
	c           *DeviceCache
	r0, T, pos  int
	lr0, lrows  int
	ws          int
	tokens      []int
	logits      []float32
	allLogits   bool
	first, nTok int
}

// planBatch validates seqs before any device work and lays out their
// rows: errors name the sequence (no sequences, empty tokens, an id out of
// range, a cache that is not a one-sequence DeviceCache of m, the cache
// full, a short logits slice, two sequences sharing a cache, more rows
// than a launch grid holds). It returns the sequences, the total rows and
// the rows that want logits.
func (m *Model) planBatch(seqs []runtime.Seq) (plan []raggedSeq, R, lrows int, err error) {
	if len(seqs) == 0 {
		return nil, 0, 0, fmt.Errorf("cuda: ForwardBatch: no sequences")
	}
	V := m.d.VocabSize
	plan = make([]raggedSeq, len(seqs))
	for i := range seqs {
		s := &seqs[i]
		fail := func(format string, a ...any) error {
			return fmt.Errorf("cuda: ForwardBatch: sequence %d: %s", i, fmt.Sprintf(format, a...))
		}
		c, ok := s.Cache.(*DeviceCache)
		if !ok || c.m != m {
			return nil, 0, 0, fail("the cache is a %T; the CUDA backend needs a cache from this model's NewCache or NewDeviceCache", s.Cache)
		}
		if c.B != 1 {
			return nil, 0, 0, fail("the cache holds %d sequences; a ragged batch takes one-sequence caches (ForwardUniform runs a B-sequence cache)", c.B)
		}
		T := len(s.Tokens)
		if T == 0 {
			return nil, 0, 0, fail("no tokens")
		}
		if c.n+T > c.cap {
			return nil, 0, 0, fail("%d tokens at position %d exceed the KV cache capacity %d", T, c.n, c.cap)
		}
		n := 1
		if s.AllLogits {
			n = T
		}
		if len(s.Logits) < n*V {
			return nil, 0, 0, fail("logits has %d elements, want %d", len(s.Logits), n*V)
		}
		for j, id := range s.Tokens {
			if id < 0 || id >= V {
				return nil, 0, 0, fail("token %d at index %d out of range [0,%d)", id, j, V)
			}
		}
		for j := 0; j < i; j++ {
			if plan[j].c == c {
				return nil, 0, 0, fmt.Errorf("cuda: ForwardBatch: sequences %d and %d share one KV cache", j, i)
			}
		}
		first := T - 1
		if s.AllLogits {
			first = 0
		}
		plan[i] = raggedSeq{c: c, r0: R, T: T, pos: c.n, lr0: lrows, lrows: n, tokens: s.Tokens, logits: s.Logits,
			allLogits: s.AllLogits, first: first, nTok: c.n + T}
		R += T
		lrows += n
	}
	if R > maxGridYZ {
		return nil, 0, 0, fmt.Errorf("cuda: ForwardBatch: %d token rows in one call, at most %d (CUDA grid dimensions)", R, maxGridYZ)
	}
	return plan, R, lrows, nil
}

// ForwardBatch implements runtime.BatchForwarder (see the comment at the
// top of batch.go): each sequence's cache must be a one-sequence
// DeviceCache of m. Errors: those of planBatch, each naming the sequence,
// checked before any device work; ctx cancelled between layers (every
// cache then keeps its old length); device errors.
func (m *Model) ForwardBatch(ctx context.Context, seqs []runtime.Seq) error {
	plan, R, lrows, err := m.planBatch(seqs)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	H, V := m.d.HiddenSize, m.d.VocabSize
	id32 := make([]int32, 0, R)
	maxCap, maxT, maxTok := 0, 0, 0
	for i := range plan {
		p := &plan[i]
		for _, id := range p.tokens {
			id32 = append(id32, int32(id))
		}
		maxCap, maxT, maxTok = max(maxCap, p.c.cap), max(maxT, p.T), max(maxTok, p.nTok)
		p.ws = p.c.quantFloor()
	}
	if err := m.ensureRope(maxCap); err != nil {
		return err
	}
	if err := m.ensureScratch(R, maxT, maxTok); err != nil {
		return err
	}
	// Attention runs per sequence on the same partial-result scratch:
	// size it for the largest sequence's launch.
	s := &m.s
	slots := int64(0)
	hd := 0
	for i := range m.layers {
		hd = max(hd, m.layers[i].hd)
	}
	for _, p := range plan {
		slots = max(slots, int64(p.T)*int64(m.partSlots(p.T, p.nTok)))
	}
	if err := s.grow(m.dev, &s.partO, 4*slots*2*int64(hd)); err != nil {
		return err
	}
	if err := s.grow(m.dev, &s.partML, 4*slots*2); err != nil {
		return err
	}
	if err := Upload(m.dev, s.ids, id32); err != nil {
		return err
	}
	for _, p := range plan {
		// The ring slots of [pos, nTok) are overwritten even if the
		// step is cancelled: record it before launching.
		p.c.hi = max(p.c.hi, p.nTok)
	}
	err = m.k.Batch(func(bk *Kernels) error {
		attend := func(k *Kernels, li int, l *layerW) error {
			rp := m.rope[l.hd]
			for _, p := range plan {
				qkv := s.qkv + DevPtr(4*p.r0*l.qkv)
				att := s.att + DevPtr(4*p.r0*l.qdim)
				if err := k.Launch("rope", Dim{p.T, l.nh + l.nkv, 1}, Dim{min(roundUp(l.hd/2, 32), 128), 1, 1}, qkv, l.qkv, l.hd, p.T, p.pos, rp.cos, rp.sin); err != nil {
					return err
				}
				if err := m.attention(k, l, &p.c.layers[li], p.c, qkv, att, p.T, p.T, p.pos, p.nTok, p.ws); err != nil {
					return err
				}
				if err := p.c.append(k, li, qkv, l.qkv, l.qdim, l.qdim+l.kvdim, p.pos, p.T, 1); err != nil {
					return err
				}
			}
			return nil
		}
		final := func(k *Kernels) error {
			for _, p := range plan {
				xn := s.xn + DevPtr(4*p.lr0*H)
				x := s.x + DevPtr(4*(p.r0+p.first)*H)
				if err := k.Launch("rmsnorm", Dim{p.lrows, 1, 1}, Dim{256, 1, 1}, xn, x, m.final, H, 1, H, m.eps()); err != nil {
					return err
				}
			}
			return nil
		}
		return m.layersForward(ctx, bk, R, attend, final, s.xn, H, lrows)
	})
	if err != nil {
		return err
	}
	host := make([]float32, lrows*V)
	if err := Download(m.dev, host, s.logits); err != nil {
		return err
	}
	for _, p := range plan {
		copy(p.logits[:p.lrows*V], host[p.lr0*V:(p.lr0+p.lrows)*V])
		p.c.n += p.T
	}
	return nil
}
