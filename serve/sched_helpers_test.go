package serve

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// loadStories loads stories260K-hf (vocab 512, eos 2, 5 layers of 4 kv
// heads × head_dim 8) on the CPU backend with one thread.
func loadStories(tb testing.TB) runtime.Model {
	tb.Helper()
	dir := shared.Path(tb, "stories260K-hf")
	d, err := arch.Load(dir)
	if err != nil {
		tb.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer ck.Close()
	m, err := runtime.NewCPU().Load(context.Background(), d, ck, runtime.LoadOptions{Threads: 1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m
}

// storyTokens returns n token ids of the TinyStories validation text from
// offset off (uint16 little endian), with BOS 1 first.
func storyTokens(tb testing.TB, off, n int) []int {
	tb.Helper()
	raw, err := os.ReadFile(shared.Path(tb, "stories260K-hf", "reference", "tinystories_val.tok512.u16"))
	if err != nil {
		tb.Fatal(err)
	}
	if len(raw) < 2*(off+n) {
		tb.Fatalf("tinystories_val.tok512.u16: %d bytes, want ≥ %d", len(raw), 2*(off+n))
	}
	out := []int{1}
	for i := off; i < off+n-1; i++ {
		out = append(out, int(binary.LittleEndian.Uint16(raw[2*i:])))
	}
	return out
}

// fakePool is a KVPool test double over kvcache.New("fp32"): BytesFor is
// ceil(capacity/blockTokens) blocks of blockTokens tokens' float32 K and V
// over all layers; NewCache refuses what the free budget cannot reserve.
// It counts caches handed out and fails the test on a double or foreign
// Release.
type fakePool struct {
	t           testing.TB
	layers      []kvcache.Layer
	blockTokens int
	blockBytes  int64
	budget      int64

	mu       sync.Mutex
	used     int64
	blocks   int
	live     map[runtime.KVCache]int // capacity of every cache not released
	resv     map[runtime.KVCache]int // tokens reserved by every cache not released
	maxLive  int
	newCalls int
}

func newFakePool(t testing.TB, m runtime.Model, budget int64) *fakePool {
	layers := kvcache.LayersOf(m.Description())
	var kv int64
	for _, l := range layers {
		kv += int64(l.NumKVHeads * l.HeadDim)
	}
	const bt = 16
	return &fakePool{t: t, layers: layers, blockTokens: bt, blockBytes: bt * 8 * kv, budget: budget, live: map[runtime.KVCache]int{}, resv: map[runtime.KVCache]int{}}
}

func (p *fakePool) blocksFor(capacity int) int { return (capacity + p.blockTokens - 1) / p.blockTokens }

func (p *fakePool) BytesFor(capacity int) int64 { return int64(p.blocksFor(capacity)) * p.blockBytes }

var errFakePoolFull = errors.New("fake pool full")

func (p *fakePool) BytesForReserve(capacity, tokens int) int64 {
	return p.BytesFor(min(capacity, tokens))
}

func (p *fakePool) NewCache(capacity int) (runtime.KVCache, error) {
	return p.NewCacheReserve(capacity, capacity)
}

func (p *fakePool) NewCacheReserve(capacity, tokens int) (runtime.KVCache, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.newCalls++
	tokens = min(tokens, capacity)
	b := p.BytesFor(tokens)
	if b > p.budget {
		return nil, fmt.Errorf("never fits: %d > %d", b, p.budget)
	}
	if p.used+b > p.budget {
		return nil, fmt.Errorf("%w: %d + %d > %d", errFakePoolFull, p.used, b, p.budget)
	}
	c, err := kvcache.New("fp32", p.layers, capacity, kvcache.Options{})
	if err != nil {
		return nil, err
	}
	p.used += b
	p.blocks += p.blocksFor(tokens)
	p.live[c] = capacity
	p.resv[c] = tokens
	p.maxLive = max(p.maxLive, len(p.live))
	return c, nil
}

func (p *fakePool) Grow(c runtime.KVCache, tokens int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	capacity, ok := p.live[c]
	if !ok {
		p.t.Errorf("fakePool: Grow of a cache not live")
		return errors.New("not live")
	}
	if tokens > capacity {
		return fmt.Errorf("grow to %d beyond capacity %d", tokens, capacity)
	}
	old := p.resv[c]
	if tokens <= old {
		return nil
	}
	d := p.BytesFor(tokens) - p.BytesFor(old)
	if p.used+d > p.budget {
		return fmt.Errorf("%w: grow %d + %d > %d", kvcache.ErrPoolFull, p.used, d, p.budget)
	}
	if c.Len() > old {
		p.t.Errorf("fakePool: cache holds %d tokens, reserved %d", c.Len(), old)
	}
	p.used += d
	p.blocks += p.blocksFor(tokens) - p.blocksFor(old)
	p.resv[c] = tokens
	return nil
}

func (p *fakePool) Release(c runtime.KVCache) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.live[c]
	if !ok {
		p.t.Errorf("fakePool: Release of a cache not live (double or foreign release)")
		return
	}
	tokens := p.resv[c]
	delete(p.live, c)
	delete(p.resv, c)
	p.used -= p.BytesFor(tokens)
	p.blocks -= p.blocksFor(tokens)
}

func (p *fakePool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	total := int(p.budget / p.blockBytes)
	return PoolStats{BlockTokens: p.blockTokens, TotalBlocks: total, UsedBlocks: p.blocks,
		TotalBytes: p.budget, UsedBytes: p.used, FreeBytes: p.budget - p.used, Sequences: len(p.live)}
}

// hookModel wraps a Model: every ForwardBatch call is counted and first
// calls before (when set) with the call's number from 1; before may
// return an error (the call fails) or panic. It runs the wrapped model's
// own ForwardBatch (the real batched forward once the runtime has one).
type hookModel struct {
	runtime.Model
	calls  atomic.Int64
	before func(call int64, seqs []runtime.Seq) error
}

func (h *hookModel) ForwardBatch(ctx context.Context, seqs []runtime.Seq) error {
	n := h.calls.Add(1)
	if h.before != nil {
		if err := h.before(n, seqs); err != nil {
			return err
		}
	}
	return runtime.ForwardBatch(ctx, h.Model, seqs)
}

// reference generates r alone, outside the scheduler: the whole prompt in
// one Forward call on a fresh float32 cache, then one token per call,
// sampling with r's own sampler; it stops as the scheduler does (eos ids,
// stop ids, MaxTokens). It returns the emitted tokens and the finish
// reason.
func reference(tb testing.TB, m runtime.Model, r *GenRequest, eos []int) ([]int, string) {
	tb.Helper()
	V := m.Description().VocabSize
	cache := m.NewCache(len(r.Prompt) + r.MaxTokens)
	logits := make([]float32, V)
	s := runtime.NewSampler(r.Temperature, r.TopP, r.Seed)
	s.TopK = r.TopK
	ctx := context.Background()
	if err := m.Forward(ctx, r.Prompt, cache, logits, false); err != nil {
		tb.Fatal(err)
	}
	var out []int
	for {
		tok := s.Sample(logits)
		stop := false
		for _, id := range r.StopTokenIDs {
			stop = stop || id == tok
		}
		if !r.IgnoreEOS {
			for _, id := range eos {
				stop = stop || id == tok
			}
		}
		if stop {
			return out, FinishStop
		}
		out = append(out, tok)
		if len(out) == r.MaxTokens {
			return out, FinishLength
		}
		if err := m.Forward(ctx, []int{tok}, cache, logits, false); err != nil {
			tb.Fatal(err)
		}
	}
}

// result is what a request's channel delivered.
type result struct {
	tokens []int
	events []Event
	finish Event
}

// collect reads ch to its close; it fails the test when events come
// after the finish event or none has Finish set.
func collect(tb testing.TB, ch <-chan Event) result {
	tb.Helper()
	var r result
	for ev := range ch {
		if r.finish.Finish != "" {
			tb.Errorf("event %+v after the finish event %+v", ev, r.finish)
		}
		if ev.Finish != "" {
			r.finish = ev
			continue
		}
		r.tokens = append(r.tokens, ev.Token)
		r.events = append(r.events, ev)
	}
	if r.finish.Finish == "" {
		tb.Errorf("channel closed without a finish event")
	}
	return r
}

// startSched builds a scheduler and runs it until the test ends.
func startSched(tb testing.TB, m runtime.Model, pool KVPool, opt SchedOptions) *Scheduler {
	tb.Helper()
	s, err := newSched(tb, m, pool, opt, nil)
	if err != nil {
		tb.Fatal(err)
	}
	runSched(tb, s)
	return s
}

// newSched is NewScheduler with the scheduler's log going to tb.Log.
func newSched(tb testing.TB, m runtime.Model, pool KVPool, opt SchedOptions, reg *prometheus.Registry) (*Scheduler, error) {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return NewScheduler(m, pool, opt, reg)
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// runSched runs s.Run in a goroutine until the test ends.
func runSched(tb testing.TB, s *Scheduler) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
