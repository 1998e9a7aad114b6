package engine

import (
	"context"
	"testing"

	"github.com/lmpack/lmpack/runtime"
)

// countModel records how a batch reaches it.
type countModel struct {
	runtime.Model
	batches, forwards int
}

func (c *countModel) ForwardBatch(ctx context.Context, seqs []runtime.Seq) error {
	c.batches++
	return nil
}

func (c *countModel) Forward(ctx context.Context, tokens []int, cache runtime.KVCache, logits []float32, all bool) error {
	c.forwards++
	return nil
}

// An artifact's model (kvModel, which builds the manifest's KV caches)
// hands a batch to the wrapped backend's batched forward in one call,
// instead of hiding it behind the one-Forward-per-sequence fallback.
func TestKVModelPassesBatchThrough(t *testing.T) {
	inner := &countModel{}
	m := &kvModel{Model: inner, method: "int4"}
	seqs := make([]runtime.Seq, 3)
	if err := runtime.ForwardBatch(t.Context(), m, seqs); err != nil {
		t.Fatal(err)
	}
	if inner.batches != 1 || inner.forwards != 0 {
		t.Fatalf("batch of 3 reached the backend as %d batched calls and %d Forward calls, want 1 and 0", inner.batches, inner.forwards)
	}
}
