package serve

import (
	"errors"
	"testing"

	"github.com/lmpack/lmpack/runtime/kvcache"
)

// kvcache.Pool is the scheduler's KVPool.
var _ KVPool = (*kvcache.Pool)(nil)

// Through the KVPool interface: a reservation shows in Stats and is
// returned by Release; a cache larger than the budget never fits.
func TestKVPoolContract(t *testing.T) {
	layers := []kvcache.Layer{{NumKVHeads: 2, HeadDim: 64}}
	var pool KVPool
	p, err := kvcache.NewPool("int8", layers, kvcache.Options{}, 1<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	pool = p
	c, err := pool.NewCache(100)
	if err != nil {
		t.Fatal(err)
	}
	if s := pool.Stats(); s.Sequences != 1 || s.UsedBytes != pool.BytesFor(100) || s.FreeBytes != s.TotalBytes-s.UsedBytes || s.TotalBytes != 1<<20 {
		t.Errorf("after NewCache(100): %+v, want 1 sequence holding BytesFor(100) = %d", s, pool.BytesFor(100))
	}
	pool.Release(c)
	if s := pool.Stats(); s.Sequences != 0 || s.UsedBytes != 0 || s.UsedBlocks != 0 {
		t.Errorf("after Release: %+v, want nothing used", s)
	}
	if _, err := pool.NewCache(1 << 20); !errors.Is(err, kvcache.ErrNeverFits) {
		t.Errorf("NewCache(2^20 tokens): %v, want ErrNeverFits", err)
	}
}
