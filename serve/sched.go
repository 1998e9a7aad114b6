package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// ErrSlowConsumer is the Err of a request finished with "error" because
// its consumer left SchedOptions.EventBuffer token events unread.
var ErrSlowConsumer = errors.New("serve: the request's events were not read (slow consumer)")

// ErrInvalidRequest is wrapped by Submit for a GenRequest the HTTP layer
// should have refused (no prompt, a token id out of range, max_tokens < 1,
// a negative temperature, …); the error names the field.
var ErrInvalidRequest = errors.New("serve: invalid generation request")

// SchedOptions configures NewScheduler. The Go field names appear in its
// errors (internal/field); the command renames them to its flags.
type SchedOptions struct {
	// MaxBatch is the most sequences in the running batch at once (each
	// holding its KV reservation), ≥ 1.
	MaxBatch int
	// MaxPrefillTokens is the most prompt tokens one step runs over all
	// prefilling sequences together (chunked prefill), ≥ 1. Decode rows
	// (one token per decoding sequence) are not counted.
	MaxPrefillTokens int
	// MaxQueue is the most requests waiting for admission, ≥ 1; Submit
	// beyond it returns ErrQueueFull.
	MaxQueue int
	// MaxModelLen bounds prompt + max_tokens of a request, in tokens; 0
	// means the model's max_position_embeddings. It must not exceed
	// max_position_embeddings.
	MaxModelLen int
	// EOS lists the end-of-sequence token ids (finish "stop" unless a
	// request sets IgnoreEOS); nil means the model's eos_token_id list.
	EOS []int
	// EventBuffer bounds the token events buffered for one request's
	// consumer: a request whose consumer leaves that many unread when the
	// next token comes finishes with "error" (ErrSlowConsumer) and frees
	// its cache. 0 means MaxTokens: the channel holds the whole output
	// and no consumer is ever cut (memory: (MaxTokens+1) Events of about
	// 72 bytes each, allocated at Submit, per queued or running request).
	EventBuffer int
	// Logger receives the scheduler's records (admission and finish at
	// Debug, panics and forward errors at Error; never prompt text); nil
	// means slog.Default().
	Logger *slog.Logger
}

// Scheduler is the continuous-batching step loop of lmpack serve: it
// implements Submitter. One goroutine runs Run; Submit and Drain may be
// called from any goroutine.
//
// Admission (allocation on demand, vLLM's policy): a request leaving the
// queue gets a cache of capacity len(Prompt)+MaxTokens that reserves only
// its fixed bytes and the blocks of its prompt plus one block
// (pool.NewCacheReserve); before each decode step the scheduler grows
// every decoding sequence's reservation to the tokens it will hold after
// the step (pool.Grow, a block at a time), so a request that stops early
// never held memory for tokens it did not produce, and a request without
// max_tokens costs no more than what it generates. Stats().UsedBytes never
// exceeds the budget.
//
// Preemption: when the pool cannot grow a running sequence, the most
// recently admitted running sequence (possibly that one) is preempted:
// its cache is released, and it goes back to the head of the queue with
// the tokens it generated appended to its prompt; on re-admission that
// text is prefilled again (recomputation, as vLLM's default preemption
// mode) and generation resumes: its client sees no gap, its events just
// continue, and its sampler's state carries over. Preemptions are counted
// in lmpack_preemptions_total. A sequence running alone that cannot grow
// (the whole budget is smaller than its length) finishes "length".
// Recomputation changes nothing with an fp32 or fp16 cache, but with a
// quantized KV cache the recomputed prefill reads its own tokens through
// fresh fp32 K/V (runtime Forward's served semantics) where the
// uninterrupted sequence had read them quantized, so the greedy output of
// a preempted request may differ from an uninterrupted one. Otherwise
// greedy output does not depend on the batch.
//
// Order: strict FIFO. Only the head of the queue is admitted; while it does
// not fit in the free budget (or MaxBatch sequences run), no later request
// is admitted, even one that would fit. A request therefore waits only for
// those queued before it (no starvation by a stream of later, smaller
// requests), at the price of head-of-line blocking (vLLM's default "fcfs"
// policy stops at the first waiting request it cannot allocate too).
//
// Each step, at its boundary: requests whose ctx ended are finished
// "cancelled" and their caches released; queued requests are admitted;
// then ONE runtime.ForwardBatch call runs every decoding sequence's next
// token and prefill chunks of at most MaxPrefillTokens prompt tokens in
// all (oldest admitted first), and each sequence that got a logits row it
// needs (a chunk ending its prompt, a decode row) samples its next token.
//
// Events: the step loop never blocks on a consumer. A request's channel
// has capacity min(MaxTokens, EventBuffer)+1, one slot always kept for the
// finish event; by default (EventBuffer 0) that is MaxTokens+1, the whole
// output, and a consumer that stops reading only costs that buffer until
// it cancels its ctx. With EventBuffer > 0 a consumer that falls that many
// tokens behind is cut: the request finishes "error" with
// ErrSlowConsumer.
type Scheduler struct {
	m      runtime.Model
	pool   KVPool
	opt    SchedOptions
	vocab  int
	eos    []int
	budget int64
	// blockTokens is the pool's block: admission reserves the prompt
	// plus one block.
	blockTokens int
	met         *schedMetrics
	log         *slog.Logger

	// poolMu serializes pool calls (Submit's BytesFor, the loop's).
	poolMu sync.Mutex

	mu         sync.Mutex
	queue      []*request
	started    bool
	stopped    bool // Run returned
	draining   bool // Drain called: Submit refuses
	cut        bool // Drain's ctx ended: cancel everything left
	idleClosed bool
	wake       chan struct{} // capacity 1: "something changed"
	idle       chan struct{} // closed when draining and nothing is left
	done       chan struct{} // closed when Run returns

	// running and seqs are the step loop's (Run's goroutine only).
	running []*request
	seqs    []runtime.Seq

	// onSample, when set (tests), is called while handling a request's
	// sampled token, inside that request's panic recovery.
	onSample func(r *GenRequest)
}

// request is one submitted GenRequest's state.
type request struct {
	r         *GenRequest
	ctx       context.Context
	ch        chan Event
	tokCap    int   // token events the channel may hold; one more slot for the finish
	need      int   // KV capacity: len(Prompt) + MaxTokens
	toks      []int // tokens to prefill: the prompt, plus the generated tokens after a preemption
	out       []int // tokens generated (events sent), kept for recomputation
	resv      int   // tokens the cache reserves
	preempted int   // times preempted
	// stopTail is the end of the decoded text (at most the longest stop
	// string − 1 bytes kept between tokens), maxStop that length.
	stopTail  []byte
	maxStop   int
	cache     runtime.KVCache
	logits    []float32 // [vocab]
	sampler   *runtime.Sampler
	done      int // prompt tokens in the cache
	gen       int // tokens sampled
	next      [1]int
	chunk     int // prompt tokens in this step's Seq; 0: a decode row
	submitted time.Time
	last      time.Time // when the previous token was sampled
	finished  bool
}

// NewScheduler returns a scheduler running m with KV caches from pool and
// its metrics (lmpack_*, metrics.go) registered on reg (nil: a private
// registry). The scheduler owns m and pool from now on: nothing else may
// call Forward on m or take caches from pool. Errors: an option out of
// range, as an internal/field error naming the SchedOptions field
// ("MaxBatch 0: want ≥ 1"); an EOS id outside [0, vocab); a pool with no
// budget; a metric already registered on reg.
func NewScheduler(m runtime.Model, pool KVPool, opt SchedOptions, reg *prometheus.Registry) (*Scheduler, error) {
	if m == nil || pool == nil {
		return nil, errors.New("serve: NewScheduler needs a model and a KV pool")
	}
	d := m.Description()
	if opt.MaxModelLen == 0 {
		opt.MaxModelLen = d.MaxPositionEmbeddings
	}
	if opt.EOS == nil {
		opt.EOS = append([]int(nil), d.EOSTokenIDs...)
	}
	var err error
	switch {
	case opt.MaxBatch < 1:
		err = field.New("MaxBatch", opt.MaxBatch, "≥ 1 sequence")
	case opt.MaxPrefillTokens < 1:
		err = field.New("MaxPrefillTokens", opt.MaxPrefillTokens, "≥ 1 token")
	case opt.MaxQueue < 1:
		err = field.New("MaxQueue", opt.MaxQueue, "≥ 1 request")
	case opt.EventBuffer < 0:
		err = field.New("EventBuffer", opt.EventBuffer, "≥ 0 events (0: MaxTokens)")
	case opt.MaxModelLen < 1:
		err = field.New("MaxModelLen", opt.MaxModelLen, "≥ 1 token (0: the model's max_position_embeddings, which it does not give)")
	case d.MaxPositionEmbeddings > 0 && opt.MaxModelLen > d.MaxPositionEmbeddings:
		err = field.New("MaxModelLen", opt.MaxModelLen, fmt.Sprintf("≤ the model's max_position_embeddings %d", d.MaxPositionEmbeddings))
	}
	for _, id := range opt.EOS {
		if err == nil && (id < 0 || id >= d.VocabSize) {
			err = field.New("EOS", id, fmt.Sprintf("token ids in [0, vocab_size %d)", d.VocabSize))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("serve: scheduler options: %w", err)
	}
	st := pool.Stats()
	if st.TotalBytes <= 0 {
		return nil, fmt.Errorf("serve: KV pool budget %d bytes: want > 0", st.TotalBytes)
	}
	if err := checkPool(st); err != nil {
		return nil, err
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	met, err := newSchedMetrics(reg)
	if err != nil {
		return nil, err
	}
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Scheduler{
		m: m, pool: pool, opt: opt, vocab: d.VocabSize, eos: opt.EOS, budget: st.TotalBytes, blockTokens: max(1, st.BlockTokens), met: met, log: log,
		wake: make(chan struct{}, 1), idle: make(chan struct{}), done: make(chan struct{}),
	}
	met.setPool(st)
	return s, nil
}

// checkPool is the scheduler's internal assertion on the pool: its used
// bytes and blocks never exceed its budget. Run panics when it fails.
func checkPool(st PoolStats) error {
	if st.UsedBytes < 0 || st.UsedBytes > st.TotalBytes || st.UsedBlocks < 0 || (st.TotalBlocks > 0 && st.UsedBlocks > st.TotalBlocks) {
		return fmt.Errorf("serve: KV pool over-allocated: %d of %d bytes and %d of %d blocks used (internal error: admission must never exceed the budget)",
			st.UsedBytes, st.TotalBytes, st.UsedBlocks, st.TotalBlocks)
	}
	return nil
}

// CountRejected implements RejectCounter: reason is one of the
// lmpack_requests_rejected_total labels (queue_full, never_fits,
// too_long, shutting_down, invalid); another is counted as invalid.
func (s *Scheduler) CountRejected(reason string) {
	switch reason {
	case "queue_full", "never_fits", "too_long", "shutting_down":
	default:
		reason = "invalid"
	}
	s.met.rejected.WithLabelValues(reason).Inc()
}

// Submit implements Submitter: it checks r, queues it and returns the
// channel of its events (capacity min(r.MaxTokens, EventBuffer)+1). r must not be changed
// afterwards. Errors (checked in this order): ErrInvalidRequest (wrapped,
// naming the field), ErrTooLong (len(Prompt)+MaxTokens > MaxModelLen),
// ErrNeverFits (pool.BytesFor(len(Prompt)+MaxTokens) > the whole budget),
// ErrShuttingDown (Drain was called or Run returned), ErrQueueFull
// (MaxQueue requests wait). The returned errors wrap these sentinels with
// the numbers (tokens, bytes) in the message.
func (s *Scheduler) Submit(ctx context.Context, r *GenRequest) (<-chan Event, error) {
	if err := s.checkRequest(r); err != nil {
		s.met.rejected.WithLabelValues("invalid").Inc()
		return nil, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	need := len(r.Prompt) + r.MaxTokens
	if need > s.opt.MaxModelLen {
		s.met.rejected.WithLabelValues("too_long").Inc()
		return nil, fmt.Errorf("%w: request %s: prompt %d + max_tokens %d = %d tokens, the max model length is %d",
			ErrTooLong, r.ID, len(r.Prompt), r.MaxTokens, need, s.opt.MaxModelLen)
	}
	fit := need
	if r.DefaultMaxTokens {
		fit = len(r.Prompt) + 1
	}
	s.poolMu.Lock()
	b := s.pool.BytesForReserve(need, fit)
	s.poolMu.Unlock()
	if b > s.budget {
		s.met.rejected.WithLabelValues("never_fits").Inc()
		return nil, fmt.Errorf("%w: request %s: %d tokens need %d bytes of KV memory, the whole budget is %d bytes",
			ErrNeverFits, r.ID, fit, b, s.budget)
	}
	tokCap := r.MaxTokens
	if s.opt.EventBuffer > 0 {
		tokCap = min(tokCap, s.opt.EventBuffer)
	}
	q := &request{r: r, ctx: ctx, ch: make(chan Event, tokCap+1), tokCap: tokCap, need: need, toks: r.Prompt, submitted: time.Now()}
	for _, st := range r.Stop {
		q.maxStop = max(q.maxStop, len(st))
	}
	s.mu.Lock()
	if s.draining || s.stopped {
		s.mu.Unlock()
		s.met.rejected.WithLabelValues("shutting_down").Inc()
		return nil, fmt.Errorf("%w: request %s", ErrShuttingDown, r.ID)
	}
	if len(s.queue) >= s.opt.MaxQueue {
		s.mu.Unlock()
		s.met.rejected.WithLabelValues("queue_full").Inc()
		return nil, fmt.Errorf("%w: %d requests wait (max %d)", ErrQueueFull, s.opt.MaxQueue, s.opt.MaxQueue)
	}
	s.queue = append(s.queue, q)
	s.met.queueDepth.Set(float64(len(s.queue)))
	s.mu.Unlock()
	s.wakeUp()
	return q.ch, nil
}

// checkRequest refuses what the HTTP layer should have refused.
func (s *Scheduler) checkRequest(r *GenRequest) error {
	bad := func(f string, v any, want string) error {
		id := ""
		if r != nil {
			id = r.ID
		}
		return fmt.Errorf("%w %s: %s %v: want %s", ErrInvalidRequest, id, f, v, want)
	}
	switch {
	case r == nil:
		return bad("request", nil, "a *GenRequest")
	case len(r.Prompt) == 0:
		return bad("Prompt", "(empty)", "≥ 1 token id")
	case r.MaxTokens < 1:
		return bad("MaxTokens", r.MaxTokens, "≥ 1")
	case !(r.Temperature >= 0) || math.IsInf(r.Temperature, 0):
		return bad("Temperature", r.Temperature, "a finite value ≥ 0")
	case !(r.TopP >= 0 && r.TopP <= 1):
		return bad("TopP", r.TopP, "in [0, 1]")
	case r.TopK < 0:
		return bad("TopK", r.TopK, "≥ 0")
	case r.TopLogprobs > s.vocab:
		return bad("TopLogprobs", r.TopLogprobs, fmt.Sprintf("≤ vocab_size %d", s.vocab))
	case len(r.Stop) > 0 && r.StopDecoder == nil:
		return bad("StopDecoder", nil, "a tokenizer.StreamDecoder when Stop is set")
	}
	for i, st := range r.Stop {
		if st == "" {
			return bad(fmt.Sprintf("Stop[%d]", i), `""`, "a non-empty string")
		}
	}
	for i, id := range r.Prompt {
		if id < 0 || id >= s.vocab {
			return bad(fmt.Sprintf("Prompt[%d]", i), id, fmt.Sprintf("a token id in [0, vocab_size %d)", s.vocab))
		}
	}
	return nil
}

func (s *Scheduler) wakeUp() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run is the step loop: it runs steps while requests are queued or
// running and waits for Submit otherwise. It returns nil when ctx ends
// (after the step in progress); every request still queued or running then
// finishes "cancelled" (caches released) and later Submits return
// ErrShuttingDown. ForwardBatch gets ctx, so a step in progress stops
// early when ctx ends. Errors: Run called twice. Panics when the pool's
// used bytes exceed its budget (checkPool; an internal error).
func (s *Scheduler) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("serve: Scheduler.Run called twice")
	}
	s.started = true
	s.mu.Unlock()
	defer s.stop()
	for {
		s.mu.Lock()
		work := len(s.queue) > 0 || len(s.running) > 0
		if !work && s.draining && !s.idleClosed {
			s.idleClosed = true
			close(s.idle)
		}
		s.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if !work {
			select {
			case <-ctx.Done():
				return nil
			case <-s.wake:
			}
			continue
		}
		s.step(ctx)
	}
}

// stop ends Run: everything left finishes "cancelled".
func (s *Scheduler) stop() {
	s.mu.Lock()
	s.stopped = true
	left := s.queue
	s.queue = nil
	s.met.queueDepth.Set(0)
	s.mu.Unlock()
	for _, q := range left {
		s.finish(q, FinishCancelled, nil)
	}
	for _, q := range s.running {
		s.finish(q, FinishCancelled, nil)
	}
	s.running = nil
	s.updateGauges()
	s.mu.Lock()
	if !s.idleClosed {
		s.idleClosed = true
		close(s.idle)
	}
	s.mu.Unlock()
	close(s.done)
}

// Drain is the graceful shutdown: Submit returns ErrShuttingDown from now
// on; queued and running requests go on until they finish or ctx ends;
// when ctx ends, every request left is finished "cancelled" at the next
// step boundary (its cache released). Drain returns when no request is
// left: nil when all finished on their own, otherwise an error wrapping
// ctx.Err(). Without Run (not started yet when ctx ends, or returned),
// Drain itself finishes the queued requests "cancelled".
func (s *Scheduler) Drain(ctx context.Context) error {
	s.mu.Lock()
	s.draining = true
	if s.stopped {
		s.mu.Unlock()
		return nil // stop finished everything
	}
	s.mu.Unlock()
	s.wakeUp()
	select {
	case <-s.idle:
		return nil
	case <-s.done:
		return nil
	case <-ctx.Done():
	}
	err := fmt.Errorf("serve: drain: the requests left when the deadline came were cancelled: %w", ctx.Err())
	s.mu.Lock()
	s.cut = true
	if !s.started {
		left := s.queue
		s.queue = nil
		s.met.queueDepth.Set(0)
		if !s.idleClosed {
			s.idleClosed = true
			close(s.idle)
		}
		s.mu.Unlock()
		for _, q := range left {
			s.finish(q, FinishCancelled, nil)
		}
		return err
	}
	s.mu.Unlock()
	s.wakeUp()
	select {
	case <-s.idle:
	case <-s.done:
	}
	return err
}

// step is one scheduler step (see Scheduler).
func (s *Scheduler) step(ctx context.Context) {
	// Boundary: cancelled requests leave and release their caches.
	s.mu.Lock()
	cut := s.cut
	s.mu.Unlock()
	kept := s.running[:0]
	for _, q := range s.running {
		if cut || q.ctx.Err() != nil {
			s.finish(q, FinishCancelled, nil)
			continue
		}
		kept = append(kept, q)
	}
	clear(s.running[len(kept):])
	s.running = kept
	s.admit(cut)
	s.grow()

	// One batched forward over every running sequence.
	seqs := s.seqs[:0]
	budget := s.opt.MaxPrefillTokens
	var rows int
	for _, q := range s.running {
		if q.done < len(q.toks) {
			if budget == 0 {
				q.chunk = -1 // waits for the next step
				continue
			}
			n := min(budget, len(q.toks)-q.done)
			budget -= n
			q.chunk = n
			seqs = append(seqs, runtime.Seq{Tokens: q.toks[q.done : q.done+n], Cache: q.cache, Logits: q.logits})
			rows += n
			continue
		}
		q.chunk = 0
		seqs = append(seqs, runtime.Seq{Tokens: q.next[:], Cache: q.cache, Logits: q.logits})
		rows++
	}
	s.seqs = seqs
	defer clear(s.seqs) // drop the caches' references until the next step
	if len(seqs) > 0 {
		s.met.steps.Inc()
		s.met.stepTokens.Observe(float64(rows))
		if err := s.forward(ctx, seqs); err != nil {
			if ctx.Err() != nil {
				return // Run ends; stop cancels everything
			}
			s.met.forwardErrors.Inc()
			s.log.Error("serve: batched forward failed; its requests finish with error", "sequences", len(seqs), "err", err)
			for _, q := range s.running {
				if q.chunk >= 0 {
					s.finish(q, FinishError, fmt.Errorf("serve: request %s: forward: %w", q.r.ID, err))
				}
			}
		} else {
			for _, q := range s.running {
				if q.chunk >= 0 {
					s.handle(q)
				}
			}
		}
	}
	kept = s.running[:0]
	for _, q := range s.running {
		if !q.finished {
			kept = append(kept, q)
		}
	}
	clear(s.running[len(kept):])
	s.running = kept
	s.updateGauges()
}

// grow raises the reservation of every decoding sequence to the tokens
// its cache holds after this step's decode row, oldest admitted first;
// when the pool cannot, it preempts the most recently admitted running
// sequence and tries again (see Scheduler).
func (s *Scheduler) grow() {
	for i := 0; i < len(s.running); i++ {
		q := s.running[i]
		if q.done < len(q.toks) {
			continue // prefilling: its reservation covers its tokens
		}
		want := q.cache.Len() + 1 // the cache holds the pending token after the step
		for q.resv < want {
			s.poolMu.Lock()
			err := s.pool.Grow(q.cache, want)
			s.poolMu.Unlock()
			if err == nil {
				q.resv = want
				break
			}
			if !errors.Is(err, kvcache.ErrPoolFull) {
				s.finish(q, FinishError, fmt.Errorf("serve: request %s: growing its KV cache: %w", q.r.ID, err))
				break
			}
			if len(s.running) == 1 {
				// Alone, the pool is as free as it gets: the budget ends it.
				s.finish(q, FinishLength, nil)
				break
			}
			j := len(s.running) - 1
			s.preempt(s.running[j])
			s.running[j] = nil
			s.running = s.running[:j]
			if j == i {
				break
			}
		}
		if q.finished {
			s.running = slices.Delete(s.running, i, i+1)
			i--
		}
	}
}

// preempt releases q's cache and puts q back at the head of the queue,
// its generated tokens appended to its prompt for recomputation.
func (s *Scheduler) preempt(q *request) {
	c := q.cache
	q.cache = nil
	s.release(q.r.ID, c)
	q.toks = append(append(make([]int, 0, len(q.r.Prompt)+len(q.out)), q.r.Prompt...), q.out...)
	q.done, q.resv, q.chunk = 0, 0, -1
	q.preempted++
	s.met.preemptions.Inc()
	s.log.Debug("serve: preempted", "id", q.r.ID, "generated_tokens", q.gen)
	s.mu.Lock()
	s.queue = slices.Insert(s.queue, 0, q)
	s.met.queueDepth.Set(float64(len(s.queue)))
	s.mu.Unlock()
}

// admit moves queued requests into the running batch, strict FIFO (see
// Scheduler). Queued requests whose ctx ended (or all, when cut) finish
// "cancelled" first.
func (s *Scheduler) admit(cut bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.queue[:0]
	for _, q := range s.queue {
		if cut || q.ctx.Err() != nil {
			s.finish(q, FinishCancelled, nil)
			continue
		}
		kept = append(kept, q)
	}
	clear(s.queue[len(kept):])
	s.queue = kept
	for len(s.queue) > 0 && len(s.running) < s.opt.MaxBatch {
		q := s.queue[0]
		resv := min(q.need, len(q.toks)+s.blockTokens)
		s.poolMu.Lock()
		free := s.pool.Stats().FreeBytes
		fits := s.pool.BytesForReserve(q.need, resv) <= free
		if !fits && len(s.running) == 0 {
			resv = min(q.need, len(q.toks)+1) // alone: no headroom block
		}
		var c runtime.KVCache
		var err error
		if fits || len(s.running) == 0 {
			c, err = s.pool.NewCacheReserve(q.need, resv)
		}
		s.poolMu.Unlock()
		if c == nil {
			if len(s.running) > 0 {
				break // waits for running sequences to release memory
			}
			if err == nil {
				err = errors.New("pool returned no cache")
			}
			// Nothing runs, so the pool is as free as it gets.
			s.queue[0] = nil
			s.queue = s.queue[1:]
			if q.gen > 0 && errors.Is(err, kvcache.ErrNeverFits) {
				s.finish(q, FinishLength, nil) // preempted: the budget ends it
				continue
			}
			s.finish(q, FinishError, fmt.Errorf("serve: request %s: KV cache of %d tokens: %w", q.r.ID, q.need, err))
			continue
		}
		s.queue[0] = nil
		s.queue = s.queue[1:]
		q.cache, q.resv = c, resv
		if q.sampler == nil { // a preempted request keeps its sampler's state
			q.logits = make([]float32, s.vocab)
			q.sampler = runtime.NewSampler(q.r.Temperature, q.r.TopP, q.r.Seed)
			q.sampler.TopK = q.r.TopK
		}
		s.running = append(s.running, q)
		s.log.Debug("serve: admitted", "id", q.r.ID, "prompt_tokens", len(q.r.Prompt), "max_tokens", q.r.MaxTokens,
			"queued_s", time.Since(q.submitted).Seconds())
	}
	s.met.queueDepth.Set(float64(len(s.queue)))
}

// forward runs seqs in one batched call; a panic inside it becomes its
// error.
func (s *Scheduler) forward(ctx context.Context, seqs []runtime.Seq) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic in ForwardBatch: %v", p)
			s.log.Error("serve: panic in ForwardBatch", "panic", p, "stack", string(debug.Stack()))
		}
	}()
	return runtime.ForwardBatch(ctx, s.m, seqs)
}

// handle takes q's results of this step: the prompt tokens prefilled and,
// when its logits row is one it needs, its next token. A panic here fails
// q alone with Finish "error".
func (s *Scheduler) handle(q *request) {
	defer func() {
		if p := recover(); p != nil {
			s.met.requestPanics.Inc()
			s.log.Error("serve: panic while handling a request; it finishes with error", "id", q.r.ID, "panic", p, "stack", string(debug.Stack()))
			s.finish(q, FinishError, fmt.Errorf("serve: request %s: internal error: %v", q.r.ID, p))
		}
	}()
	if q.chunk > 0 {
		q.done += q.chunk
		if q.preempted == 0 {
			s.met.promptTokens.Add(float64(q.chunk))
		}
		if q.done < len(q.toks) {
			return // a chunk that does not end the prompt: its logits are not needed
		}
	}
	if j := runtime.FirstNonFinite(q.logits); j >= 0 {
		s.finish(q, FinishError, fmt.Errorf("serve: request %s: logit %d is %v: the forward pass overflowed (weights are finite: activations left the float range, e.g. keys beyond a binary16 KV cache's 65504)", q.r.ID, j, q.logits[j]))
		return
	}
	tok := q.sampler.Sample(q.logits)
	now := time.Now()
	if q.gen == 0 {
		s.met.ttft.Observe(now.Sub(q.submitted).Seconds())
	} else {
		s.met.itl.Observe(now.Sub(q.last).Seconds())
	}
	q.last = now
	q.gen++
	s.met.genTokens.Inc()
	if s.onSample != nil {
		s.onSample(q.r)
	}
	if s.isStop(q.r, tok) {
		s.finish(q, FinishStop, nil)
		return
	}
	if len(q.ch) >= q.tokCap {
		s.finish(q, FinishError, fmt.Errorf("%w: request %s: %d token events unread", ErrSlowConsumer, q.r.ID, len(q.ch)))
		return
	}
	ev := Event{Token: tok}
	if q.r.TopLogprobs >= 0 {
		ev.Logprob, ev.Top = logprobs(q.logits, tok, q.r.TopLogprobs)
	}
	q.ch <- ev // never blocks: fewer than tokCap are buffered, tokCap+1 fit
	if q.stopString(tok) {
		s.finish(q, FinishStop, nil)
		return
	}
	if q.gen >= q.r.MaxTokens {
		s.finish(q, FinishLength, nil)
		return
	}
	q.next[0] = tok
	q.out = append(q.out, tok)
}

// stopString feeds tok to q's stop decoder and reports whether the text
// now contains one of q's stop strings. A new occurrence ends in the new
// text, so only the last maxStop−1 bytes before it need keeping.
func (q *request) stopString(tok int) bool {
	if len(q.r.Stop) == 0 {
		return false
	}
	piece := q.r.StopDecoder.Next(tok)
	if piece == "" {
		return false
	}
	q.stopTail = append(q.stopTail, piece...)
	for _, st := range q.r.Stop {
		if bytes.Contains(q.stopTail, []byte(st)) {
			return true
		}
	}
	if keep := q.maxStop - 1; len(q.stopTail) > keep {
		q.stopTail = append(q.stopTail[:0], q.stopTail[len(q.stopTail)-keep:]...)
	}
	return false
}

// isStop reports whether tok ends r with finish "stop".
func (s *Scheduler) isStop(r *GenRequest, tok int) bool {
	for _, id := range r.StopTokenIDs {
		if id == tok {
			return true
		}
	}
	if !r.IgnoreEOS {
		for _, id := range s.eos {
			if id == tok {
				return true
			}
		}
	}
	return false
}

// finish ends q once: its cache goes back to the pool, then its last
// event (reason, err) is sent and its channel closed, so a consumer that
// sees the finish event sees the blocks already freed.
func (s *Scheduler) finish(q *request, reason string, err error) {
	if q.finished {
		return
	}
	q.finished = true
	if q.cache != nil {
		c := q.cache
		q.cache = nil
		s.release(q.r.ID, c)
	}
	q.ch <- Event{Finish: reason, Err: err}
	close(q.ch)
	s.met.finished.WithLabelValues(reason).Inc()
	s.log.Debug("serve: finished", "id", q.r.ID, "finish", reason, "prompt_tokens", len(q.r.Prompt),
		"generated_tokens", q.gen, "duration_s", time.Since(q.submitted).Seconds())
}

// release returns c to the pool; a panic of the pool is logged (the
// request still finishes).
func (s *Scheduler) release(id string, c runtime.KVCache) {
	s.poolMu.Lock()
	defer s.poolMu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("serve: panic in KVPool.Release", "id", id, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	s.pool.Release(c)
}

// updateGauges sets the gauges after a step and checks the pool's
// invariant (panics on a violation: admission must never exceed the
// budget).
func (s *Scheduler) updateGauges() {
	s.poolMu.Lock()
	st := s.pool.Stats()
	s.poolMu.Unlock()
	s.met.setPool(st)
	s.met.running.Set(float64(len(s.running)))
	if err := checkPool(st); err != nil {
		s.log.Error(err.Error())
		panic(err)
	}
}

// logprobs returns the log-softmax (float64, of the raw logits) of tok and
// the k most likely ids with theirs, most likely first, ties to the lowest
// id.
func logprobs(logits []float32, tok, k int) (float32, []TokenLogprob) {
	mx := float64(logits[runtime.Argmax(logits)])
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l) - mx)
	}
	lse := mx + math.Log(sum)
	lp := float32(float64(logits[tok]) - lse)
	if k == 0 {
		return lp, nil
	}
	better := func(a, b int) bool {
		if logits[a] != logits[b] {
			return logits[a] > logits[b]
		}
		return a < b
	}
	var ids []int
	if k >= 32 {
		ids = make([]int, len(logits))
		for i := range ids {
			ids[i] = i
		}
		sort.Slice(ids, func(a, b int) bool { return better(ids[a], ids[b]) })
		ids = ids[:k]
	} else {
		ids = make([]int, 0, k+1)
		for i := range logits {
			if len(ids) == k && !better(i, ids[k-1]) {
				continue
			}
			j := len(ids)
			if j < k {
				ids = append(ids, i)
			} else {
				j = k - 1
				ids[j] = i
			}
			for ; j > 0 && better(ids[j], ids[j-1]); j-- {
				ids[j], ids[j-1] = ids[j-1], ids[j]
			}
		}
	}
	top := make([]TokenLogprob, len(ids))
	for i, id := range ids {
		top[i] = TokenLogprob{ID: id, Logprob: float32(float64(logits[id]) - lse)}
	}
	return lp, top
}
