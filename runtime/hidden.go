package runtime

import (
	"context"
	"fmt"
)

// HiddenForwarder is an optional Model ability: run the decoder blocks on
// given hidden states instead of token ids. Sequential compression stages
// (GPTQ) load one block at a time as a one-layer model and push captured
// hidden states through it, so only that block's weights are in memory.
type HiddenForwarder interface {
	// ForwardHidden runs every decoder block on x, [T, hidden] float32
	// row-major, the residual stream of T tokens at positions cache.Len()
	// .. cache.Len()+T−1, in place (x becomes the last block's output; the
	// final norm and lm_head are not applied), and appends the tokens'
	// keys and values to cache. Observers see the blocks as in Forward.
	// Errors: T ≤ 0, len(x) ≠ T·hidden, the cache full, ctx cancelled.
	ForwardHidden(ctx context.Context, x []float32, T int, cache KVCache) error
}

var _ HiddenForwarder = (*cpuModel)(nil)

// ForwardHidden implements HiddenForwarder.
func (m *cpuModel) ForwardHidden(ctx context.Context, x []float32, T int, cache KVCache) error {
	H := m.d.HiddenSize
	if T <= 0 || len(x) != T*H {
		return fmt.Errorf("runtime: ForwardHidden: %d values for %d tokens, want %d×%d", len(x), T, T, H)
	}
	pos := cache.Len()
	if pos+T > cache.Cap() {
		return fmt.Errorf("runtime: ForwardHidden: %d tokens at position %d exceed the KV cache capacity %d", T, pos, cache.Cap())
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.ensureScratch(T, cache.Cap())
	for i := range m.layers {
		m.layers[i].rope.ensure(cache.Cap())
	}
	s := &m.s
	m.bs = append(m.bs[:0], batchSeq{T: T, pos: pos, cache: cache})
	m.rows = T
	defer func() {
		clear(m.bs)
		m.bs = m.bs[:0]
	}()
	copy(s.x[:T*H], x)
	eps := float32(m.d.RMSNormEps)
	for li := range m.layers {
		l := &m.layers[li]
		if m.obsBlock != nil {
			m.obsBlock.BlockInput(li, pos, T, s.x[:T*H])
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
			m.obsBlock.BlockOutput(li, pos, T, s.x[:T*H])
		}
	}
	cache.Commit(T)
	copy(x, s.x[:T*H])
	return nil
}
