package serve

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// BenchmarkSchedulerDecode: aggregate tokens/s through the scheduler (one
// ForwardBatch per step) with 1, 4 and 16 concurrent greedy requests of
// 64 generated tokens each on stories260K, one thread.
func BenchmarkSchedulerDecode(b *testing.B) {
	m := loadStories(b)
	for _, n := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("seqs=%d", n), func(b *testing.B) {
			pool := newFakePool(b, m, 1<<30)
			s := startSched(b, m, pool, SchedOptions{MaxBatch: n, MaxPrefillTokens: 256, MaxQueue: n, Logger: slog.New(slog.DiscardHandler)})
			var tokens int
			start := time.Now()
			for it := 0; it < b.N; it++ {
				var wg sync.WaitGroup
				var mu sync.Mutex
				for i := 0; i < n; i++ {
					ch, err := s.Submit(context.Background(), &GenRequest{ID: fmt.Sprint(i), Prompt: storyTokens(b, 37*i, 8),
						MaxTokens: 64, IgnoreEOS: true, TopLogprobs: -1})
					if err != nil {
						b.Fatal(err)
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						k := 0
						for ev := range ch {
							if ev.Finish == "" {
								k++
							}
						}
						mu.Lock()
						tokens += k
						mu.Unlock()
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(tokens)/time.Since(start).Seconds(), "tokens/s")
		})
	}
}
