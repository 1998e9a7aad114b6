package kernels

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// coverTask counts how often each index is visited and records the ranges.
type coverTask struct {
	hits   []atomic.Int32
	mu     sync.Mutex
	ranges [][2]int
}

func (c *coverTask) Run(lo, hi int) {
	for i := lo; i < hi; i++ {
		c.hits[i].Add(1)
	}
	c.mu.Lock()
	c.ranges = append(c.ranges, [2]int{lo, hi})
	c.mu.Unlock()
}

func TestPoolRun(t *testing.T) {
	for threads := 1; threads <= 4; threads++ {
		p := NewPool(threads)
		if p.Threads() != threads {
			t.Fatalf("NewPool(%d).Threads() = %d", threads, p.Threads())
		}
		for _, n := range []int{0, 1, 2, 3, 4, 5, 7, 100, 1001} {
			for rep := 0; rep < 3; rep++ { // reuse the same workers
				c := &coverTask{hits: make([]atomic.Int32, n)}
				p.Run(n, c)
				for i := range c.hits {
					if h := c.hits[i].Load(); h != 1 {
						t.Fatalf("threads=%d n=%d: index %d visited %d times", threads, n, i, h)
					}
				}
				if want := min(threads, n); len(c.ranges) != want {
					t.Fatalf("threads=%d n=%d: %d ranges %v, want %d", threads, n, len(c.ranges), c.ranges, want)
				}
			}
		}
		p.Close()
		p.Close() // idempotent
		mustPanic(t, "closed", func() { p.Run(10, &coverTask{hits: make([]atomic.Int32, 10)}) })
		mustPanic(t, "closed", func() { p.MatMulNT(1, 1, 1, []float32{1}, 1, []float32{1}, 1, []float32{0}, 1) })
	}
	if p := NewPool(0); p.Threads() < 1 {
		t.Fatalf("NewPool(0).Threads() = %d", p.Threads())
	} else {
		p.Close()
	}
}

// TestPoolRunConcurrentCallers checks that Run from several goroutines at
// once is serialized correctly and that workers woken after parking (the
// callers sleep between jobs) see their work.
func TestPoolRunConcurrentCallers(t *testing.T) {
	p := NewPool(3)
	defer p.Close()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rep := 0; rep < 50; rep++ {
				c := &coverTask{hits: make([]atomic.Int32, 37)}
				p.Run(37, c)
				for i := range c.hits {
					if c.hits[i].Load() != 1 {
						t.Errorf("index %d visited %d times", i, c.hits[i].Load())
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

func TestPoolMatMulNT(t *testing.T) {
	shapes := []struct{ m, n, k int }{
		{1, 1408, 512}, // GEMV split over n
		{1, 5, 7},      // below the parallel threshold
		{1, 6, 4096},   // GEMV with fewer row groups than threads
		{2, 301, 129},  // small m, split over n
		{64, 512, 96},  // GEMM split over column tiles
		{64, 13, 200},  // narrow: split over m
		{3, 2, 9000},   // tiny n and m
	}
	bothPaths(t, func(t *testing.T) {
		for threads := 1; threads <= 4; threads++ {
			p := NewPool(threads)
			for si, s := range shapes {
				t.Run(fmt.Sprintf("t=%d/m=%d/n=%d/k=%d", threads, s.m, s.n, s.k), func(t *testing.T) {
					r := newRand(uint64(300 + si))
					ldx, ldw, ldy := s.k+1, s.k+2, s.n+3
					x := randSlice(r, (s.m-1)*ldx+s.k)
					w := randSlice(r, (s.n-1)*ldw+s.k)
					y := make([]float32, (s.m-1)*ldy+s.n)
					fill(y, sentinel)
					p.MatMulNT(s.m, s.n, s.k, x, ldx, w, ldw, y, ldy)
					ref, mag := refNT(s.m, s.n, s.k, x, ldx, w, ldw)
					checkMatResult(t, "Pool.MatMulNT", s.m, s.n, y, ldy, ref, mag)
				})
			}
			p.Close()
		}
	})
}

func TestPoolAllocs(t *testing.T) {
	r := newRand(400)
	const k, n = 512, 1408
	w := randSlice(r, n*k)
	x := randSlice(r, 64*k)
	y := make([]float32, 64*n)
	for _, threads := range []int{1, 2, 4} {
		p := NewPool(threads)
		for _, m := range []int{1, 64} {
			a := testing.AllocsPerRun(20, func() { p.MatMulNT(m, n, k, x, k, w, k, y, n) })
			if a != 0 {
				t.Errorf("threads=%d: Pool.MatMulNT m=%d allocates %v times per call, want 0", threads, m, a)
			}
		}
		c := &coverTask{hits: make([]atomic.Int32, 64), ranges: make([][2]int, 0, 1024)}
		a := testing.AllocsPerRun(20, func() { c.ranges = c.ranges[:0]; p.Run(64, c) })
		if a != 0 {
			t.Errorf("threads=%d: Pool.Run allocates %v times per call, want 0", threads, a)
		}
		p.Close()
	}
}
