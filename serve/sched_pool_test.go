package serve

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lmpack/lmpack/formats/tokenizer"
	"github.com/lmpack/lmpack/internal/shared"
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

// TestPreemptionOnDemand: requests without max_tokens (DefaultMaxTokens,
// MaxTokens what the 128-token context leaves) under a budget of about
// two and a half full contexts on kvcache.Pool (fp32: recomputation is
// exact) are admitted on their prompt and grow block by block: more run
// at once than full reservations would allow, the pool preempts and
// recomputes when it runs dry (lmpack_preemptions_total counts it), every
// request completes as alone, the pool never exceeds its budget, and
// everything is released at the end. A budget below one full context
// still serves a default request (it finishes "length" when the pool
// cannot hold its next token) instead of refusing it.
func TestPreemptionOnDemand(t *testing.T) {
	m := loadStories(t)
	layers := kvcache.LayersOf(m.Description())
	const ctxLen = 128
	probe, err := kvcache.NewPool("fp32", layers, kvcache.Options{}, 1<<30, 16)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvcache.NewPool("fp32", layers, kvcache.Options{}, probe.BytesFor(ctxLen)*5/2, 16)
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
	var rs []*GenRequest
	var wants [][]int
	for i := 0; i < 8; i++ {
		p := storyTokens(t, 40*i, 4+i)
		r := &GenRequest{ID: fmt.Sprintf("R%d", i), Prompt: p, MaxTokens: ctxLen - len(p), DefaultMaxTokens: true, IgnoreEOS: true, TopLogprobs: -1}
		want, _ := reference(t, m, r, storiesEOS) // before the scheduler owns m
		rs = append(rs, r)
		wants = append(wants, want)
	}
	p := storyTokens(t, 0, 8)
	rS := &GenRequest{ID: "S", Prompt: p, MaxTokens: ctxLen - len(p), DefaultMaxTokens: true, IgnoreEOS: true, TopLogprobs: -1}
	wantS, _ := reference(t, m, rS, storiesEOS)
	s := startSched(t, hm, pool, SchedOptions{MaxBatch: 16, MaxPrefillTokens: 64, MaxQueue: 16, MaxModelLen: ctxLen})
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
		want := wants[i]
		if got.finish.Finish != FinishLength || !equalInts(got.tokens, want) {
			t.Errorf("%s: %d tokens, finish %q (%v); alone: %d tokens, length, equal %v", rs[i].ID, len(got.tokens), got.finish.Finish, got.finish.Err, len(want), equalInts(got.tokens, want))
		}
	}
	if len(over) > 0 {
		t.Errorf("pool over its budget: %v", over)
	}
	if maxSeqs <= 2 {
		t.Errorf("at most %d sequences at once; on demand more than the 2 full contexts the budget holds should run", maxSeqs)
	}
	if n := testutil.ToFloat64(s.met.preemptions); n < 1 {
		t.Errorf("lmpack_preemptions_total %g, want ≥ 1", n)
	}
	if st := pool.Stats(); st.UsedBytes != 0 || st.UsedBlocks != 0 || st.Sequences != 0 {
		t.Errorf("pool at the end: %+v, want nothing used", st)
	}

	// A budget below one full context: a default request is served.
	small, err := kvcache.NewPool("fp32", layers, kvcache.Options{}, probe.BytesFor(ctxLen)/2, 16)
	if err != nil {
		t.Fatal(err)
	}
	s.Drain(context.Background())
	s2 := startSched(t, m, small, SchedOptions{MaxBatch: 4, MaxPrefillTokens: 64, MaxQueue: 4, MaxModelLen: ctxLen})
	r := rS
	ch, err := s2.Submit(context.Background(), r)
	if err != nil {
		t.Fatalf("default request under a budget of half a context: %v, want it served", err)
	}
	got := collect(t, ch)
	if got.finish.Finish != FinishLength || len(got.tokens) < 32 || len(got.tokens) >= r.MaxTokens {
		t.Errorf("S: %d tokens, finish %q (%v); want length after at least 32 and fewer than %d", len(got.tokens), got.finish.Finish, got.finish.Err, r.MaxTokens)
	}
	if !equalInts(got.tokens, wantS[:min(len(got.tokens), len(wantS))]) {
		t.Errorf("S: %v, alone %v", got.tokens, wantS)
	}
	// With an explicit max_tokens the same request can never fit.
	r2 := *r
	r2.DefaultMaxTokens = false
	if _, err := s2.Submit(context.Background(), &r2); !errors.Is(err, ErrNeverFits) {
		t.Errorf("explicit max_tokens %d under half a context: %v, want ErrNeverFits", r2.MaxTokens, err)
	}
}

// TestSchedulerStopStrings: the scheduler ends a request at the token
// whose text completes a stop string (" girl" in the greedy story), with
// finish "stop": that token is the last emitted, no token is sampled
// after it (lmpack_generation_tokens_total), and the finish is counted
// "stop", not "cancelled".
func TestSchedulerStopStrings(t *testing.T) {
	m := loadStories(t)
	tok, err := tokenizer.Load(shared.Path(t, "stories260K-hf", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	prompt := tok.Encode("Once upon a time", true)
	r := &GenRequest{ID: "S", Prompt: prompt, MaxTokens: 100, IgnoreEOS: true, TopLogprobs: -1}
	all, _ := reference(t, m, r, storiesEOS)
	dec := tok.NewStreamDecoderAfter(prompt, true)
	var text string
	k := -1
	for i, id := range all {
		text += dec.Next(id)
		if strings.Contains(text, " girl") {
			k = i
			break
		}
	}
	if k < 0 || k+1 >= len(all) {
		t.Fatalf("the greedy story has no \" girl\" before its end: %q", text)
	}
	s := startSched(t, m, newFakePool(t, m, 1<<30), SchedOptions{MaxBatch: 2, MaxPrefillTokens: 64, MaxQueue: 2})
	r.Stop = []string{"never", " girl"}
	r.StopDecoder = tok.NewStreamDecoderAfter(prompt, true)
	ch, err := s.Submit(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, ch)
	if got.finish.Finish != FinishStop || !equalInts(got.tokens, all[:k+1]) {
		t.Errorf("stop \" girl\": %v, finish %q; want %v, stop", got.tokens, got.finish.Finish, all[:k+1])
	}
	if n := testutil.ToFloat64(s.met.genTokens); n != float64(k+1) {
		t.Errorf("lmpack_generation_tokens_total %g, want %d (nothing sampled after the stop)", n, k+1)
	}
	if st, c := testutil.ToFloat64(s.met.finished.WithLabelValues(FinishStop)), testutil.ToFloat64(s.met.finished.WithLabelValues(FinishCancelled)); st != 1 || c != 0 {
		t.Errorf("finished stop %g, cancelled %g; want 1, 0", st, c)
	}
	if _, err := s.Submit(context.Background(), &GenRequest{ID: "X", Prompt: prompt, MaxTokens: 2, Stop: []string{"a"}, TopLogprobs: -1}); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("Stop without StopDecoder: %v, want ErrInvalidRequest", err)
	}
}
