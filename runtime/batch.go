package runtime

import (
	"context"
	"fmt"
)

// Seq is one sequence of a batched forward call (ForwardBatch): its new
// tokens, its own KV cache and where its logits go. Sequences of one call
// may be at different positions and bring different numbers of tokens
// (decode steps of one token and prefill chunks mixed).
type Seq struct {
	// Tokens are the sequence's new token ids, in [0, vocab), at positions
	// Cache.Len() .. Cache.Len()+len(Tokens)-1.
	Tokens []int
	// Cache is the sequence's KV cache; the call appends the tokens' keys
	// and values. Two Seqs of one call must not share a cache.
	Cache KVCache
	// Logits receives [len(Tokens), vocab] row-major float32 when
	// AllLogits, otherwise [vocab] for the last token.
	Logits    []float32
	AllLogits bool
}

// BatchForwarder is the ability of a Model to run several sequences in one
// call, reading the weights once for all of their rows (ragged batch).
// Each sequence's logits must equal, bit for bit, those of the same
// sequence run alone through Forward: a row's result does not depend on
// the other rows of the batch.
type BatchForwarder interface {
	// ForwardBatch runs every seq as Forward would. Errors: as Forward's,
	// naming the sequence's index; on error no cache has committed the
	// call's tokens.
	ForwardBatch(ctx context.Context, seqs []Seq) error
}

// ForwardBatch runs seqs on m: through m's BatchForwarder when it has one,
// otherwise one Forward call per sequence. Errors name the sequence.
func ForwardBatch(ctx context.Context, m Model, seqs []Seq) error {
	if b, ok := m.(BatchForwarder); ok {
		return b.ForwardBatch(ctx, seqs)
	}
	for i := range seqs {
		s := &seqs[i]
		if err := m.Forward(ctx, s.Tokens, s.Cache, s.Logits, s.AllLogits); err != nil {
			return fmt.Errorf("sequence %d: %w", i, err)
		}
	}
	return nil
}
