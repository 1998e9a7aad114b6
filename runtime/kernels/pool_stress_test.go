package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type countTask struct {
	hits []atomic.Int32
}

func (c *countTask) Run(lo, hi int) {
	for i := lo; i < hi; i++ {
		c.hits[i].Add(1)
	}
	// Vary timing so workers sometimes park between jobs.
	if lo%3 == 1 {
		time.Sleep(time.Duration(lo%5) * 20 * time.Microsecond)
	}
}

// TestPoolStress runs many short jobs on several pools at once, with more
// runnable goroutines than cores so the OS deschedules dispatchers and
// workers at awkward moments (the stale wake-up race: a worker woken for a
// job it already ran, or a submitter woken by an earlier job's worker).
// Every index must be covered exactly once per job, and nothing may panic.
func TestPoolStress(t *testing.T) {
	iters := 3000
	if testing.Short() {
		iters = 500
	}
	var wg sync.WaitGroup
	for g := 0; g < 2*runtime.NumCPU()+1; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			p := NewPool(2 + g%3)
			defer p.Close()
			ct := &countTask{hits: make([]atomic.Int32, 7)}
			for it := 0; it < iters; it++ {
				n := 2 + it%6
				for i := range ct.hits {
					ct.hits[i].Store(0)
				}
				p.Run(n, ct)
				for i := 0; i < n; i++ {
					if h := ct.hits[i].Load(); h != 1 {
						t.Errorf("pool %d job %d: index %d run %d times, want 1 (Run returned before its workers finished, or ran a range twice)", g, it, i, h)
						return
					}
				}
				if it%97 == 0 {
					time.Sleep(60 * time.Microsecond) // let workers park
				}
			}
		}(g)
	}
	wg.Wait()
}

// TestPoolStaleWakeups widens both stale wake-up windows with the test
// hooks (it did not reproduce the original crash in-process; the
// multi-process cmd/lmpack TestConcurrentRuns does) and checks coverage: a dispatcher that claims a worker's sleeping flag only after the
// worker ran the job and parked again (the worker must not rerun a nil
// task), and a last worker that claims the submitter's waiting flag only
// after the submitter moved on to a later job (the submitter must not
// return before that job's workers finish).
func TestPoolStaleWakeups(t *testing.T) {
	var slowDispatch, slowWorker atomic.Bool
	testHookDispatch = func() {
		if slowDispatch.Load() {
			time.Sleep(4 * spinWait)
		}
	}
	testHookWorkerDone = func() {
		if slowWorker.Load() {
			time.Sleep(4 * spinWait)
		}
	}
	defer func() { testHookDispatch, testHookWorkerDone = nil, nil }()
	p := NewPool(2)
	defer p.Close()
	ct := &countTask{hits: make([]atomic.Int32, 4)}
	for it := 0; it < 200; it++ {
		slowDispatch.Store(it%4 == 2)
		slowWorker.Store(it%4 == 3)
		for i := range ct.hits {
			ct.hits[i].Store(0)
		}
		p.Run(4, ct)
		for i := 0; i < 4; i++ {
			if h := ct.hits[i].Load(); h != 1 {
				t.Fatalf("job %d: index %d run %d times, want 1", it, i, h)
			}
		}
		if it%4 == 0 {
			time.Sleep(3 * spinWait) // let the worker park
		}
	}
}
