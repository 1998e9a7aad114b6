package serve

import (
	"context"
	"errors"
	"fmt"
	"math"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/runtime"
)

var storiesEOS = []int{2}

// eightRequests returns 8 greedy requests of different prompt lengths
// (from different places of the validation text) and max_tokens.
func eightRequests(t *testing.T) []*GenRequest {
	lens := []int{5, 17, 3, 40, 9, 26, 1, 12}
	maxTok := []int{24, 9, 31, 14, 20, 6, 28, 17}
	var rs []*GenRequest
	for i := range lens {
		rs = append(rs, &GenRequest{ID: fmt.Sprintf("r%d", i), Prompt: storyTokens(t, 100*i+7, lens[i]),
			MaxTokens: maxTok[i], TopLogprobs: -1})
	}
	return rs
}

// TestGreedySameAloneAndInBatch: every one of 8 greedy requests of
// different lengths, joining the batch at different steps and prefilled in
// chunks of at most 7 tokens shared between them, emits exactly the token
// ids it emits run alone (one-shot prefill, one Forward per token).
func TestGreedySameAloneAndInBatch(t *testing.T) {
	m := loadStories(t)
	rs := eightRequests(t)
	want := make([][]int, len(rs))
	wantFin := make([]string, len(rs))
	for i, r := range rs {
		want[i], wantFin[i] = reference(t, m, r, storiesEOS)
		if len(want[i]) < 3 {
			t.Fatalf("%s: reference emits %d tokens; the test needs longer outputs", r.ID, len(want[i]))
		}
	}
	hm := &hookModel{Model: m}
	var mu sync.Mutex
	maxRows := 0
	hm.before = func(_ int64, seqs []runtime.Seq) error {
		mu.Lock()
		defer mu.Unlock()
		maxRows = max(maxRows, len(seqs))
		// Rows of prefill chunks longer than one token (a one-token row
		// may be a decode step) stay within MaxPrefillTokens.
		prefill := 0
		for _, q := range seqs {
			if len(q.Tokens) > 1 {
				prefill += len(q.Tokens)
			}
		}
		if prefill > 7 {
			return fmt.Errorf("%d prompt tokens in one step, MaxPrefillTokens 7", prefill)
		}
		return nil
	}
	pool := newFakePool(t, m, 1<<30)
	s := startSched(t, hm, pool, SchedOptions{MaxBatch: 8, MaxPrefillTokens: 7, MaxQueue: 8})
	ctx := context.Background()
	chans := make([]<-chan Event, len(rs))
	got := make([]result, len(rs))
	var wg sync.WaitGroup
	submit := func(i int) {
		ch, err := s.Submit(ctx, rs[i])
		if err != nil {
			t.Fatal(err)
		}
		chans[i] = ch
	}
	// r0 starts alone; the others join in three waves while r0 decodes.
	submit(0)
	first := <-chans[0]
	submit(1)
	submit(2)
	second := <-chans[0]
	for i := 3; i < 6; i++ {
		submit(i)
	}
	<-chans[1]
	submit(6)
	submit(7)
	for i := range rs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			got[i] = collect(t, chans[i])
		}(i)
	}
	wg.Wait()
	got[0].tokens = append([]int{first.Token, second.Token}, got[0].tokens...)
	// r1 lost its first event above.
	for i := range rs {
		g := got[i].tokens
		w := want[i]
		if i == 1 {
			w = w[1:]
		}
		if !equalInts(g, w) || got[i].finish.Finish != wantFin[i] {
			t.Errorf("%s in the batch: %v (finish %q), alone: %v (finish %q)", rs[i].ID, g, got[i].finish.Finish, w, wantFin[i])
		}
	}
	if maxRows < 4 {
		t.Errorf("at most %d sequences shared a ForwardBatch call; the test wants the requests to overlap", maxRows)
	}
	if st := pool.Stats(); st.UsedBytes != 0 || st.Sequences != 0 {
		t.Errorf("after every request finished the pool holds %d bytes in %d caches, want 0", st.UsedBytes, st.Sequences)
	}
}

// TestChunkedPrefill: a 60-token prompt prefilled 1, 5 or 13 tokens per
// step gives the tokens of a one-shot prefill, the same logprobs within
// 1e-4, and the prompt runs in ceil(60/chunk) chunks.
func TestChunkedPrefill(t *testing.T) {
	m := loadStories(t)
	r := &GenRequest{ID: "c", Prompt: storyTokens(t, 321, 60), MaxTokens: 12, IgnoreEOS: true, TopLogprobs: 2}
	want, _ := reference(t, m, r, storiesEOS)
	oneShot := func() result {
		s := startSched(t, m, newFakePool(t, m, 1<<30), SchedOptions{MaxBatch: 1, MaxPrefillTokens: 512, MaxQueue: 1})
		ch, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		return collect(t, ch)
	}()
	if !equalInts(oneShot.tokens, want) {
		t.Fatalf("one-shot prefill in the scheduler: %v, reference %v", oneShot.tokens, want)
	}
	for _, chunk := range []int{1, 5, 13} {
		hm := &hookModel{Model: m}
		var prefillCalls int
		hm.before = func(_ int64, seqs []runtime.Seq) error {
			if len(seqs[0].Tokens) > chunk {
				return fmt.Errorf("a chunk of %d tokens, max %d", len(seqs[0].Tokens), chunk)
			}
			if seqs[0].Cache.Len() < len(r.Prompt) {
				prefillCalls++
			}
			return nil
		}
		s := startSched(t, hm, newFakePool(t, m, 1<<30), SchedOptions{MaxBatch: 1, MaxPrefillTokens: chunk, MaxQueue: 1})
		ch, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		g := collect(t, ch)
		if !equalInts(g.tokens, want) || g.finish.Finish != FinishLength {
			t.Errorf("chunk %d: tokens %v finish %q (err %v), one-shot %v length", chunk, g.tokens, g.finish.Finish, g.finish.Err, want)
			continue
		}
		if wantCalls := (len(r.Prompt) + chunk - 1) / chunk; prefillCalls != wantCalls {
			t.Errorf("chunk %d: %d prefill calls, want %d", chunk, prefillCalls, wantCalls)
		}
		for i, ev := range g.events {
			o := oneShot.events[i]
			if d := math.Abs(float64(ev.Logprob - o.Logprob)); d > 1e-4 || len(ev.Top) != 2 || ev.Top[0].ID != o.Top[0].ID {
				t.Errorf("chunk %d token %d: logprob %g top %v, one-shot %g top %v", chunk, i, ev.Logprob, ev.Top, o.Logprob, o.Top)
			}
		}
	}
}

// TestSubmitErrors: ErrTooLong, ErrNeverFits, ErrQueueFull,
// ErrInvalidRequest and ErrShuttingDown, each at once from Submit.
func TestSubmitErrors(t *testing.T) {
	m := loadStories(t)
	pool := newFakePool(t, m, 0)
	pool.budget = 4 * pool.blockBytes // 64 tokens
	s, err := newSched(t, m, pool, SchedOptions{MaxBatch: 4, MaxPrefillTokens: 16, MaxQueue: 2, MaxModelLen: 100}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := func(prompt, maxTok int) *GenRequest {
		return &GenRequest{ID: "e", Prompt: storyTokens(t, 0, prompt), MaxTokens: maxTok, TopLogprobs: -1}
	}
	if _, err := s.Submit(ctx, req(90, 11)); !errors.Is(err, ErrTooLong) || !strings.Contains(err.Error(), "101 tokens") {
		t.Errorf("90 + 11 tokens with max model length 100: %v, want ErrTooLong naming 101 tokens", err)
	}
	if _, err := s.Submit(ctx, req(60, 5)); !errors.Is(err, ErrNeverFits) {
		t.Errorf("65 tokens in a 64-token budget: %v, want ErrNeverFits", err)
	}
	for _, bad := range []*GenRequest{nil, {ID: "x", MaxTokens: 1}, {ID: "x", Prompt: []int{512}, MaxTokens: 1},
		{ID: "x", Prompt: []int{1}, MaxTokens: 0}, {ID: "x", Prompt: []int{1}, MaxTokens: 1, Temperature: math.NaN()}} {
		if _, err := s.Submit(ctx, bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Submit(%+v): %v, want ErrInvalidRequest", bad, err)
		}
	}
	// Run is not started: two requests wait, the third finds the queue full.
	var chans []<-chan Event
	for i := 0; i < 2; i++ {
		ch, err := s.Submit(ctx, req(64-10, 10))
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	if _, err := s.Submit(ctx, req(3, 3)); !errors.Is(err, ErrQueueFull) {
		t.Errorf("third request with MaxQueue 2: %v, want ErrQueueFull", err)
	}
	if got := testutil.ToFloat64(s.met.queueDepth); got != 2 {
		t.Errorf("lmpack_queue_depth %g, want 2", got)
	}
	// Drain without Run: nothing runs them, so they are cut when its ctx
	// ends.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Drain(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Drain without Run, ctx cancelled: %v, want an error wrapping context.Canceled", err)
	}
	for i, ch := range chans {
		if r := collect(t, ch); r.finish.Finish != FinishCancelled || len(r.tokens) != 0 {
			t.Errorf("queued request %d after Drain without Run: %v %q, want no tokens, cancelled", i, r.tokens, r.finish.Finish)
		}
	}
	if _, err := s.Submit(ctx, req(3, 3)); !errors.Is(err, ErrShuttingDown) {
		t.Errorf("Submit after Drain: %v, want ErrShuttingDown", err)
	}
	if pool.newCalls != 0 {
		t.Errorf("refused and queued requests took %d caches from the pool, want 0", pool.newCalls)
	}
}

// TestOptionErrors: every bad option is refused naming its field.
func TestOptionErrors(t *testing.T) {
	m := loadStories(t)
	pool := newFakePool(t, m, 1<<20)
	ok := SchedOptions{MaxBatch: 1, MaxPrefillTokens: 1, MaxQueue: 1}
	for _, c := range []struct {
		field string
		edit  func(*SchedOptions)
	}{
		{"MaxBatch", func(o *SchedOptions) { o.MaxBatch = 0 }},
		{"MaxPrefillTokens", func(o *SchedOptions) { o.MaxPrefillTokens = -1 }},
		{"MaxQueue", func(o *SchedOptions) { o.MaxQueue = 0 }},
		{"MaxModelLen", func(o *SchedOptions) { o.MaxModelLen = 513 }}, // max_position_embeddings 512
		{"EOS", func(o *SchedOptions) { o.EOS = []int{2, 600} }},
		{"EventBuffer", func(o *SchedOptions) { o.EventBuffer = -1 }},
	} {
		o := ok
		c.edit(&o)
		_, err := NewScheduler(m, pool, o, nil)
		var fe *field.Error
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: %v, want a field error naming %s", c.field, err, c.field)
		}
	}
	if _, err := NewScheduler(m, newFakePool(t, m, 0), ok, nil); err == nil || !strings.Contains(err.Error(), "budget") {
		t.Errorf("a pool of 0 bytes: %v, want an error naming the budget", err)
	}
	reg := prometheus.NewRegistry()
	if _, err := NewScheduler(m, pool, ok, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewScheduler(m, pool, ok, reg); err == nil {
		t.Errorf("two schedulers on one registry: no error, want the duplicate metric named")
	}
}

// TestFIFOAdmissionUnderBudget: with a budget of two requests, at most two
// caches are live at once, every request completes, and a small request
// queued behind a large one that does not fit yet is not admitted before
// it (strict FIFO, no starvation of the large one).
func TestFIFOAdmissionUnderBudget(t *testing.T) {
	m := loadStories(t)
	pool := newFakePool(t, m, 0)
	pool.budget = 6 * pool.blockBytes // 96 tokens
	hm := &hookModel{Model: m}
	var maxSeqs int
	hm.before = func(_ int64, seqs []runtime.Seq) error {
		maxSeqs = max(maxSeqs, pool.Stats().Sequences)
		if st := pool.Stats(); st.UsedBytes > st.TotalBytes {
			return fmt.Errorf("pool over budget: %+v", st)
		}
		return nil
	}
	s, err := newSched(t, hm, pool, SchedOptions{MaxBatch: 8, MaxPrefillTokens: 16, MaxQueue: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	seen := map[string]bool{}
	s.onSample = func(r *GenRequest) {
		if !seen[r.ID] {
			seen[r.ID] = true
			order = append(order, r.ID)
		}
	}
	ctx := context.Background()
	mk := func(id string, prompt, maxTok int) *GenRequest {
		return &GenRequest{ID: id, Prompt: storyTokens(t, 50, prompt), MaxTokens: maxTok, IgnoreEOS: true, TopLogprobs: -1}
	}
	// A: 48 tokens (3 blocks), B: 64 (4 blocks), C: 16 (1 block). On
	// demand, each is admitted with its prompt and one block (2, 2 and 1
	// blocks), in order; A and B then grow and the pool preempts the
	// latest admitted to let the earlier ones grow.
	rs := []*GenRequest{mk("A", 8, 40), mk("B", 10, 54), mk("C", 4, 12)}
	var wants [][]int
	for _, r := range rs {
		want, _ := reference(t, m, r, storiesEOS) // before Run owns m
		wants = append(wants, want)
	}
	var chans []<-chan Event
	for _, r := range rs {
		ch, err := s.Submit(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	runSched(t, s)
	for i, ch := range chans {
		want := wants[i]
		if r := collect(t, ch); r.finish.Finish != FinishLength || !equalInts(r.tokens, want) {
			t.Errorf("%s: %v, finish %q (%v), want %v (alone), length", rs[i].ID, r.tokens, r.finish.Finish, r.finish.Err, want)
		}
	}
	if strings.Join(order, "") != "ABC" {
		t.Errorf("first tokens in the order %v, want A B C (FIFO)", order)
	}
	if maxSeqs < 2 {
		t.Errorf("B and C never ran together (max %d live caches); the test wants them to", maxSeqs)
	}

}

// TestCancelFreesWithinOneStep: a request cancelled during a ForwardBatch
// call leaves at the next step boundary: at the next call its cache is
// back in the pool, its channel ends with "cancelled", and the other
// request is unaffected.
func TestCancelFreesWithinOneStep(t *testing.T) {
	m := loadStories(t)
	pool := newFakePool(t, m, 1<<30)
	hm := &hookModel{Model: m}
	ctxB, cancelB := context.WithCancel(context.Background())
	defer cancelB()
	a := &GenRequest{ID: "A", Prompt: storyTokens(t, 10, 6), MaxTokens: 30, IgnoreEOS: true, TopLogprobs: -1}
	b := &GenRequest{ID: "B", Prompt: storyTokens(t, 90, 6), MaxTokens: 30, IgnoreEOS: true, TopLogprobs: -1}
	const cancelAt = 5
	var atNext PoolStats
	var rowsNext int
	hm.before = func(call int64, seqs []runtime.Seq) error {
		switch call {
		case cancelAt:
			cancelB()
		case cancelAt + 1:
			atNext, rowsNext = pool.Stats(), len(seqs)
		}
		return nil
	}
	s, err := newSched(t, hm, pool, SchedOptions{MaxBatch: 2, MaxPrefillTokens: 64, MaxQueue: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	chA, err := s.Submit(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	chB, err := s.Submit(ctxB, b)
	if err != nil {
		t.Fatal(err)
	}
	runSched(t, s)
	rb := collect(t, chB)
	ra := collect(t, chA)
	if rb.finish.Finish != FinishCancelled || len(rb.tokens) != cancelAt {
		t.Errorf("B: %d tokens, finish %q; want %d (one per call up to the cancel), cancelled", len(rb.tokens), rb.finish.Finish, cancelAt)
	}
	// A reserves its prompt and one block (6 + 16 tokens), enough for
	// the 6 + 6 it holds then.
	if aResv := pool.BytesForReserve(36, 6+pool.blockTokens); atNext.Sequences != 1 || atNext.UsedBytes != aResv || rowsNext != 1 {
		t.Errorf("at the call after B's cancel: %d live caches, %d bytes used, %d rows; want 1, %d (A's), 1",
			atNext.Sequences, atNext.UsedBytes, rowsNext, aResv)
	}
	want, _ := reference(t, m, a, storiesEOS)
	if !equalInts(ra.tokens, want) || ra.finish.Finish != FinishLength {
		t.Errorf("A beside the cancelled B: %v %q, alone %v length", ra.tokens, ra.finish.Finish, want)
	}
	if st := pool.Stats(); st.UsedBytes != 0 || st.UsedBlocks != 0 || st.Sequences != 0 {
		t.Errorf("pool after both: %+v, want nothing used", st)
	}
	if got := testutil.ToFloat64(s.met.finished.WithLabelValues(FinishCancelled)); got != 1 {
		t.Errorf("lmpack_requests_finished_total{finish=cancelled} %g, want 1", got)
	}
}

// TestPanicAndForwardErrorFailOneRequest: a panic while handling one
// request finishes it with "error" and the others of its batch complete
// as alone; a failing ForwardBatch call fails the requests of that call
// and the loop serves the next request.
func TestPanicAndForwardErrorFailOneRequest(t *testing.T) {
	m := loadStories(t)
	pool := newFakePool(t, m, 1<<30)
	hm := &hookModel{Model: m}
	failCall := int64(-1)
	hm.before = func(call int64, _ []runtime.Seq) error {
		if call == failCall {
			return errors.New("injected forward failure")
		}
		if call == failCall+1 && failCall > 0 {
			panic("injected panic inside ForwardBatch")
		}
		return nil
	}
	s, err := newSched(t, hm, pool, SchedOptions{MaxBatch: 4, MaxPrefillTokens: 64, MaxQueue: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.onSample = func(r *GenRequest) {
		if r.ID == "bad" {
			panic("injected panic in one request")
		}
	}
	runSched(t, s)
	ctx := context.Background()
	good := &GenRequest{ID: "good", Prompt: storyTokens(t, 40, 5), MaxTokens: 15, IgnoreEOS: true, TopLogprobs: -1}
	bad := &GenRequest{ID: "bad", Prompt: storyTokens(t, 80, 5), MaxTokens: 15, TopLogprobs: -1}
	chG, err := s.Submit(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	chB, err := s.Submit(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	rb, rg := collect(t, chB), collect(t, chG)
	if rb.finish.Finish != FinishError || rb.finish.Err == nil || !strings.Contains(rb.finish.Err.Error(), "injected panic") || len(rb.tokens) != 0 {
		t.Errorf("bad: %v, finish %q err %v; want no token, error naming the panic", rb.tokens, rb.finish.Finish, rb.finish.Err)
	}
	want, _ := reference(t, m, good, storiesEOS)
	if !equalInts(rg.tokens, want) || rg.finish.Finish != FinishLength {
		t.Errorf("good beside the panicking request: %v %q, alone %v", rg.tokens, rg.finish.Finish, want)
	}
	// The next call fails, the one after panics: both requests of each fail.
	failCall = hm.calls.Load() + 1
	for round := 0; round < 2; round++ {
		ch, err := s.Submit(ctx, good)
		if err != nil {
			t.Fatal(err)
		}
		r := collect(t, ch)
		wantMsg := []string{"injected forward failure", "panic in ForwardBatch"}[round]
		if r.finish.Finish != FinishError || r.finish.Err == nil || !strings.Contains(r.finish.Err.Error(), wantMsg) {
			t.Errorf("round %d: finish %q err %v, want error naming %q", round, r.finish.Finish, r.finish.Err, wantMsg)
		}
	}
	ch, err := s.Submit(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, ch); !equalInts(r.tokens, want) {
		t.Errorf("after the failures: %v, want %v", r.tokens, want)
	}
	if st := pool.Stats(); st.Sequences != 0 || st.UsedBytes != 0 {
		t.Errorf("pool after failures: %+v, want empty", st)
	}
	if got := testutil.ToFloat64(s.met.finished.WithLabelValues(FinishError)); got != 3 {
		t.Errorf("lmpack_requests_finished_total{finish=error} %g, want 3", got)
	}
}

// TestDrain: Drain lets running and queued requests finish and refuses new
// ones; a Drain whose ctx ends cancels what is left and says so.
func TestDrain(t *testing.T) {
	m := loadStories(t)
	pool := newFakePool(t, m, 1<<30)
	s := startSched(t, m, pool, SchedOptions{MaxBatch: 1, MaxPrefillTokens: 64, MaxQueue: 4})
	ctx := context.Background()
	var chans []<-chan Event
	for i := 0; i < 3; i++ {
		ch, err := s.Submit(ctx, &GenRequest{ID: fmt.Sprint(i), Prompt: storyTokens(t, 10*i, 4), MaxTokens: 10, IgnoreEOS: true, TopLogprobs: -1})
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	if err := s.Drain(ctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	for i, ch := range chans {
		// Drain returned: every channel already holds its whole output.
		if r := collect(t, ch); r.finish.Finish != FinishLength || len(r.tokens) != 10 {
			t.Errorf("request %d: %d tokens %q, want 10 length", i, len(r.tokens), r.finish.Finish)
		}
	}
	if _, err := s.Submit(ctx, &GenRequest{Prompt: []int{1}, MaxTokens: 1}); !errors.Is(err, ErrShuttingDown) {
		t.Errorf("Submit while draining: %v, want ErrShuttingDown", err)
	}

	// Cut: the deadline comes while a request runs and one waits.
	hm := &hookModel{Model: m}
	dctx, dcancel := context.WithCancel(ctx)
	var s2 *Scheduler
	hm.before = func(call int64, _ []runtime.Seq) error {
		if call == 3 {
			// The deadline comes during call 3; wait until Drain saw it,
			// so that the cut happens at the boundary after this call.
			dcancel()
			for cut := false; !cut; {
				s2.mu.Lock()
				cut = s2.cut
				s2.mu.Unlock()
				goruntime.Gosched()
			}
		}
		return nil
	}
	s2 = startSched(t, hm, pool, SchedOptions{MaxBatch: 1, MaxPrefillTokens: 64, MaxQueue: 4})
	chans = chans[:0]
	for i := 0; i < 2; i++ {
		ch, err := s2.Submit(ctx, &GenRequest{ID: fmt.Sprint(i), Prompt: storyTokens(t, 10*i, 4), MaxTokens: 50, IgnoreEOS: true, TopLogprobs: -1})
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	err := s2.Drain(dctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Drain past its deadline: %v, want an error wrapping context.Canceled", err)
	}
	r0, r1 := collect(t, chans[0]), collect(t, chans[1])
	if r0.finish.Finish != FinishCancelled || len(r0.tokens) != 3 || r1.finish.Finish != FinishCancelled || len(r1.tokens) != 0 {
		t.Errorf("cut: running request %d tokens %q, queued %d tokens %q; want 3 cancelled, 0 cancelled",
			len(r0.tokens), r0.finish.Finish, len(r1.tokens), r1.finish.Finish)
	}
	if st := pool.Stats(); st.Sequences != 0 || st.UsedBytes != 0 {
		t.Errorf("pool after the cut: %+v, want empty", st)
	}
}

// TestSamplingReproducible: a sampled request (temperature, top-p, top-k,
// seed) draws the same tokens alone, in the scheduler alone and in a batch
// with others; another seed draws others; TopK 1 is greedy.
func TestSamplingReproducible(t *testing.T) {
	m := loadStories(t)
	mk := func(id string, seed uint64, topK int) *GenRequest {
		return &GenRequest{ID: id, Prompt: storyTokens(t, 500, 9), MaxTokens: 40, IgnoreEOS: true,
			Temperature: 1.1, TopP: 0.95, TopK: topK, Seed: seed, TopLogprobs: -1}
	}
	r := mk("s", 7, 40)
	want, _ := reference(t, m, r, storiesEOS)
	other, _ := reference(t, m, mk("s8", 8, 40), storiesEOS)
	if equalInts(want, other) {
		t.Fatalf("seeds 7 and 8 draw the same 40 tokens: %v", want)
	}
	s := startSched(t, m, newFakePool(t, m, 1<<30), SchedOptions{MaxBatch: 8, MaxPrefillTokens: 64, MaxQueue: 8})
	ctx := context.Background()
	var chans []<-chan Event
	for _, q := range append([]*GenRequest{r}, eightRequests(t)[:5]...) {
		ch, err := s.Submit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	greedy := mk("k1", 3, 1)
	chK, err := s.Submit(ctx, greedy)
	if err != nil {
		t.Fatal(err)
	}
	got := collect(t, chans[0])
	for _, ch := range chans[1:] {
		collect(t, ch)
	}
	if !equalInts(got.tokens, want) {
		t.Errorf("seed 7 in a batch of 7: %v, alone %v", got.tokens, want)
	}
	gotK := collect(t, chK)
	g := *greedy
	g.Temperature = 0
	wantK, _ := reference(t, m, &g, storiesEOS)
	if !equalInts(gotK.tokens, wantK) {
		t.Errorf("top_k 1 at temperature 1.1: %v, greedy %v", gotK.tokens, wantK)
	}
}

// TestLogprobs: greedy events carry the log-softmax of the sampled token,
// equal to the first of the top alternatives, which are sorted, ≤ 0, and
// whose exponentials sum to at most 1.
func TestLogprobs(t *testing.T) {
	m := loadStories(t)
	s := startSched(t, m, newFakePool(t, m, 1<<30), SchedOptions{MaxBatch: 1, MaxPrefillTokens: 64, MaxQueue: 1})
	ch, err := s.Submit(context.Background(), &GenRequest{ID: "l", Prompt: storyTokens(t, 0, 8), MaxTokens: 6, IgnoreEOS: true, TopLogprobs: 5})
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, ch)
	for i, ev := range r.events {
		if len(ev.Top) != 5 || ev.Top[0].ID != ev.Token || ev.Top[0].Logprob != ev.Logprob {
			t.Fatalf("token %d: %d logprob %g, top %v; want 5 alternatives led by the sampled token", i, ev.Token, ev.Logprob, ev.Top)
		}
		var mass float64
		for j, tl := range ev.Top {
			if tl.Logprob > 0 || (j > 0 && tl.Logprob > ev.Top[j-1].Logprob) {
				t.Fatalf("token %d: top %v not sorted or > 0", i, ev.Top)
			}
			mass += math.Exp(float64(tl.Logprob))
		}
		if mass > 1+1e-6 || mass <= 0 {
			t.Fatalf("token %d: top-5 probability mass %g", i, mass)
		}
	}
	// logprobs against a direct float64 log-softmax, and top-k selection
	// with ties against sorting.
	logits := []float32{0.5, 2, -1, 2, 0.25, 2}
	lp, top := logprobs(logits, 4, 4)
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l))
	}
	if want := 0.25 - math.Log(sum); math.Abs(float64(lp)-want) > 1e-6 {
		t.Errorf("logprob %g, want %g", lp, want)
	}
	if ids := []int{top[0].ID, top[1].ID, top[2].ID, top[3].ID}; !equalInts(ids, []int{1, 3, 5, 0}) {
		t.Errorf("top 4 ids %v, want [1 3 5 0] (ties to the lowest id)", ids)
	}
}

// TestMetricsAfterRun: after 8 requests the counters, histograms and
// gauges hold what the run did.
func TestMetricsAfterRun(t *testing.T) {
	m := loadStories(t)
	pool := newFakePool(t, m, 1<<30)
	reg := prometheus.NewRegistry()
	s, err := newSched(t, m, pool, SchedOptions{MaxBatch: 8, MaxPrefillTokens: 10, MaxQueue: 8}, reg)
	if err != nil {
		t.Fatal(err)
	}
	runSched(t, s)
	rs := eightRequests(t)
	var prompt, gen, itl int
	fin := map[string]int{}
	var chans []<-chan Event
	for _, r := range rs {
		ch, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	for i, ch := range chans {
		r := collect(t, ch)
		prompt += len(rs[i].Prompt)
		n := len(r.tokens)
		if r.finish.Finish == FinishStop {
			n++ // the EOS token was sampled, not emitted
		}
		gen += n
		itl += n - 1
		fin[r.finish.Finish]++
	}
	// The loop sets the gauges after the step that finished the last
	// request; Drain waits for it.
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.Metric{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range mt.GetLabel() {
				key += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			byName[key] = mt
		}
	}
	val := func(key string) float64 {
		mt, ok := byName[key]
		switch {
		case !ok:
			t.Errorf("metric %s not gathered", key)
			return math.NaN()
		case mt.Counter != nil:
			return mt.Counter.GetValue()
		case mt.Gauge != nil:
			return mt.Gauge.GetValue()
		case mt.Histogram != nil:
			return float64(mt.Histogram.GetSampleCount())
		}
		return math.NaN()
	}
	for _, c := range []struct {
		key  string
		want float64
	}{
		{"lmpack_prompt_tokens_total", float64(prompt)},
		{"lmpack_generation_tokens_total", float64(gen)},
		{"lmpack_time_to_first_token_seconds", 8},
		{"lmpack_inter_token_latency_seconds", float64(itl)},
		{"lmpack_requests_finished_total{finish=stop}", float64(fin[FinishStop])},
		{"lmpack_requests_finished_total{finish=length}", float64(fin[FinishLength])},
		{"lmpack_requests_finished_total{finish=cancelled}", 0},
		{"lmpack_requests_finished_total{finish=error}", 0},
		{"lmpack_queue_depth", 0},
		{"lmpack_running_sequences", 0},
		{"lmpack_kv_blocks_used", 0},
		{"lmpack_kv_blocks_free", float64(pool.Stats().TotalBlocks)},
		{"lmpack_kv_bytes_used", 0},
		{"lmpack_kv_bytes_total", 1 << 30},
	} {
		if got := val(c.key); got != c.want {
			t.Errorf("%s = %g, want %g", c.key, got, c.want)
		}
	}
	if fin[FinishLength]+fin[FinishStop] != 8 {
		t.Errorf("finish reasons %v, want 8 stop or length", fin)
	}
}

// TestPoolInvariant: the step loop's assertion fails loudly when the pool
// reports more bytes used than its budget.
func TestPoolInvariant(t *testing.T) {
	if err := checkPool(PoolStats{TotalBytes: 100, UsedBytes: 100, TotalBlocks: 4, UsedBlocks: 4}); err != nil {
		t.Errorf("a full pool: %v, want no error", err)
	}
	if err := checkPool(PoolStats{TotalBytes: 100, UsedBytes: 101}); err == nil || !strings.Contains(err.Error(), "over-allocated") {
		t.Errorf("101 of 100 bytes: %v, want an over-allocation error", err)
	}
	m := loadStories(t)
	pool := newFakePool(t, m, 1<<20)
	s, err := newSched(t, m, pool, SchedOptions{MaxBatch: 1, MaxPrefillTokens: 1, MaxQueue: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pool.used = pool.budget + 1 // a pool that lies
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "over-allocated") {
			t.Errorf("updateGauges on an over-allocated pool: recovered %v, want a panic naming it", p)
		}
	}()
	s.updateGauges()
}

// TestStopTokens: a stop token id and an EOS id end the request with
// "stop" and are not emitted; IgnoreEOS ignores the EOS id but not the
// stop ids; MaxTokens ends it with "length".
func TestStopTokens(t *testing.T) {
	m := loadStories(t)
	base := &GenRequest{ID: "t", Prompt: storyTokens(t, 700, 10), MaxTokens: 30, IgnoreEOS: true, TopLogprobs: -1}
	full, _ := reference(t, m, base, storiesEOS)
	// The first token that does not occur before it, at position ≥ 3.
	at := -1
	for i := 3; i < len(full) && at < 0; i++ {
		if !slices.Contains(full[:i], full[i]) {
			at = i
		}
	}
	if at < 0 {
		t.Fatalf("no fresh token in %v", full)
	}
	stopTok := full[at]
	s := startSched(t, m, newFakePool(t, m, 1<<30), SchedOptions{MaxBatch: 4, MaxPrefillTokens: 64, MaxQueue: 4, EOS: []int{stopTok}})
	run := func(edit func(r *GenRequest)) result {
		r := *base
		edit(&r)
		ch, err := s.Submit(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		return collect(t, ch)
	}
	for _, c := range []struct {
		name   string
		edit   func(r *GenRequest)
		n      int
		finish string
	}{
		{"stop id", func(r *GenRequest) { r.StopTokenIDs = []int{999, stopTok} }, at, FinishStop},
		{"eos", func(r *GenRequest) { r.IgnoreEOS = false }, at, FinishStop},
		{"ignore eos", func(r *GenRequest) {}, len(full), FinishLength},
		{"stop id despite ignore eos", func(r *GenRequest) { r.StopTokenIDs = []int{stopTok} }, at, FinishStop},
		{"max tokens", func(r *GenRequest) { r.MaxTokens = at }, at, FinishLength},
	} {
		got := run(c.edit)
		if !equalInts(got.tokens, full[:c.n]) || got.finish.Finish != c.finish {
			t.Errorf("%s: %v %q, want %v %q", c.name, got.tokens, got.finish.Finish, full[:c.n], c.finish)
		}
	}
}

// TestSlowConsumer: with EventBuffer 3 a consumer that reads nothing is
// cut after 3 tokens (ErrSlowConsumer) and its cache freed; with the
// default a consumer reading only at the end gets the whole output.
func TestSlowConsumer(t *testing.T) {
	m := loadStories(t)
	pool := newFakePool(t, m, 1<<30)
	r := &GenRequest{ID: "slow", Prompt: storyTokens(t, 5, 5), MaxTokens: 20, IgnoreEOS: true, TopLogprobs: -1}
	want, _ := reference(t, m, r, storiesEOS)
	for _, c := range []struct {
		buf    int
		n      int
		finish string
	}{{3, 3, FinishError}, {0, 20, FinishLength}} {
		s := startSched(t, m, pool, SchedOptions{MaxBatch: 1, MaxPrefillTokens: 64, MaxQueue: 1, EventBuffer: c.buf})
		ch, err := s.Submit(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		if cap(ch) != c.n+1 {
			t.Errorf("EventBuffer %d: channel capacity %d, want %d", c.buf, cap(ch), c.n+1)
		}
		// Read nothing until the request is over.
		if err := s.Drain(context.Background()); err != nil {
			t.Fatal(err)
		}
		got := collect(t, ch)
		if !equalInts(got.tokens, want[:c.n]) || got.finish.Finish != c.finish {
			t.Errorf("EventBuffer %d: %v %q, want %v %q", c.buf, got.tokens, got.finish.Finish, want[:c.n], c.finish)
		}
		if c.finish == FinishError && !errors.Is(got.finish.Err, ErrSlowConsumer) {
			t.Errorf("EventBuffer %d: err %v, want ErrSlowConsumer", c.buf, got.finish.Err)
		}
		if st := pool.Stats(); st.Sequences != 0 {
			t.Errorf("EventBuffer %d: %d caches live after the request, want 0", c.buf, st.Sequences)
		}
	}
}

// poisonModel sets the first logit of every sequence whose new tokens
// include marker to NaN after the wrapped model's forward: a forward
// pass that overflowed for that request alone.
type poisonModel struct {
	runtime.Model
	marker int
}

func (p *poisonModel) ForwardBatch(ctx context.Context, seqs []runtime.Seq) error {
	if err := runtime.ForwardBatch(ctx, p.Model, seqs); err != nil {
		return err
	}
	for _, q := range seqs {
		if slices.Contains(q.Tokens, p.marker) {
			q.Logits[0] = float32(math.NaN())
		}
	}
	return nil
}

// TestNonFiniteLogitsFailTheRequest: a request whose logits come back NaN
// finishes with "error" naming the overflow, emitting no token; a request
// batched with it is unaffected (the tokens it emits alone).
func TestNonFiniteLogitsFailTheRequest(t *testing.T) {
	m := loadStories(t)
	marker := m.Description().VocabSize - 1
	good := &GenRequest{ID: "good", Prompt: storyTokens(t, 7, 9), MaxTokens: 12, TopLogprobs: -1}
	if slices.Contains(good.Prompt, marker) {
		t.Fatalf("the good prompt holds the marker id %d", marker)
	}
	want, _ := reference(t, m, good, storiesEOS)
	bad := &GenRequest{ID: "bad", Prompt: append(storyTokens(t, 300, 5), marker), MaxTokens: 12, TopLogprobs: -1}
	s := startSched(t, &poisonModel{Model: m, marker: marker}, newFakePool(t, m, 1<<30), SchedOptions{MaxBatch: 4, MaxPrefillTokens: 64, MaxQueue: 4})
	ctx := context.Background()
	chBad, err := s.Submit(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	chGood, err := s.Submit(ctx, good)
	if err != nil {
		t.Fatal(err)
	}
	rb, rg := collect(t, chBad), collect(t, chGood)
	if rb.finish.Finish != FinishError || rb.finish.Err == nil || !strings.Contains(rb.finish.Err.Error(), "logit 0 is NaN: the forward pass overflowed") || len(rb.tokens) != 0 {
		t.Errorf("poisoned request: finish %q err %v, %d tokens; want error naming logit 0 NaN, no token", rb.finish.Finish, rb.finish.Err, len(rb.tokens))
	}
	if !equalInts(rg.tokens, want) {
		t.Errorf("batched good request: %v, want %v (alone)", rg.tokens, want)
	}
}
