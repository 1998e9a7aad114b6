package export

import (
	"context"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lmpack/lmpack/internal/shared"
)

// BenchmarkGGUFExport exports qwen3moe-2m-hf (bf16, stacked experts) and
// reports throughput (MB of output per second), the output size, the
// largest output tensor and the peak heap allocated above the heap before
// the export (sampled every millisecond, with GOGC 1): streaming keeps
// the peak near the largest tensor plus the writer's 1 MiB buffer, not the
// file.
func BenchmarkGGUFExport(b *testing.B) {
	model := shared.Path(b, "qwen3moe-2m-hf")
	out := filepath.Join(b.TempDir(), "m.gguf")
	var rep *Report
	var peak atomic.Uint64
	// GOGC 1: collect as soon as the heap grows by 1% (the default lets
	// garbage grow to 4 MB before the first collection), so that the
	// sampled heap is close to what is live.
	defer debug.SetGCPercent(debug.SetGCPercent(1))
	for b.Loop() {
		goruntime.GC()
		var ms goruntime.MemStats
		goruntime.ReadMemStats(&ms)
		base := ms.HeapAlloc
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			var m goruntime.MemStats
			for {
				goruntime.ReadMemStats(&m)
				if m.HeapAlloc > base && m.HeapAlloc-base > peak.Load() {
					peak.Store(m.HeapAlloc - base)
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		})
		var err error
		rep, err = GGUF(context.Background(), model, GGUFOptions{Out: out})
		close(stop)
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
	}
	st, _ := os.Stat(out)
	var largest int64
	for _, t := range rep.Tensors {
		largest = max(largest, t.Bytes)
	}
	b.ReportMetric(float64(st.Size())/1e6/(b.Elapsed().Seconds()/float64(b.N)), "MB/s")
	b.ReportMetric(float64(st.Size())/1e6, "out-MB")
	b.ReportMetric(float64(largest)/1e6, "largest-tensor-MB")
	b.ReportMetric(float64(peak.Load())/1e6, "peak-heap-MB")
}
