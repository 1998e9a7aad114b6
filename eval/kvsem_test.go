package eval

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// loadShared loads a model of ../shared/data on the CPU (one thread).
func loadShared(t testing.TB, name string) runtime.Model {
	t.Helper()
	dir := shared.Path(t, name)
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	m, err := runtime.NewCPU().Load(context.Background(), d, ck, runtime.LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// semRotations returns random orthogonal OSCAR rotations (Gram–Schmidt on
// a seeded Gaussian matrix) with the published INT2 clipping ratios.
func semRotations(layers []kvcache.Layer) *kvcache.Rotations {
	rng := rand.New(rand.NewPCG(7, 8))
	orth := func(d int) []float32 {
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
			for j := range q[i] {
				q[i][j] /= math.Sqrt(n)
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
	r := &kvcache.Rotations{}
	for i, l := range layers {
		r.K, r.V = append(r.K, orth(l.HeadDim)), append(r.V, orth(l.HeadDim))
		r.ClipK, r.ClipV = append(r.ClipK, 0.96), append(r.ClipV, 0.92)
		// oscar-mixed: every width in {2, 4, 8} on some layer and side.
		r.BitsK = append(r.BitsK, kvcache.MixedWidths[i%len(kvcache.MixedWidths)])
		r.BitsV = append(r.BitsV, kvcache.MixedWidths[(i+1)%len(kvcache.MixedWidths)])
	}
	return r
}

func semIDs(n, V int) []int {
	rng := rand.New(rand.NewPCG(21, 22))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = rng.IntN(V)
	}
	ids[0] = 1
	return ids
}

// TestPrefillWholeWindowIsFP32EveryKind: a whole window prefilled in one
// call (TeacherForce with prompt = window) gives the float32-KV logits at
// every position for every cache kind, no windows (every token of every
// 2/4/8-bit kind quantised): max|Δlogit| ≤ 1e-5 · max|logit| (float32
// summation order only), on tiny1m (head_dim 64).
func TestPrefillWholeWindowIsFP32EveryKind(t *testing.T) {
	m := loadShared(t, "tiny1m-hf")
	d := m.Description()
	layers := kvcache.LayersOf(d)
	const T = 64
	V := d.VocabSize
	win := semIDs(T, V)
	ref := make([]float32, T*V)
	if err := m.Forward(context.Background(), win, m.NewCache(T), ref, true); err != nil {
		t.Fatal(err)
	}
	opt := kvcache.Options{ExactWindows: true, Rotations: semRotations(layers)}
	for _, kind := range kvcache.Methods() {
		c, err := kvcache.New(kind, layers, T, opt)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, T*V)
		if err := TeacherForce(context.Background(), m, [][]int{win}, []runtime.KVCache{c}, [][]float32{got}, T, 1); err != nil {
			t.Fatal(err)
		}
		var num, den float64
		for i := range got {
			num, den = max(num, math.Abs(float64(got[i]-ref[i]))), max(den, math.Abs(float64(ref[i])))
		}
		if q, _ := kvcache.QuantizedAt(kind, opt, T); kind != "fp32" && kind != "fp16" && q != T {
			t.Fatalf("%s: %d of %d tokens quantised, want all", kind, q, T)
		}
		if num > 1e-5*den {
			t.Errorf("%s: one-call prefill differs from fp32 KV by %.3g (max|logit| %.3g), want ≤ 1e-5 relative", kind, num, den)
		}
	}
}

// TestDecodeProtocolIsGeneration: eval's decode protocol (CompareKV,
// windows batched) gives the NLL that feeding each window to
// runtime.Forward one token at a time after a one-call prompt — the path
// of lmpack run — gives on the same tokens, for quantised kinds with and
// without fp16 windows: perplexities equal within 1e-12 relative (the
// batch contract is bit-for-bit; only the float64 summation order
// differs). And the decode rows really quantise: their KL is > 0.
func TestDecodeProtocolIsGeneration(t *testing.T) {
	m := loadShared(t, "tiny1m-hf")
	d := m.Description()
	layers := kvcache.LayersOf(d)
	const T, nWin, P = 48, 3, 8
	V := d.VocabSize
	ids := semIDs(T*nWin, V)
	rot := semRotations(layers)
	type kind struct {
		name string
		opt  kvcache.Options
	}
	kinds := []kind{
		{"int4", kvcache.Options{ExactWindows: true}},
		{"kivi2", kvcache.Options{ExactWindows: true}},
		{"quarot2", kvcache.Options{Sink: 4, Recent: 8, ExactWindows: true}},
		{"oscar2", kvcache.Options{Sink: 4, Recent: 8, ExactWindows: true, Rotations: rot}},
		{"int2-naive", kvcache.Options{ExactWindows: true}},
	}
	var methods []KVMethod
	for _, k := range kinds {
		methods = append(methods, KVMethod{Name: k.name, New: func(n int) (runtime.KVCache, error) { return kvcache.New(k.name, layers, n, k.opt) }})
	}
	rep, err := CompareKV(context.Background(), m, ids, methods, KVCompareOptions{Ctx: T, Prompt: P, Chunk: 1, Batch: 2, Protocol: ProtocolDecode})
	if err != nil {
		t.Fatal(err)
	}
	if rep.TokensScored != nWin*(T-1-P) {
		t.Fatalf("%d positions scored, want %d", rep.TokensScored, nWin*(T-1-P))
	}
	logits := make([]float32, T*V)
	for i, k := range kinds {
		var nll float64
		for w := range nWin {
			win := ids[w*T : (w+1)*T]
			c, _ := kvcache.New(k.name, layers, T, k.opt)
			if err := m.Forward(context.Background(), win[:P], c, logits, false); err != nil {
				t.Fatal(err)
			}
			// The prompt's own positions are not scored; position P is the
			// first decode step.
			for p := P; p+1 < T; p++ {
				if err := m.Forward(context.Background(), win[p:p+1], c, logits, false); err != nil {
					t.Fatal(err)
				}
				nll += NLL(logits[:V], win[p+1])
			}
		}
		want := math.Exp(nll / float64(nWin*(T-1-P)))
		row := rep.Rows[i]
		t.Logf("%s: decode protocol ppl %.6f, token-by-token %.6f, KL %.4g", k.name, row.Perplexity, want, row.KL)
		if math.Abs(row.Perplexity-want) > 1e-12*want {
			t.Errorf("%s: decode protocol perplexity %.15g, token-by-token Forward %.15g", k.name, row.Perplexity, want)
		}
		if !(row.KL > 0) {
			t.Errorf("%s: KL %g, want > 0 (the cache quantises)", k.name, row.KL)
		}
	}
}
