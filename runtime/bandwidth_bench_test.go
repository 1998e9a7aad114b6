package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
	"github.com/lmpack/lmpack/runtime/kernels"
)

// bwBufferBytes is the size of each of the two buffers the memory
// bandwidth is measured on: twice the largest CPU cache that sysfs reports
// for cpu0, at least 256 MiB and at most 1 GiB (256 MiB when sysfs says
// nothing), so that a pass over it streams from DRAM, not from the
// last-level cache.
func bwBufferBytes() int {
	llc := 0
	dirs, _ := filepath.Glob("/sys/devices/system/cpu/cpu0/cache/index*")
	for _, d := range dirs {
		raw, err := os.ReadFile(filepath.Join(d, "size"))
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(raw))
		mul := 1
		switch {
		case strings.HasSuffix(s, "K"):
			mul, s = 1<<10, strings.TrimSuffix(s, "K")
		case strings.HasSuffix(s, "M"):
			mul, s = 1<<20, strings.TrimSuffix(s, "M")
		}
		if v, err := strconv.Atoi(s); err == nil {
			llc = max(llc, v*mul)
		}
	}
	return min(max(256<<20, 2*llc), 1<<30)
}

// bwRowLen is the row length (floats) of the read pass's GEMV: the 22M
// model's hidden size, so rows are as long as most of its weight rows.
const bwRowLen = 512

// bwBuffers holds the float32 buffers of the bandwidth measurement: src
// [n] (filled; read by the read and copy passes, viewed as [n/bwRowLen,
// bwRowLen] by the read pass), dst [n] (written by the copy pass), ones
// [bwRowLen] and sums [n/bwRowLen] (the read pass's x and y), all touched
// once so that no page fault is timed.
type bwBuffers struct {
	src, dst   []float32
	ones, sums []float32
}

func newBWBuffers(bytes int) *bwBuffers {
	n := bytes / 4 / bwRowLen * bwRowLen
	bb := &bwBuffers{src: make([]float32, n), dst: make([]float32, n), ones: make([]float32, bwRowLen), sums: make([]float32, n/bwRowLen)}
	for i := range bb.src {
		bb.src[i] = float32(i&1023) / 1024
	}
	for i := range bb.ones {
		bb.ones[i] = 1
	}
	copy(bb.dst, bb.src)
	return bb
}

// bwChunks calls f(lo, hi) for threads contiguous chunks [lo, hi) of
// [0, n), concurrently when threads > 1, and returns the wall seconds
// from the first start to the last return.
func bwChunks(threads, n int, f func(lo, hi int)) float64 {
	step := (n + threads - 1) / threads
	t0 := time.Now()
	if threads == 1 {
		f(0, n)
		return time.Since(t0).Seconds()
	}
	var wg sync.WaitGroup
	for i := 0; i < threads; i++ {
		lo, hi := min(i*step, n), min((i+1)*step, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(lo, hi)
		}()
	}
	wg.Wait()
	return time.Since(t0).Seconds()
}

// bwMeter accumulates bytes moved and seconds taken; rate is GB/s (1e9).
type bwMeter struct{ bytes, secs float64 }

func (m *bwMeter) add(bytes, secs float64) { m.bytes += bytes; m.secs += secs }
func (m *bwMeter) rate() float64           { return m.bytes / m.secs / 1e9 }

// read streams the first rows rows of src once on threads goroutines,
// each summing its rows (sums = src·ones with kernels.MatMulNT at m = 1:
// the float decode GEMV, four rows a quarter of the chunk apart in flight
// at once, which a single sequential stream does not match on one core),
// and adds the 4·rows·bwRowLen bytes read to m (the 4 B per row written
// are not counted).
func (bb *bwBuffers) read(m *bwMeter, threads, rows int) {
	s := bwChunks(threads, rows, func(lo, hi int) {
		kernels.MatMulNT(1, hi-lo, bwRowLen, bb.ones, bwRowLen, bb.src[lo*bwRowLen:hi*bwRowLen], bwRowLen, bb.sums[lo:hi], hi-lo)
	})
	m.add(4*float64(rows*bwRowLen), s)
}

// copyPass copies src into dst (Go's memmove: non-temporal stores at this
// size on amd64) on threads goroutines and adds 8·n bytes to m, the bytes
// read plus the bytes written (the STREAM convention).
func (bb *bwBuffers) copyPass(m *bwMeter, threads int) {
	n := len(bb.src)
	s := bwChunks(threads, n, func(lo, hi int) { copy(bb.dst[lo:hi], bb.src[lo:hi]) })
	m.add(8*float64(n), s)
}

// bwSample is one interleaved bandwidth sample at one thread count: a
// read pass and a copy pass over the whole buffers (DRAM), then read
// passes over the first warmBytes of src (warmed by one untimed pass)
// totalling at least 256 MiB: the bandwidth of a working set as large as
// the bytes a decoded token reads, which is what decode gets when the
// weights stay in the last-level cache between tokens.
func (bb *bwBuffers) bwSample(dram, cp, warm *bwMeter, threads int, warmBytes int64) {
	bb.read(dram, threads, len(bb.sums))
	bb.copyPass(cp, threads)
	wr := min(max(int(warmBytes/4/bwRowLen), 1), len(bb.sums))
	var discard bwMeter
	bb.read(&discard, threads, wr)
	for done := 0; done < 256<<20; done += 4 * bwRowLen * wr {
		bb.read(warm, threads, wr)
	}
}

// decodeBytesPerToken returns the bytes of weights one decoded token
// reads from a CPU model: every linear weight once (LinearWeightBytes:
// attention q/k/v/o, MLP gate/up/down, lm_head when untied; at their
// stored width: 4 B per element for F32, 2 for BF16 in place, packed
// codes plus F16 scales and zero-points for quantized weights), plus
// lm_head when tied to the embedding (the whole [vocab, hidden] embedding
// matrix: the logits GEMV reads it all), plus one embedding row (the
// token's lookup). Norm weights (1-d, 17·512·4 B here) and the KV cache
// are not counted; the KV cache read grows with the position (fp32:
// layers·2·kv_dim·4 B per past token, 8 KiB on the 22M model; at the
// tg128 cycle's mean position of 63.5, about 0.5 MiB per token, 4% of the
// 4-bit model's weight bytes).
func decodeBytesPerToken(cm *cpuModel) int64 {
	b := cm.weightBytes()
	embed := 4 * int64(len(cm.embed))
	if cm.embedH != nil {
		embed = cm.embedH.bytes()
	}
	if cm.d.TieWordEmbeddings {
		b += cm.lmHead.bytes()
	}
	return b + embed/int64(cm.d.VocabSize)
}

// BenchmarkDecodeBandwidth22M measures single-token decode (tg128: the
// cache refilled from empty every 128 tokens) of the 22M synthetic Llama
// in F32 (writeSyntheticLlama), BF16 in place (writeSyntheticLlamaAs
// BF16, the default load) and 8-bit and 4-bit asymmetric group 32 packed
// (buildQuant22M, the runtime's default kernels per width), on one thread
// and on all CPUs, against the memory bandwidth measured in the same
// process, interleaved: each sub-benchmark takes one bandwidth sample
// (bwSample, at its own thread count) right before and one right after
// its timed decode loop, and reports their totals over both.
//
// Metrics: tokens/s (wall); MB/token, the weight bytes a token reads
// (decodeBytesPerToken, 1e6 B); weight_GB/s = MB/token · tokens/s / 1e3;
// read_GB/s, the DRAM read bandwidth (row sums by the float GEMV over a
// buffer of bwBufferBytes, twice the last-level cache: bwBuffers.read); copy_GB/s, the DRAM copy
// bandwidth counted as bytes read + bytes written; x_read =
// weight_GB/s / read_GB/s, the ratio (goal ≥ 0.8), taken against
// the read bandwidth since decode only reads weights; warm_GB/s, the read
// bandwidth of a working set the size of MB/token (LLC-resident when it
// fits), and x_warm = weight_GB/s / warm_GB/s. The model's 8-bit, 4-bit
// and BF16 forms (11-44 MB) fit or nearly fit a 32 MiB last-level cache,
// so its ratios to DRAM bandwidth are unreliable;
// BenchmarkDecodeBandwidthBig measures a model that fits in none.
func BenchmarkDecodeBandwidth22M(b *testing.B) {
	bb := newBWBuffers(bwBufferBytes())
	f32Dir := writeSyntheticLlama(b)
	bf16Dir := writeSyntheticLlamaAs(b, safetensors.BF16)
	load := func(b *testing.B, format string, threads int) Model {
		switch format {
		case "f32":
			return loadDirOpts(b, f32Dir, LoadOptions{Threads: threads})
		case "bf16":
			return loadDirOpts(b, bf16Dir, LoadOptions{Threads: threads})
		}
		o := map[string]weights.Options{"8bit-g32": {Bits: 8, GroupSize: 32}, "4bit-g32": {Bits: 4, GroupSize: 32}}[format]
		d, src := buildQuant22M(o)
		m, err := NewCPU().Load(context.Background(), d, src, LoadOptions{Threads: threads})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { m.Close() })
		return m
	}
	threadCounts := []int{1}
	if n := goruntime.NumCPU(); n > 1 {
		threadCounts = append(threadCounts, n)
	}
	for _, threads := range threadCounts {
		for _, format := range []string{"f32", "bf16", "8bit-g32", "4bit-g32"} {
			b.Run(fmt.Sprintf("%s/threads=%d", format, threads), func(b *testing.B) {
				m := load(b, format, threads)
				d := m.Description()
				perTok := decodeBytesPerToken(m.(*cpuModel))
				var dram, cp, warm bwMeter
				bb.bwSample(&dram, &cp, &warm, threads, perTok)
				c := m.NewCache(129)
				logits := make([]float32, d.VocabSize)
				tok := []int{1}
				ctx := context.Background()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if c.Len() == 128 {
						c.Truncate(0)
					}
					if err := m.Forward(ctx, tok, c, logits, false); err != nil {
						b.Fatal(err)
					}
					tok[0] = Argmax(logits)
				}
				b.StopTimer()
				bb.bwSample(&dram, &cp, &warm, threads, perTok)
				tps := float64(b.N) / b.Elapsed().Seconds()
				wgbs := float64(perTok) * tps / 1e9
				b.ReportMetric(tps, "tokens/s")
				b.ReportMetric(float64(perTok)/1e6, "MB/token")
				b.ReportMetric(wgbs, "weight_GB/s")
				b.ReportMetric(dram.rate(), "read_GB/s")
				b.ReportMetric(cp.rate(), "copy_GB/s")
				b.ReportMetric(wgbs/dram.rate(), "x_read")
				b.ReportMetric(warm.rate(), "warm_GB/s")
				b.ReportMetric(wgbs/warm.rate(), "x_warm")
			})
		}
	}
}
