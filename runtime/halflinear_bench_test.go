package runtime

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
)

// halfRSSChild* name the environment of TestHalfDecodeRSSChild: the model
// directory and "inplace" or "widened".
const (
	halfRSSChildDir  = "LMPACK_TEST_HALF_RSS_DIR"
	halfRSSChildMode = "LMPACK_TEST_HALF_RSS_MODE"
)

// procStatusBytes returns field (VmRSS, VmHWM) of /proc/self/status in
// bytes. Errors: the file unreadable (not Linux) or without the field.
func procStatusBytes(field string) (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/self/status: %s %q: %w", field, v, err)
			}
			return kb << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/self/status: no %s line", field)
}

// TestHalfDecodeRSSChild is the process halfDecodeRSS starts: with
// halfRSSChildDir set it loads that model on one thread (BF16 in place, or
// widened with DequantizeWeights), decodes 128 tokens into a 129-token
// cache, and prints "rss-before N", "heap N" (Go heap the model and cache
// hold: KV cache, scratch, norms, and any float32 copies) and "rss-hwm N"
// (VmHWM after decode), in bytes. Without the variable it is skipped.
func TestHalfDecodeRSSChild(t *testing.T) {
	dir := os.Getenv(halfRSSChildDir)
	if dir == "" {
		t.Skip("child process of BenchmarkHalfDecode (set " + halfRSSChildDir + ")")
	}
	before, err := procStatusBytes("VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	heap0 := heapInUse()
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	m, err := NewCPU().Load(context.Background(), d, ck, LoadOptions{Threads: 1, DequantizeWeights: os.Getenv(halfRSSChildMode) == "widened"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := m.NewCache(129)
	logits := make([]float32, d.VocabSize)
	tok := []int{1}
	for i := 0; i < 128; i++ {
		if err := m.Forward(context.Background(), tok, c, logits, false); err != nil {
			t.Fatal(err)
		}
		tok[0] = Argmax(logits)
	}
	heap := int64(heapInUse()) - int64(heap0)
	hwm, err := procStatusBytes("VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("rss-before %d\nheap %d\nrss-hwm %d\n", before, heap, hwm)
}

// halfDecodeRSS runs TestHalfDecodeRSSChild on dir in mode in a fresh
// process (this test binary) and returns what it printed.
func halfDecodeRSS(b *testing.B, dir, mode string) map[string]int64 {
	b.Helper()
	if _, err := procStatusBytes("VmHWM"); err != nil {
		b.Skipf("RSS needs /proc/self/status (Linux): %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHalfDecodeRSSChild$", "-test.count=1", "-test.bench=^$")
	cmd.Env = append(os.Environ(), halfRSSChildDir+"="+dir, halfRSSChildMode+"="+mode)
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("decoding %s (%s) in a child process: %v\n%s", dir, mode, err, out)
	}
	r := map[string]int64{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && (k == "rss-before" || k == "heap" || k == "rss-hwm") {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			r[k] = n
		}
	}
	if len(r) != 3 {
		b.Fatalf("child output without the three figures:\n%s", out)
	}
	return r
}

// BenchmarkHalfDecode measures single-token decode (tg128, as
// BenchmarkDecode) of the 22M synthetic model stored as BF16 (and F16),
// one thread, with the weights in place (the default) and widened to
// float32 at load (DequantizeWeights, the path before in-place weights),
// in tokens/s; weight_GB/s is the bytes of weights each token reads
// (LinearWeightBytes plus a tied lm_head) times tokens/s. In a child
// process (TestHalfDecodeRSSChild) it measures the peak RSS of loading
// and decoding 128 tokens (rss_MiB), the file size (file_MiB), the Go heap
// the model and cache hold (heap_MiB: KV cache and scratch in place, the
// float32 copies too when widened), and rss_ratio = VmHWM / (file + heap)
// and grow_ratio = (VmHWM − RSS before load) / (file + heap), the second
// without the test binary's own pages. -count repeats each mode back to
// back; to interleave the modes A/B/A/B, run the test binary (go test -c)
// several times with -test.count=1.
func BenchmarkHalfDecode(b *testing.B) {
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		dir := writeSyntheticLlamaAs(b, dt)
		st, err := os.Stat(filepath.Join(dir, "model.safetensors"))
		if err != nil {
			b.Fatal(err)
		}
		for _, mode := range []string{"inplace", "widened"} {
			b.Run(fmt.Sprintf("synthetic-22M-%s/%s/threads=1", strings.ToLower(string(dt)), mode), func(b *testing.B) {
				m := loadDirOpts(b, dir, LoadOptions{Threads: 1, DequantizeWeights: mode == "widened"})
				d := m.Description()
				cm := m.(*cpuModel)
				read := cm.weightBytes()
				if d.TieWordEmbeddings {
					read += cm.lmHead.bytes()
				}
				c := m.NewCache(129)
				logits := make([]float32, d.VocabSize)
				tok := []int{1}
				ctx := context.Background()
				b.ReportAllocs()
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
				tps := float64(b.N) / b.Elapsed().Seconds()
				b.ReportMetric(tps, "tokens/s")
				b.ReportMetric(float64(read)*tps/1e9, "weight_GB/s")
				r := halfDecodeRSS(b, dir, mode)
				base := float64(st.Size() + r["heap"])
				b.ReportMetric(float64(r["rss-hwm"])/(1<<20), "rss_MiB")
				b.ReportMetric(float64(st.Size())/(1<<20), "file_MiB")
				b.ReportMetric(float64(r["heap"])/(1<<20), "heap_MiB")
				b.ReportMetric(float64(r["rss-hwm"])/base, "rss_ratio")
				b.ReportMetric(float64(r["rss-hwm"]-r["rss-before"])/base, "grow_ratio")
			})
		}
	}
}

// BenchmarkHalfPrefill measures a 128-token prompt from an empty cache on
// the 22M synthetic model stored as BF16, one thread, with the weights in
// place and widened at load, in tokens/s.
func BenchmarkHalfPrefill(b *testing.B) {
	dir := writeSyntheticLlamaAs(b, safetensors.BF16)
	for _, mode := range []string{"inplace", "widened"} {
		b.Run(fmt.Sprintf("synthetic-22M-bf16/%s/threads=1", mode), func(b *testing.B) {
			m := loadDirOpts(b, dir, LoadOptions{Threads: 1, DequantizeWeights: mode == "widened"})
			d := m.Description()
			const T = 128
			c := m.NewCache(T)
			logits := make([]float32, d.VocabSize)
			toks := make([]int, T)
			for i := range toks {
				toks[i] = (i*131 + 7) % d.VocabSize
			}
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.Truncate(0)
				if err := m.Forward(ctx, toks, c, logits, false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*T)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
