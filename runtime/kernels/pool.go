package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Task is a unit of parallel work for Pool.Run: Run(lo, hi) processes the
// half-open index range [lo, hi). Pool.Run calls it on disjoint ranges that
// together cover [0, n), possibly concurrently from different goroutines,
// so Run must only write state owned by its range. A Task must not panic
// (a panic on a worker goroutine ends the process) and must not call Run on
// the same Pool (that deadlocks).
type Task interface {
	Run(lo, hi int)
}

// Pool is a fixed set of persistent worker goroutines for the parallel
// kernels. One call runs at a time: Run and MatMulNT may be called from
// several goroutines, but they are serialized by a mutex. The caller's
// goroutine always does the first share of the work itself, so a pool of
// one thread runs everything inline with no goroutine handoff.
//
// After a job, workers spin for a short while (spinWait) watching for the
// next one before parking on a channel, so back-to-back calls — a decode
// step issues dozens of GEMVs — do not pay an OS thread wake-up each time.
// The submitting goroutine likewise spins while it waits for the workers
// and parks after spinWait, so that when other processes hold the cores
// and the OS has descheduled a worker, the worker can have the core. The
// steady state allocates nothing.
type Pool struct {
	threads int
	workers []*worker
	pending atomic.Int32  // workers still running the current job
	_       [60]byte      // keep waiting off pending's cache line
	waiting atomic.Int32  // 1 while the submitter is (about to be) parked
	done    chan struct{} // capacity 1: the last worker's wake-up token
	wg      sync.WaitGroup

	mu     sync.Mutex  // serializes jobs
	closed atomic.Bool // set once by Close
	mm     matMulTask  // reused by MatMulNT so that it does not allocate
	hm     halfTask    // reused by MatMulNTHalf
}

// Test hooks that widen the race windows of the wake-up handshakes: run
// between a dispatcher's job bump and its claim of the worker's sleeping
// flag, and between the last worker's pending decrement and its claim of
// the submitter's waiting flag. nil outside tests.
var testHookDispatch, testHookWorkerDone func()

// spinWait is how long an idle worker polls for new work before parking.
const spinWait = 50 * time.Microsecond

type worker struct {
	job      atomic.Uint64 // bumped by the dispatcher for each new job
	sleeping atomic.Int32  // 1 while the worker is (about to be) parked
	wake     chan struct{} // capacity 1: the dispatcher's wake-up token
	task     Task
	lo, hi   int
	quit     bool
	_        [64]byte // keep workers' hot fields on separate cache lines
}

// NewPool starts a pool of threads workers, counting the calling goroutine
// (threads-1 goroutines are started). threads <= 0 means runtime.NumCPU().
// Call Close to stop the goroutines.
func NewPool(threads int) *Pool {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	p := &Pool{threads: threads, done: make(chan struct{}, 1)}
	p.workers = make([]*worker, threads-1)
	for i := range p.workers {
		w := &worker{wake: make(chan struct{}, 1)}
		p.workers[i] = w
		p.wg.Add(1)
		go p.loop(w)
	}
	return p
}

// Threads returns the number of threads the pool splits work across,
// including the calling goroutine.
func (p *Pool) Threads() int { return p.threads }

// Close stops the worker goroutines and waits for them to exit. Calling Run
// or MatMulNT afterwards panics; calling Close again does nothing.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Swap(true) {
		return
	}
	for _, w := range p.workers {
		w.quit = true
		p.dispatch(w, nil, 0, 0)
	}
	p.wg.Wait()
}

func (p *Pool) loop(w *worker) {
	defer p.wg.Done()
	var seen uint64
	for {
		seen = w.wait(seen)
		if w.quit {
			return
		}
		w.task.Run(w.lo, w.hi)
		w.task = nil
		last := p.pending.Add(-1) == 0
		if last && testHookWorkerDone != nil {
			testHookWorkerDone()
		}
		if last && p.waiting.Load() == 1 && p.waiting.CompareAndSwap(1, 0) {
			p.done <- struct{}{}
		}
	}
}

// wait blocks until w.job differs from seen and returns the new value.
//
// Lost wake-ups are impossible: the worker publishes sleeping=1 and then
// re-reads job, while the dispatcher bumps job and then tries to claim
// sleeping 1→0. Whichever side claims the flag decides who proceeds; if the
// dispatcher claims it, it always sends a token that the worker receives.
// A dispatcher descheduled between its bump and its claim can claim a later
// park and send a stale token; the worker recognizes it (job unchanged) and
// parks again. waitWorkers handles the submitter's tokens the same way.
func (w *worker) wait(seen uint64) uint64 {
	var start time.Time // set lazily, as in waitWorkers
	// With a single P, spinning would only keep the goroutine that is
	// about to submit work from running.
	spin := runtime.GOMAXPROCS(0) > 1
	for i := 1; spin; i++ {
		if j := w.job.Load(); j != seen {
			return j
		}
		if i%1024 == 0 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinWait {
				break
			}
			runtime.Gosched()
		}
	}
	w.sleeping.Store(1)
	if j := w.job.Load(); j != seen && w.sleeping.CompareAndSwap(1, 0) {
		return j
	}
	for {
		<-w.wake
		if j := w.job.Load(); j != seen {
			return j
		}
		// A stale token: a dispatcher bumped job, this worker saw the job
		// while spinning, ran it and parked again, and only then did the
		// dispatcher claim sleeping and send. Park again.
		w.sleeping.Store(1)
		if j := w.job.Load(); j != seen && w.sleeping.CompareAndSwap(1, 0) {
			return j
		}
	}
}

// dispatch hands [lo, hi) of t to w and wakes it if it is parked.
func (p *Pool) dispatch(w *worker, t Task, lo, hi int) {
	w.task, w.lo, w.hi = t, lo, hi
	w.job.Add(1)
	if testHookDispatch != nil {
		testHookDispatch()
	}
	if w.sleeping.CompareAndSwap(1, 0) {
		w.wake <- struct{}{}
	}
}

// Run splits [0, n) into min(Threads(), n) contiguous ranges of near-equal
// length and calls t.Run on each, the first on the calling goroutine and
// the others on workers, returning when all are done. It does nothing for
// n <= 0. With a pointer-typed Task it allocates nothing. It panics if the
// pool is closed.
func (p *Pool) Run(n int, t Task) {
	if p.closed.Load() {
		panicf("Pool.Run: pool is closed")
	}
	if n <= 0 {
		return
	}
	if p.threads == 1 || n == 1 {
		t.Run(0, n)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() { // Close ran while we waited for the lock
		panicf("Pool.Run: pool is closed")
	}
	p.run(n, t)
}

// run is Run with p.mu held and n >= 2.
func (p *Pool) run(n int, t Task) {
	parts := min(p.threads, n)
	p.pending.Store(int32(parts - 1))
	for i := 1; i < parts; i++ {
		p.dispatch(p.workers[i-1], t, i*n/parts, (i+1)*n/parts)
	}
	t.Run(0, n/parts)
	p.waitWorkers()
}

// waitWorkers returns once pending is 0. It spins for up to spinWait, then
// parks, so that a worker the OS has descheduled (more runnable threads
// than cores) can have this core instead of watching it spin; the
// waiting/done handshake mirrors worker.wait.
func (p *Pool) waitWorkers() {
	var start time.Time // set lazily: most waits end within a few polls
	for i := 1; p.pending.Load() != 0; i++ {
		if i%1024 == 0 {
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > spinWait {
				p.waiting.Store(1)
				if p.pending.Load() == 0 && p.waiting.CompareAndSwap(1, 0) {
					return
				}
				for {
					<-p.done
					if p.pending.Load() == 0 {
						return
					}
					// A stale token from an earlier job's last worker,
					// which claimed waiting late: park again.
					p.waiting.Store(1)
					if p.pending.Load() == 0 && p.waiting.CompareAndSwap(1, 0) {
						return
					}
				}
			}
			// Let a worker goroutine that waits for this P run
			// (GOMAXPROCS below Threads()).
			runtime.Gosched()
		}
	}
}

// matMulTask is the Task behind Pool.MatMulNT. Units are either groups of
// columns of y (split over n) or groups of rows (split over m).
type matMulTask struct {
	m, n, k       int
	x, w, y       []float32
	ldx, ldw, ldy int
	unit          int  // columns or rows per unit
	overM         bool // split over rows of x/y instead of columns
	rows          bool // run matMulNTRows (Pool.MatMulNTRows)
}

func (t *matMulTask) Run(lo, hi int) {
	mm := matMulNT
	if t.rows {
		mm = matMulNTRows
	}
	if t.overM {
		i0, i1 := lo*t.unit, min(hi*t.unit, t.m)
		mm(i1-i0, t.n, t.k, t.x[i0*t.ldx:], t.ldx, t.w, t.ldw, t.y[i0*t.ldy:], t.ldy)
		return
	}
	j0, j1 := lo*t.unit, min(hi*t.unit, t.n)
	mm(t.m, j1-j0, t.k, t.x, t.ldx, t.w[j0*t.ldw:], t.ldw, t.y[j0:], t.ldy)
}

// parallelMinMACs is the size m·n·k below which Pool.MatMulNT runs on the
// calling goroutine: splitting smaller products costs more than it saves.
const parallelMinMACs = 1 << 15

// MatMulNT is MatMulNT (same operands, shapes, result and panics) split
// across the pool's threads. Decode GEMVs (m < 4) and wide products are
// split over n, each thread streaming its own rows of w; products with few
// columns but many rows are split over m. Each thread's share runs the
// single-thread kernel, cache blocking included. It allocates nothing and
// panics if the pool is closed.
func (p *Pool) MatMulNT(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	if p.closed.Load() {
		panicf("Pool.MatMulNT: pool is closed")
	}
	checkMatMul("Pool.MatMulNT", m, n, k, x, ldx, w, ldw, y, ldy, true)
	if p.threads == 1 || m == 0 || n == 0 || k == 0 || m*n*k < parallelMinMACs {
		matMulNT(m, n, k, x, ldx, w, ldw, y, ldy)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		panicf("Pool.MatMulNT: pool is closed")
	}
	t := &p.mm
	*t = matMulTask{m: m, n: n, k: k, x: x, w: w, y: y, ldx: ldx, ldw: ldw, ldy: ldy}
	var units int
	switch {
	case m < 4:
		t.unit = 4 // the GEMV kernel's row group
		units = (n + 3) / 4
	case n >= 12*p.threads:
		t.unit = 3 // the GEMM micro-kernel's column tile
		units = (n + 2) / 3
	default:
		t.unit, t.overM = 4, true
		units = (m + 3) / 4
	}
	if units < 2 {
		matMulNT(m, n, k, x, ldx, w, ldw, y, ldy)
	} else {
		p.run(units, t)
	}
	*t = matMulTask{} // drop the caller's slices
}
