package export

import (
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/quantize/wquant"
)

// BenchmarkCompressedTensors exports tiny1m quantized at 4 bits, group
// 32, asymmetric, and reports the output rate (MB/s), the output size
// (out-MB), its largest tensor (largest-MB) and the bytes allocated per
// export (alloc-MB: safetensors.WriteFile's 1 MiB write buffer per shard,
// five shards here, plus one row of packed words at a time; the tensors'
// bytes are read from the checkpoint's memory map, not copied).
func BenchmarkCompressedTensors(b *testing.B) {
	t1m := shared.Path(b, "tiny1m-hf")
	root := b.TempDir()
	calib := filepath.Join(root, "calib")
	os.MkdirAll(calib, 0o755)
	q := filepath.Join(root, "q")
	if _, err := wquant.Run(b.Context(), wquant.Options{Model: t1m, Calib: benchCalib(b, t1m, calib), Out: q, Method: wquant.MethodRTN,
		Bits: 4, GroupSize: 32, Threads: 1, Version: "bench"}); err != nil {
		b.Fatal(err)
	}
	var out int64
	var largest int64
	var m0, m1 goruntime.MemStats
	b.ResetTimer()
	goruntime.ReadMemStats(&m0)
	for i := 0; b.Loop(); i++ {
		rep, err := CompressedTensors(b.Context(), q, CTOptions{Out: filepath.Join(root, fmt.Sprintf("ct%d", i))})
		if err != nil {
			b.Fatal(err)
		}
		out = rep.Bytes
		for _, r := range rep.Tensors {
			largest = max(largest, r.Bytes)
		}
	}
	goruntime.ReadMemStats(&m1)
	b.ReportMetric(float64(out)*float64(b.N)/1e6/b.Elapsed().Seconds(), "MB/s")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(b.N)/1e6, "alloc-MB")
	b.ReportMetric(float64(out)/1e6, "out-MB")
	b.ReportMetric(float64(largest)/1e6, "largest-MB")
}
