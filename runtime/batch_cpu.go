package runtime

import (
	"context"
	"fmt"
	"reflect"

	"github.com/lmpack/lmpack/runtime/kernels"
)

// The CPU model's ragged batch (BatchForwarder). One call runs every
// sequence's new tokens as the rows of one activation matrix [ΣT, hidden]:
// every linear map (q/k/v, o, gate/up/down, the MoE router and experts,
// lm_head on the rows that want logits) runs once over all rows, so each
// weight is read once per call; RMSNorm and RoPE run per row, each row at
// its own sequence's position; attention runs per sequence against that
// sequence's own cache with Forward's semantics (fresh float32 K/V within
// the call, QuantizedKV windows counted back from each query; attendSeq).
//
// Row independence: every linear map runs kernels.Pool.MatMulNTRows (float
// weights) or dequantized tiles fed to it (packed weights, qlinear.go),
// whose every output is summed in an order fixed by the row length alone,
// and every other step is per row or per sequence. So a sequence's logits
// are the same bits whatever else is in the batch, and whatever the pool's
// thread count.

var _ BatchForwarder = (*cpuModel)(nil)

// batchSeq is one sequence of the running call: rows [r0, r0+T) of the
// activations, at positions [pos, pos+T) of cache.
type batchSeq struct {
	r0, T, pos int
	cache      KVCache
}

// Forward implements Model: ForwardBatch's one-sequence case.
func (m *cpuModel) Forward(ctx context.Context, tokens []int, cache KVCache, logits []float32, allLogits bool) error {
	m.one[0] = Seq{Tokens: tokens, Cache: cache, Logits: logits, AllLogits: allLogits}
	err := m.forward(ctx, m.one[:], false)
	m.one[0] = Seq{}
	return err
}

// ForwardBatch implements BatchForwarder: seqs run as one batch of rows
// (see the comment at the top of batch_cpu.go); seqs[i].Logits gets what
// Forward would write for it, bit for bit. Errors, each naming the
// sequence's index, are checked before any cache is touched: no
// sequences, empty tokens, an id out of range, a nil cache, the cache full,
// a short logits slice, two sequences sharing one cache, an observer
// installed (SetObserver) while several sequences run. On ctx cancelled
// between blocks every cache is truncated back to its length at the call.
func (m *cpuModel) ForwardBatch(ctx context.Context, seqs []Seq) error {
	if len(seqs) == 0 {
		return fmt.Errorf("runtime: ForwardBatch: no sequences")
	}
	return m.forward(ctx, seqs, true)
}

// hasObserver reports whether SetObserver installed any hook.
func (m *cpuModel) hasObserver() bool {
	return m.obsBlock != nil || m.obsQKV != nil || m.obsRouter != nil || m.obsFFN != nil || m.obsAttn != nil || m.obsAttnOut != nil
}

// checkSeq validates one sequence of a call.
func (m *cpuModel) checkSeq(s *Seq) error {
	V := m.d.VocabSize
	T := len(s.Tokens)
	if T == 0 {
		return fmt.Errorf("no tokens")
	}
	if s.Cache == nil {
		return fmt.Errorf("no KV cache (Cache is nil)")
	}
	pos := s.Cache.Len()
	if pos+T > s.Cache.Cap() {
		return fmt.Errorf("%d tokens at position %d exceed the KV cache capacity %d", T, pos, s.Cache.Cap())
	}
	want := V
	if s.AllLogits {
		want = T * V
	}
	if len(s.Logits) < want {
		return fmt.Errorf("logits has %d elements, want %d", len(s.Logits), want)
	}
	for i, id := range s.Tokens {
		if id < 0 || id >= V {
			return fmt.Errorf("token %d at index %d out of range [0,%d)", id, i, V)
		}
	}
	return nil
}

// sameCache reports whether a and b are the same cache (comparable dynamic
// types only: a cache held by value in a non-comparable type cannot be
// told apart).
func sameCache(a, b KVCache) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// forward runs seqs (one Forward sequence when !batch, whose errors keep
// Forward's messages).
func (m *cpuModel) forward(ctx context.Context, seqs []Seq, batch bool) error {
	fail := func(i int, err error) error {
		if !batch {
			return fmt.Errorf("runtime: Forward: %w", err)
		}
		return fmt.Errorf("runtime: ForwardBatch: sequence %d: %w", i, err)
	}
	for i := range seqs {
		if err := m.checkSeq(&seqs[i]); err != nil {
			return fail(i, err)
		}
	}
	if len(seqs) > 1 {
		for i := range seqs {
			for j := i + 1; j < len(seqs); j++ {
				if sameCache(seqs[i].Cache, seqs[j].Cache) {
					return fmt.Errorf("runtime: ForwardBatch: sequences %d and %d share one KV cache", i, j)
				}
			}
		}
		if m.hasObserver() {
			return fmt.Errorf("runtime: ForwardBatch: %d sequences with an observer installed (SetObserver): observers see one sequence per call", len(seqs))
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d := m.d
	H, V := d.HiddenSize, d.VocabSize
	rows, maxCap, lrows := 0, 0, 0
	m.bs = m.bs[:0]
	for i := range seqs {
		s := &seqs[i]
		T := len(s.Tokens)
		m.bs = append(m.bs, batchSeq{r0: rows, T: T, pos: s.Cache.Len(), cache: s.Cache})
		rows += T
		maxCap = max(maxCap, s.Cache.Cap())
		if s.AllLogits {
			lrows += T
		} else {
			lrows++
		}
	}
	m.rows = rows
	defer func() {
		clear(m.bs) // drop the caches
		m.bs = m.bs[:0]
	}()
	// Scratch is sized for the caches' capacity so that decode steps never
	// reallocate.
	m.ensureScratch(rows, maxCap)
	// Caches made outside NewCache (quantized ones) may be larger than any
	// seen so far: extend the RoPE tables (no work once they cover it).
	for i := range m.layers {
		m.layers[i].rope.ensure(maxCap)
	}
	s := &m.s
	x := s.x[:rows*H]
	r := 0
	for i := range seqs {
		for _, id := range seqs[i].Tokens {
			m.embedRow(x[r*H:(r+1)*H], id)
			r++
		}
	}
	eps := float32(d.RMSNormEps)
	pos := m.bs[0].pos // for the block observers (one sequence)
	for li := range m.layers {
		if li > 0 {
			if err := ctx.Err(); err != nil {
				for _, b := range m.bs {
					b.cache.Truncate(b.pos)
				}
				return err
			}
		}
		l := &m.layers[li]
		if m.obsBlock != nil {
			m.obsBlock.BlockInput(li, pos, rows, x)
		}
		if m.perBlock {
			m.convertBlock(l)
		}
		m.attention(li, l, eps)
		m.ffn(li, l, eps)
		if m.perBlock {
			m.releaseBlock(l)
		}
		if m.obsBlock != nil {
			m.obsBlock.BlockOutput(li, pos, rows, x)
		}
	}
	for _, b := range m.bs {
		b.cache.Commit(b.T)
	}
	// Final norm and lm_head on the rows that need logits, all at once.
	xn := s.logitsRow[:lrows*H]
	r = 0
	for i, b := range m.bs {
		first := b.r0 + b.T - 1
		if seqs[i].AllLogits {
			first = b.r0
		}
		for j := first; j < b.r0+b.T; j++ {
			kernels.RMSNorm(xn[r*H:(r+1)*H], x[j*H:(j+1)*H], m.finalNorm, eps)
			r++
		}
	}
	if len(seqs) == 1 {
		m.matMul(lrows, V, H, xn, H, &m.lmHead, seqs[0].Logits, V)
		return nil
	}
	s.logits = grow(s.logits, lrows*V)
	m.matMul(lrows, V, H, xn, H, &m.lmHead, s.logits, V)
	r = 0
	for i := range seqs {
		n := 1
		if seqs[i].AllLogits {
			n = len(seqs[i].Tokens)
		}
		copy(seqs[i].Logits[:n*V], s.logits[r*V:(r+n)*V])
		r += n
	}
	return nil
}
