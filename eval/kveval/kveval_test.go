package kveval

import (
	"context"
	"math"
	"testing"

	"github.com/lmpack/lmpack/eval"
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// TestEqualFooting on tiny1m-hf (ctx 64, one window): without
// --kv-window, kivi2 keeps its 128-token residual, which covers the
// context: the row is marked nothing quantised and costs 16 bits at ctx 64
// but its quantised rate at the serving context. With --kv-window 0,0 it
// quantises every token like int4, and a 16+64 window covering ctx 64 is
// marked for every method. The fake-quant protocol quantises the query's
// own key too, so its KL differs from decode's.
func TestEqualFooting(t *testing.T) {
	e, err := engine.Open(context.Background(), shared.Path(t, "tiny1m-hf"), engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	data := shared.Path(t, "tinystories-valid", "heldout.txt")
	run := func(o Options) map[string]eval.KVRow {
		o.Ctx, o.MaxWindows, o.Methods, o.ServingCtx = 64, 1, []string{"int4", "kivi2"}, 32768
		o.Chunk = max(o.Chunk, 1)
		rep, err := Run(context.Background(), e, data, o)
		if err != nil {
			t.Fatal(err)
		}
		rows := map[string]eval.KVRow{}
		for _, r := range rep.Rows {
			rows[r.KV] = r
		}
		return rows
	}
	layers := kvcache.LayersOf(e.Desc)
	serving, _ := kvcache.BitsAt("kivi2", layers, kvcache.Options{}, 32768)
	def := run(Options{})
	if k := def["kivi2"]; !k.NothingQuantized || k.BitsPerElement != 16 || k.BitsServing != serving || !(k.KL < 1e-6) {
		t.Errorf("kivi2 without --kv-window at ctx 64: %+v, want nothing quantised, 16 bits, %.4f at 32768, KL of fp16 rounding (< 1e-6)", k, serving)
	}
	if i := def["int4"]; i.NothingQuantized || !(i.KL > 0) {
		t.Errorf("int4: %+v, want quantised with KL > 0", i)
	}
	zero := run(Options{Windows: true})
	if k := zero["kivi2"]; k.NothingQuantized || !(k.BitsPerElement < 4) || !(k.KL > 0) || len(zero) != 2 {
		t.Errorf("kivi2 with --kv-window 0,0: %+v (rows %d), want every token quantised (< 4 bits), KL > 0, no extra rows", k, len(zero))
	}
	// fp16 tokens per query (ctx 64, positions 0..62 scored, decode, one
	// token per call): int4 with no windows reads none; kivi2 reads its
	// unfinished 32-token block in fp16 until the query's own write
	// completes it (the runtime quantizes after the Write,
	// runtime/kvcache/doc.go), so query t reads q_t = min(t, 32·⌊(t+1)/32⌋)
	// of its t cached tokens quantised and t − q_t in fp16.
	qKivi := func(tt int) int { return min(tt, (tt+1)/32*32) }
	var wantKivi float64
	for tt := 0; tt <= 62; tt++ {
		wantKivi += float64(tt - qKivi(tt))
	}
	wantKivi /= 63
	if i, k := zero["int4"], zero["kivi2"]; !i.FP16PerQueryKnown || i.FP16PerQuery != 0 || !k.FP16PerQueryKnown || math.Abs(k.FP16PerQuery-wantKivi) > 1e-9 {
		t.Errorf("fp16 tokens per query at 0,0: int4 %g (known %v), kivi2 %g (known %v), want 0 and %.4f", i.FP16PerQuery, i.FP16PerQueryKnown, k.FP16PerQuery, k.FP16PerQueryKnown, wantKivi)
	}
	// Bits per element read at 0,0: int4 holds every token in its one
	// layout, so its queries read what its bits column says; kivi2's
	// queries read q_t tokens at its quantised rate (its layout at 32
	// tokens) and t − q_t at 16 bits, averaged over the Σ t elements read,
	// above its bits column (the full window, no fp16 block).
	exact := kvcache.Options{ExactWindows: true}
	rate, err := kvcache.BitsAt("kivi2", layers, exact, 32)
	if err != nil {
		t.Fatal(err)
	}
	var sum, elems float64
	for tt := 1; tt <= 62; tt++ {
		q := float64(qKivi(tt))
		sum += rate*q + 16*(float64(tt)-q)
		elems += float64(tt)
	}
	wantRead := sum / elems
	if i, k := zero["int4"], zero["kivi2"]; math.Abs(i.BitsRead-i.BitsPerElement) > 1e-9 || math.Abs(k.BitsRead-wantRead) > 1e-9 || !(k.BitsRead > k.BitsPerElement+1) {
		t.Errorf("bits read at 0,0: int4 %g (bits %g), kivi2 %g (bits %g), want int4's bits and %.4f (> bits + 1)", i.BitsRead, i.BitsPerElement, k.BitsRead, k.BitsPerElement, wantRead)
	}
	win := run(Options{Windows: true, Sink: 16, Recent: 64})
	for _, name := range []string{"int4+w16,64", "kivi2+w16,64"} {
		r, ok := win[name]
		if !ok || !r.NothingQuantized || !(r.KL < 1e-6) {
			t.Errorf("%s at ctx 64: %+v, want a row marked nothing quantised with the KL of fp16 rounding (< 1e-6)", name, r)
		}
	}
	// Windows of ctx−1 = 63 tokens: the last scored position (62) writes
	// itself into the recent window, which then holds positions 1..62, so
	// every earlier token it reads is fp16 although the cache quantises a
	// token at ctx 64; with 1+61 the recent window holds 2..62 once
	// position 62 is written, and that query reads token 1 quantised.
	edge := run(Options{Windows: true, Sink: 1, Recent: 62})
	if r := edge["int4+w1,62"]; !r.NothingQuantized || !(r.KL < 1e-6) || r.BitsRead != 16 {
		t.Errorf("int4+w1,62 at ctx 64: %+v, want nothing quantised, KL < 1e-6, 16 bits read", r)
	}
	edge = run(Options{Windows: true, Sink: 1, Recent: 61})
	if r := edge["int4+w1,61"]; r.NothingQuantized || !(r.BitsRead < 16) {
		t.Errorf("int4+w1,61 at ctx 64: %+v, want one token read quantised by the last position (bits read < 16)", r)
	}
	fake := run(Options{Protocol: eval.ProtocolFakeQuant})
	if k, d := fake["kivi2"], zero["kivi2"]; k.NothingQuantized || k.BitsPerElement != d.BitsPerElement || math.Abs(k.KL-d.KL) < 1e-6 {
		t.Errorf("kivi2 fake-quant %+v vs decode 0,0 %+v: want the same storage, a different KL", k, d)
	}
}
