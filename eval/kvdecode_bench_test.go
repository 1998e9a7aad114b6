package eval

import (
	"context"
	"testing"

	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// BenchmarkDecodeTiny1M measures decode tokens/s per KV cache kind on
// tiny1m-hf (head_dim 64) at its full context of 256: 255 tokens are
// prefilled into the cache once, then each iteration is one Forward of one
// token at position 255 (reading all 255 cached tokens through the kind's
// storage format) followed by Truncate(255). No fp16 windows
// (Options.ExactWindows, Sink = Recent = 0), so every cached token of a
// quantised kind is stored quantised; oscar2/oscar4 use seeded random
// orthogonal rotations (semRotations: the cost does not depend on the
// calibrated values). Metrics: tokens/s (decode steps per second of
// b.Elapsed), KV-bytes@255 (the cache's Bytes() holding the 255 tokens a
// step reads: kivi2/oscars2 then keep their unfinished 31-token block in
// fp16) and KV-bytes@256 (after one more token: every block full). Run one kind at a time on
// a shared machine, e.g. -bench 'DecodeTiny1M/oscar2$' -benchtime 20x.
func BenchmarkDecodeTiny1M(b *testing.B) {
	m := loadShared(b, "tiny1m-hf")
	d := m.Description()
	layers := kvcache.LayersOf(d)
	const ctx = 256
	ids := semIDs(ctx, d.VocabSize)
	logits := make([]float32, ctx*d.VocabSize)
	opt := kvcache.Options{ExactWindows: true, Rotations: semRotations(layers)}
	for _, name := range kvcache.Methods() {
		if _, err := kvcache.New(name, layers, ctx, opt); err != nil {
			b.Fatalf("%s: %v", name, err) // every kind supports head_dim 64
		}
		b.Run(name, func(b *testing.B) {
			var c runtime.KVCache
			if name == "fp32" {
				c = m.NewCache(ctx)
			} else {
				var err error
				if c, err = kvcache.New(name, layers, ctx, opt); err != nil {
					b.Fatal(err)
				}
			}
			if err := m.Forward(context.Background(), ids[:ctx-1], c, logits, false); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := m.Forward(context.Background(), ids[ctx-1:], c, logits, false); err != nil {
					b.Fatal(err)
				}
				c.Truncate(ctx - 1)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			b.StopTimer()
			at255 := c.Bytes()
			if err := m.Forward(context.Background(), ids[ctx-1:], c, logits, false); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(at255), "KV-bytes@255")
			b.ReportMetric(float64(c.Bytes()), "KV-bytes@256")
		})
	}
}
