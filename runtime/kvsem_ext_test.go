package runtime_test

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// Tests of the KV semantics of Forward (runtime.QuantizedKV): a call's
// own tokens attend to each other through their fresh float32 keys and
// values; tokens of earlier calls are read as the cache serves them to
// each query position.

// semModel is a small Llama (GQA 6:2, head_dim 8) with layers layers.
func semModel(t *testing.T, layers int, seed uint64) (runtime.Model, *arch.Description, map[string][]float64) {
	t.Helper()
	return semModelCfg(t, runtime.With(runtime.BaseConfig("LlamaForCausalLM"), "num_hidden_layers", layers), seed)
}

func semModelCfg(t *testing.T, cfg map[string]any, seed uint64) (runtime.Model, *arch.Description, map[string][]float64) {
	t.Helper()
	dir, d, w := runtime.SynthCheckpoint(t, cfg, seed, safetensors.F32)
	m, _ := runtime.LoadDir(t, dir, 2)
	return m, d, w
}

// randOrth returns a random orthogonal [d, d] matrix (Gram–Schmidt in
// float64 on a Gaussian matrix).
func randOrth(rng *rand.Rand, d int) []float32 {
	q := make([][]float64, d)
	for i := range q {
		q[i] = make([]float64, d)
		for j := range q[i] {
			q[i][j] = rng.NormFloat64()
		}
		for k := 0; k < i; k++ {
			var dot float64
			for j := range q[i] {
				dot += q[i][j] * q[k][j]
			}
			for j := range q[i] {
				q[i][j] -= dot * q[k][j]
			}
		}
		var n float64
		for _, x := range q[i] {
			n += x * x
		}
		n = math.Sqrt(n)
		for j := range q[i] {
			q[i][j] /= n
		}
	}
	out := make([]float32, d*d)
	for i := range q {
		for j := range q[i] {
			out[i*d+j] = float32(q[i][j])
		}
	}
	return out
}

// semOptions returns kvcache options for method: the given windows and,
// for oscar2/oscar4/oscar-mixed, random rotations with clipping that
// bites at head_dim 8 and per-layer widths.
func semOptions(method string, layers []kvcache.Layer, sink, recent int) kvcache.Options {
	opt := kvcache.Options{Sink: sink, Recent: recent}
	if strings.HasPrefix(method, "oscar") && method != "oscars2" {
		rng := rand.New(rand.NewPCG(5, 6))
		r := &kvcache.Rotations{}
		for i, l := range layers {
			r.K = append(r.K, randOrth(rng, l.HeadDim))
			r.V = append(r.V, randOrth(rng, l.HeadDim))
			r.ClipK, r.ClipV = append(r.ClipK, 0.8), append(r.ClipV, 0.9)
			// oscar-mixed: every width on K and on V across the layers.
			r.BitsK, r.BitsV = append(r.BitsK, kvcache.MixedWidths[i%3]), append(r.BitsV, kvcache.MixedWidths[(i+1)%3])
		}
		opt.Rotations = r
	}
	return opt
}

// semMethods returns the cache kinds that take d's layers (q8_0 and q4_0
// refuse head_dim 8, as llama.cpp does).
func semMethods(t *testing.T, d *arch.Description) []string {
	var out []string
	for _, m := range kvcache.Methods() {
		if _, err := kvcache.New(m, kvcache.LayersOf(d), 1, semOptions(m, kvcache.LayersOf(d), 0, 0)); err != nil {
			t.Logf("%s: skipped: %v", m, err)
			continue
		}
		out = append(out, m)
	}
	return out
}

func semCache(t *testing.T, method string, d *arch.Description, capacity, sink, recent int) runtime.KVCache {
	t.Helper()
	layers := kvcache.LayersOf(d)
	c, err := kvcache.New(method, layers, capacity, semOptions(method, layers, sink, recent))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// relDiff is max|a−b| / max|b|.
func relDiff(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		num = max(num, math.Abs(float64(a[i])-float64(b[i])))
		den = max(den, math.Abs(float64(b[i])))
	}
	return num / den
}

func semTokens(n int, V int) []int {
	rng := rand.New(rand.NewPCG(11, 12))
	out := make([]int, n)
	for i := range out {
		out[i] = rng.IntN(V)
	}
	return out
}

func forwardInto(t *testing.T, m runtime.Model, toks []int, c runtime.KVCache, logits []float32, all bool) {
	t.Helper()
	if err := m.Forward(context.Background(), toks, c, logits, all); err != nil {
		t.Fatal(err)
	}
}

// TestPrefillOneCallIsFP32: a prompt prefilled in one call gives the
// float32-KV logits at every prompt position for every cache kind (the
// windows are small, so every kind quantizes most of the prompt): within
// 1e-5 of the largest logit (float32 summation order only). The float32
// cache itself matches the float64 reference forward.
func TestPrefillOneCallIsFP32(t *testing.T) {
	m, d, w := semModel(t, 3, 301)
	const T = 40
	V := d.VocabSize
	toks := semTokens(T, V)
	ref := make([]float32, T*V)
	forwardInto(t, m, toks, m.NewCache(T), ref, true)
	if e := runtime.MaxAbsDiff(ref, runtime.Flatten(mustRef(d, w, toks))); e > 1e-4 {
		t.Fatalf("fp32 KV vs float64 reference: max|Δlogit| %.3g > 1e-4", e)
	}
	for _, method := range semMethods(t, d) {
		for _, win := range [][2]int{{0, 0}, {2, 4}} {
			recent := win[1]
			if recent == 0 && (method == "kivi2" || method == "oscars2") {
				recent = 1 // no 128-token default residual
			}
			got := make([]float32, T*V)
			forwardInto(t, m, toks, semCache(t, method, d, T, win[0], recent), got, true)
			e := relDiff(got, ref)
			t.Logf("%-10s sink %d recent %d: prefill vs fp32 KV rel %.2g", method, win[0], recent, e)
			if e > 1e-5 {
				t.Errorf("%s (sink %d, recent %d): one-call prefill differs from fp32 KV logits by %.3g relative (want ≤ 1e-5)", method, win[0], recent, e)
			}
		}
	}
}

func mustRef(d *arch.Description, w map[string][]float64, toks []int) [][]float64 {
	l, _ := runtime.RefForward(d, w, toks)
	return l
}

// servedF32 returns a float32 cache of capacity cap holding positions
// [0, n) of every layer as c's Read serves them now.
func servedF32(d *arch.Description, c runtime.KVCache, n, capacity int) *runtime.F32Cache {
	kv, hd := make([]int, len(d.Layers)), make([]int, len(d.Layers))
	for i, l := range d.Layers {
		kv[i], hd[i] = l.KVDim(), l.HeadDim
	}
	f := runtime.NewF32Cache(kv, hd, capacity)
	for li, l := range d.Layers {
		k, v := make([]float32, n*kv[li]), make([]float32, n*kv[li])
		kh, vh := make([]float32, n*l.HeadDim), make([]float32, n*l.HeadDim)
		for h := 0; h < l.NumKVHeads; h++ {
			c.Read(li, h, n, kh, vh)
			for p := 0; p < n; p++ {
				copy(k[p*kv[li]+h*l.HeadDim:], kh[p*l.HeadDim:(p+1)*l.HeadDim])
				copy(v[p*kv[li]+h*l.HeadDim:], vh[p*l.HeadDim:(p+1)*l.HeadDim])
			}
		}
		if n > 0 {
			f.Write(li, 0, n, k, v)
		}
	}
	f.Commit(n)
	return f
}

// TestDecodeReadsPromptQuantized: after a one-call prefill of P tokens,
// each decode step reads the earlier tokens in the cache's storage format
// and its own token fresh: its logits equal those of a float32 cache
// filled with the quantized cache's dequantized rows of the earlier
// tokens (1e-5 relative), and, for the 2-bit kinds, differ from the
// float32-KV logits.
func TestDecodeReadsPromptQuantized(t *testing.T) {
	m, d, _ := semModel(t, 3, 302)
	const T, P = 36, 24
	V := d.VocabSize
	toks := semTokens(T, V)
	ref := make([]float32, T*V)
	forwardInto(t, m, toks, m.NewCache(T), ref, true)
	for _, method := range semMethods(t, d) {
		if method == "fp32" {
			continue
		}
		c := semCache(t, method, d, T, 1, 3)
		got := make([]float32, T*V)
		forwardInto(t, m, toks[:P], c, got, true)
		var worst, fromFP32 float64
		for p := P; p < T; p++ {
			row := got[p*V : (p+1)*V]
			forwardInto(t, m, toks[p:p+1], c, row, false)
			want := make([]float32, V)
			forwardInto(t, m, toks[p:p+1], servedF32(d, c, p, p+1), want, false)
			worst = max(worst, relDiff(row, want))
			fromFP32 = max(fromFP32, relDiff(row, ref[p*V:(p+1)*V]))
		}
		t.Logf("%-10s decode vs explicit dequantized reference rel %.2g, vs fp32 KV rel %.3g", method, worst, fromFP32)
		if worst > 1e-5 {
			t.Errorf("%s: decode logits differ from the dequantized-earlier-tokens reference by %.3g relative (want ≤ 1e-5)", method, worst)
		}
		if strings.Contains(method, "2") && fromFP32 < 1e-3 {
			t.Errorf("%s: decode logits within %.3g of fp32 KV: the prompt was not read quantized", method, fromFP32)
		}
	}
}

// kvRecorder keeps every layer-0 key and value row Forward computes.
type kvRecorder struct{ k, v []float32 }

func (r *kvRecorder) QKV(layer, pos, n int, q, k, v []float32) {
	if layer != 0 {
		return
	}
	d := len(k) / n
	if need := (pos + n) * d; len(r.k) < need {
		r.k, r.v = append(r.k, make([]float32, need-len(r.k))...), append(r.v, make([]float32, need-len(r.v))...)
	}
	copy(r.k[pos*d:], k[:n*d])
	copy(r.v[pos*d:], v[:n*d])
}

// TestChunkedPrefillWindows: on a one-layer model (so that every key and
// value depends only on its token and position), a prompt prefilled in
// chunks of C tokens gives at each position p of a chunk starting at c0
// the logits of "earlier chunks as the cache serves them to p, own chunk
// fresh": a float32 cache holding positions [0, c0) read from a second
// cache of the same kind written with the same keys and values, chunk by
// chunk up to c0 and then [c0, p] in one call (a token that leaves the
// fp16 window within its own Write is quantized from float32, one that
// leaves it later from its binary16 row, so the reference writes as the
// run did), then the chunk's tokens [c0, p]. For the per-token
// kinds the served rows are also checked element-wise against the
// windows: with sink S and recent R, position j < c0 is binary16 rounding
// of its key exactly when j < S or p−R < j, and quantized otherwise. The
// same on a Qwen2 layer with a sliding attention window of 9 tokens.
func TestChunkedPrefillWindows(t *testing.T) {
	t.Run("llama", func(t *testing.T) {
		m, d, _ := semModel(t, 1, 303)
		chunkedPrefillWindows(t, m, d)
	})
	t.Run("qwen2-sliding", func(t *testing.T) {
		cfg := runtime.With(runtime.BaseConfig("Qwen2ForCausalLM"), "num_hidden_layers", 1, "use_sliding_window", true, "sliding_window", 9, "max_window_layers", 0)
		m, d, _ := semModelCfg(t, cfg, 304)
		if d.Layers[0].SlidingWindow != 9 {
			t.Fatalf("layer 0 sliding window %d, want 9", d.Layers[0].SlidingWindow)
		}
		chunkedPrefillWindows(t, m, d)
	})
}

func chunkedPrefillWindows(t *testing.T, m runtime.Model, d *arch.Description) {
	const T, C, S, R = 40, 7, 3, 5
	V := d.VocabSize
	toks := semTokens(T, V)
	ref := make([]float32, T*V)
	forwardInto(t, m, toks, m.NewCache(T), ref, true)
	l0 := d.Layers[0]
	kvd, hd := l0.KVDim(), l0.HeadDim
	perToken := map[string]bool{"int8": true, "int4": true, "int2-naive": true, "quarot2": true, "oscar2": true, "oscar2-g32": true, "oscar4": true}
	for _, method := range semMethods(t, d) {
		if method == "fp32" {
			continue
		}
		rec := &kvRecorder{}
		m.SetObserver(rec)
		c := semCache(t, method, d, T, S, R)
		got := make([]float32, T*V)
		for c0 := 0; c0 < T; c0 += C {
			c1 := min(T, c0+C)
			forwardInto(t, m, toks[c0:c1], c, got[c0*V:c1*V], true)
		}
		m.SetObserver(nil)
		var worst, fromFP32 float64
		var fp16Rows, quantRows int
		for c0 := 0; c0 < T; c0 += C {
			for p := c0; p < min(T, c0+C); p++ {
				// The cache as it serves the earlier chunks to p: the
				// earlier chunks written as the run wrote them, then
				// the chunk's tokens up to p.
				q := semCache(t, method, d, T, S, R)
				for a := 0; a <= p; a += C {
					b := min(a+C, p+1)
					q.Write(0, a, b-a, rec.k[a*kvd:b*kvd], rec.v[a*kvd:b*kvd])
					q.Commit(b - a)
				}
				f := servedF32(d, q, c0, p+1)
				want := make([]float32, V)
				forwardInto(t, m, toks[c0:p+1], f, want, false)
				worst = max(worst, relDiff(got[p*V:(p+1)*V], want))
				fromFP32 = max(fromFP32, relDiff(got[p*V:(p+1)*V], ref[p*V:(p+1)*V]))
				if !perToken[method] {
					continue
				}
				fk, _ := f.F32(0)
				h16 := make([]float32, kvd)
				for j := 0; j < c0; j++ {
					kvq.DecodeF16(h16, encF16(rec.k[j*kvd:(j+1)*kvd]))
					same := true
					for i := 0; i < kvd; i++ {
						same = same && fk[j*kvd+i] == h16[i]
					}
					window := j < S || j > p-R
					if window {
						fp16Rows++
					} else {
						quantRows++
					}
					if same != window {
						t.Fatalf("%s: query %d reads position %d as binary16 = %v, want %v (sink %d, recent %d, head_dim %d)", method, p, j, same, window, S, R, hd)
					}
				}
			}
		}
		t.Logf("%-10s chunked prefill vs reference rel %.2g, vs fp32 KV rel %.3g (fp16 rows %d, quantized %d)", method, worst, fromFP32, fp16Rows, quantRows)
		if worst > 1e-5 {
			t.Errorf("%s: chunked prefill differs from the earlier-chunks-served reference by %.3g relative (want ≤ 1e-5)", method, worst)
		}
		if strings.Contains(method, "2") && fromFP32 < 1e-3 {
			t.Errorf("%s: chunked prefill within %.3g of fp32 KV: earlier chunks were not read quantized", method, fromFP32)
		}
	}
}

func encF16(x []float32) []uint16 {
	out := make([]uint16, len(x))
	kvq.EncodeF16(out, x)
	return out
}
