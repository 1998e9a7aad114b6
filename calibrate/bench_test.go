package calibrate

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/lmpack/lmpack/formats/safetensors"
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

// BenchmarkCalibrateExpertPasses measures calibrate on stories260K-moe-hf
// (512 tokens in windows of 128, one thread) with MaxExpertBytes unlimited
// (one expert pass holding all 5 MoE layers) and with one layer's
// ExpertLayerBytes (5 passes, one layer each, streamed through temporary
// files). Sub-benchmark run is the whole Run; experts is the expert phase
// only (collectExpertPasses and the write of the expert tensors, with the
// model open and the windows made beforehand). peak-heap-B is the peak live
// heap (sampled; it includes garbage not yet collected) above the live
// heap before (after a GC); expert-B-per-pass is the ExpertLayerBytes of
// the largest group. The model is tiny (one layer's expert statistics are
// about 1.8 MB), so Run's peak is dominated by tokenizing the whole data
// file and the budget shows mostly in the experts phase.
func BenchmarkCalibrateExpertPasses(b *testing.B) {
	model := shared.Path(b, "stories260K-moe-hf")
	data := shared.Path(b, "tinystories-valid", "calib.txt")
	e := openEngine(b, "stories260K-moe-hf")
	d := e.Desc
	text, err := os.ReadFile(data)
	if err != nil {
		b.Fatal(err)
	}
	const tokens = 512
	windows, err := Windows(tokenize(e, string(text)), tokens, 128)
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	one := ExpertLayerBytes(d, 0)
	for _, c := range []struct {
		name   string
		budget int64
	}{{"unlimited", 0}, {"one-layer", one}} {
		groups, err := ExpertPasses(d, c.budget)
		if err != nil {
			b.Fatal(err)
		}
		var perPass int64
		for _, g := range groups {
			var n int64
			for _, l := range g {
				n += ExpertLayerBytes(d, l)
			}
			perPass = max(perPass, n)
		}
		opt := Options{Model: model, Data: data, Tokens: tokens, Ctx: 128, Threads: 1, MaxExpertBytes: c.budget}
		phases := []struct {
			name string
			f    func(b *testing.B, dir string)
		}{
			{"run", func(b *testing.B, dir string) {
				o := opt
				o.Out = filepath.Join(dir, "calib.safetensors")
				s, err := Run(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				if s.ExpertPasses != len(groups) {
					b.Fatalf("%d expert passes, want %d", s.ExpertPasses, len(groups))
				}
			}},
			{"experts", func(b *testing.B, dir string) {
				tmp := ""
				if len(groups) > 1 {
					tmp = dir
				}
				r, err := collectExpertPasses(context.Background(), e, windows, groups, opt, tmp, log, nil)
				if err != nil {
					b.Fatal(err)
				}
				var ts []safetensors.WriteTensor
				if r.passFiles != nil {
					var closeAll func()
					if ts, closeAll, err = passTensors(r.passFiles); err != nil {
						b.Fatal(err)
					}
					defer closeAll()
				}
				c := &Calibration{Header: Header{Tokens: tokens, Ctx: 128}, Experts: r.experts}
				if err := write(filepath.Join(dir, "experts.safetensors"), c, ts); err != nil {
					b.Fatal(err)
				}
			}},
		}
		for _, ph := range phases {
			b.Run(c.name+"/"+ph.name, func(b *testing.B) {
				var peak uint64
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					dir := b.TempDir()
					runtime.GC()
					base := heapNow(heapSample())
					s := startHeapSampler()
					b.StartTimer()
					ph.f(b, dir)
					b.StopTimer()
					p := s.stop()
					peak = max(peak, p-min(base, p))
					b.StartTimer()
				}
				b.StopTimer()
				b.ReportMetric(float64(peak), "peak-heap-B")
				b.ReportMetric(float64(perPass), "expert-B-per-pass")
				b.ReportMetric(float64(len(groups)), "passes")
				b.ReportMetric(float64(tokens)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
