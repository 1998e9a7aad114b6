package calibrate

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/lmpack/lmpack/internal/shared"
)

// heapSampler records the peak of live heap bytes (runtime/metrics
// "/memory/classes/heap/objects:bytes", no stop-the-world) sampled every
// 200µs until stop.
type heapSampler struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	peak  uint64
}

// heapNow reads the live heap bytes into s (one sample, reused so that
// sampling allocates nothing).
func heapNow(s []metrics.Sample) uint64 {
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func heapSample() []metrics.Sample {
	return []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stopc: make(chan struct{})}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		s := heapSample()
		tk := time.NewTicker(200 * time.Microsecond)
		defer tk.Stop()
		for {
			h.peak = max(h.peak, heapNow(s))
			select {
			case <-h.stopc:
				return
			case <-tk.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) stop() uint64 {
	close(h.stopc)
	h.wg.Wait()
	return max(h.peak, heapNow(heapSample()))
}

// BenchmarkCalibrate runs CollectOSCAR (both passes) on stories260K over
// the first N tokens of calib.txt in windows of 512, with the model loaded
// and the text tokenized beforehand. It reports calibration tokens/s and
// peak-heap-B: the peak live heap during the collection above the live heap
// just before it (after a GC); the statistics are streamed, so it should
// not grow with N. alloc-B/token is the bytes allocated per token.
func BenchmarkCalibrate(b *testing.B) {
	e := openEngine(b, "stories260K-hf")
	text, err := os.ReadFile(shared.Path(b, "tinystories-valid", "calib.txt"))
	if err != nil {
		b.Fatal(err)
	}
	ids := tokenize(e, string(text))
	for _, n := range []int{2048, 8192, 32768} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			windows, err := Windows(ids, n, 512)
			if err != nil {
				b.Fatal(err)
			}
			var peak uint64
			var ms0, ms1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&ms0)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				runtime.GC()
				base := heapNow(heapSample())
				s := startHeapSampler()
				b.StartTimer()
				if _, err := CollectOSCAR(context.Background(), e.Model, windows, nil); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				p := s.stop()
				peak = max(peak, p-min(base, p))
				b.StartTimer()
			}
			b.StopTimer()
			runtime.ReadMemStats(&ms1)
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			b.ReportMetric(float64(peak), "peak-heap-B")
			b.ReportMetric(float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(n*b.N), "alloc-B/token")
		})
	}
}
