package serve

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// referenceCache is reference on a cache of the given kvcache method
// (kvcache.New, not from a pool): the prompt in one Forward call, then one
// token per call.
func referenceCache(tb testing.TB, m runtime.Model, method string, r *GenRequest) []int {
	tb.Helper()
	c, err := kvcache.New(method, kvcache.LayersOf(m.Description()), len(r.Prompt)+r.MaxTokens, kvcache.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	logits := make([]float32, m.Description().VocabSize)
	ctx := context.Background()
	if err := m.Forward(ctx, r.Prompt, c, logits, false); err != nil {
		tb.Fatal(err)
	}
	var out []int
	for len(out) < r.MaxTokens {
		tok := runtime.Argmax(logits)
		out = append(out, tok)
		if err := m.Forward(ctx, []int{tok}, c, logits, false); err != nil {
			tb.Fatal(err)
		}
	}
	return out
}

// TestSchedulerOnKVPool: on kvcache.Pool (int8 and int4 caches, a budget
// of about three of the eight requests), every greedy request emits what
// it emits alone on a cache of the same method, the pool never holds more
// than its budget at any ForwardBatch call, requests wait for memory, and
// everything is released at the end.
func TestSchedulerOnKVPool(t *testing.T) {
	m := loadStories(t)
	layers := kvcache.LayersOf(m.Description())
	for _, method := range []string{"int8", "int4"} {
		t.Run(method, func(t *testing.T) {
			rs := eightRequests(t)
			for _, r := range rs {
				r.IgnoreEOS = true
			}
			want := make([][]int, len(rs))
			for i, r := range rs {
				want[i] = referenceCache(t, m, method, r)
			}
			probe, err := kvcache.NewPool(method, layers, kvcache.Options{}, 1<<30, 16)
			if err != nil {
				t.Fatal(err)
			}
			budget := 3 * probe.BytesFor(64)
			pool, err := kvcache.NewPool(method, layers, kvcache.Options{}, budget, 16)
			if err != nil {
				t.Fatal(err)
			}
			hm := &hookModel{Model: m}
			var mu sync.Mutex
			var over []string
			maxSeqs := 0
			hm.before = func(call int64, _ []runtime.Seq) error {
				st := pool.Stats()
				mu.Lock()
				defer mu.Unlock()
				if st.UsedBytes > st.TotalBytes || st.UsedBlocks > st.TotalBlocks {
					over = append(over, fmt.Sprintf("call %d: %+v", call, st))
				}
				maxSeqs = max(maxSeqs, st.Sequences)
				return nil
			}
			// Every prompt prefills in one chunk (113 prompt tokens in all),
			// as in the reference.
			s := startSched(t, hm, pool, SchedOptions{MaxBatch: 8, MaxPrefillTokens: 512, MaxQueue: 8})
			var chans []<-chan Event
			for _, r := range rs {
				ch, err := s.Submit(context.Background(), r)
				if err != nil {
					t.Fatal(err)
				}
				chans = append(chans, ch)
			}
			for i, ch := range chans {
				got := collect(t, ch)
				if !equalInts(got.tokens, want[i]) || got.finish.Finish != FinishLength {
					t.Errorf("%s: %v (finish %q, %v), alone on %s: %v", rs[i].ID, got.tokens, got.finish.Finish, got.finish.Err, method, want[i])
				}
			}
			if len(over) > 0 {
				t.Errorf("pool over its budget: %v", over)
			}
			if maxSeqs < 2 || maxSeqs == len(rs) {
				t.Errorf("at most %d caches live at once; the budget should admit some but not all 8", maxSeqs)
			}
			if st := pool.Stats(); st.UsedBytes != 0 || st.UsedBlocks != 0 || st.Sequences != 0 {
				t.Errorf("pool at the end: %+v, want nothing used", st)
			}
		})
	}
}
