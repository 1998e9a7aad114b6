package eval

import (
	"context"
	"testing"

	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// BenchmarkCompareKV measures the eval's cost per protocol on tiny1m-hf
// (4 windows of 128 tokens, kinds int4 and kivi2 without windows):
// decode (one token per call, windows batched per step), decode with
// chunks of 16 tokens, and fake-quant (each window in one call). The
// metric eval_tokens/s counts the tokens fed through the compared caches
// per second of the whole CompareKV call (fp32 reference and scoring
// included).
func BenchmarkCompareKV(b *testing.B) {
	m := loadShared(b, "tiny1m-hf")
	d := m.Description()
	layers := kvcache.LayersOf(d)
	const T, nWin = 128, 4
	ids := semIDs(T*nWin, d.VocabSize)
	kinds := []string{"int4", "kivi2"}
	for _, c := range []struct {
		name          string
		fake          bool
		prompt, chunk int
	}{{"decode", false, 0, 1}, {"decode-chunk16", false, 0, 16}, {"fake-quant", true, 0, T}} {
		b.Run(c.name, func(b *testing.B) {
			var methods []KVMethod
			for _, k := range kinds {
				newCache := kvcache.New
				if c.fake {
					newCache = kvcache.NewFakeQuant
				}
				opt := kvcache.Options{ExactWindows: true}
				methods = append(methods, KVMethod{Name: k, New: func(n int) (runtime.KVCache, error) { return newCache(k, layers, n, opt) }})
			}
			proto := ProtocolDecode
			if c.fake {
				proto = ProtocolFakeQuant
			}
			for b.Loop() {
				if _, err := CompareKV(context.Background(), m, ids, methods, KVCompareOptions{Ctx: T, Prompt: c.prompt, Chunk: c.chunk, Protocol: proto}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*nWin*T*len(kinds))/b.Elapsed().Seconds(), "eval_tokens/s")
		})
	}
}
