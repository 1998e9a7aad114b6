package kvcache

import (
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
)

// loadStories loads stories260K on the CPU backend.
func loadStories(tb testing.TB, threads int) (runtime.Model, *arch.Description) {
	tb.Helper()
	dir := shared.Path(tb, "stories260K-hf")
	d, err := arch.Load(dir)
	if err != nil {
		tb.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer ck.Close()
	m, err := runtime.NewCPU().Load(context.Background(), d, ck, runtime.LoadOptions{Threads: threads})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	return m, d
}

// storyTokens returns the first n token ids of the TinyStories validation
// text (uint16 little endian).
func storyTokens(tb testing.TB, n int) []int {
	tb.Helper()
	raw, err := os.ReadFile(shared.Path(tb, "stories260K-hf", "reference", "tinystories_val.tok512.u16"))
	if err != nil {
		tb.Fatal(err)
	}
	if len(raw) < 2*n {
		tb.Fatalf("tinystories_val.tok512.u16: %d bytes, want ≥ %d", len(raw), 2*n)
	}
	out := make([]int, n)
	for i := range out {
		out[i] = int(binary.LittleEndian.Uint16(raw[2*i:]))
	}
	return out
}

// logitStats compares got to ref ([T, V] each): max |Δ|, mean KL(ref‖got)
// of the softmaxes in nats, and the fraction of rows with the same argmax.
func logitStats(ref, got []float32, V int) (maxAbs, kl, top1 float64) {
	T := len(ref) / V
	for t := 0; t < T; t++ {
		r, g := ref[t*V:(t+1)*V], got[t*V:(t+1)*V]
		lr, lg := logSoftmax(r), logSoftmax(g)
		var k float64
		for i := range r {
			maxAbs = max(maxAbs, math.Abs(float64(r[i]-g[i])))
			k += math.Exp(lr[i]) * (lr[i] - lg[i])
		}
		kl += k
		if runtime.Argmax(r) == runtime.Argmax(g) {
			top1++
		}
	}
	return maxAbs, kl / float64(T), top1 / float64(T)
}

func logSoftmax(x []float32) []float64 {
	m := math.Inf(-1)
	for _, v := range x {
		m = max(m, float64(v))
	}
	var s float64
	for _, v := range x {
		s += math.Exp(float64(v) - m)
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v) - m - math.Log(s)
	}
	return out
}

// forwardSteps runs tokens through m with cache: one prefill Forward of
// the first `prefill` tokens, then one token per Forward, and returns the
// logits of every position, [len(tokens), vocab].
func forwardSteps(tb testing.TB, m runtime.Model, V int, cache runtime.KVCache, tokens []int, prefill int) []float32 {
	tb.Helper()
	out := make([]float32, len(tokens)*V)
	if err := m.Forward(context.Background(), tokens[:prefill], cache, out, true); err != nil {
		tb.Fatal(err)
	}
	for p := prefill; p < len(tokens); p++ {
		if err := m.Forward(context.Background(), tokens[p:p+1], cache, out[p*V:(p+1)*V], false); err != nil {
			tb.Fatal(err)
		}
	}
	return out
}

// End to end on stories260K: 64 tokens of text, a 32-token prefill and 32
// decode steps through each cache, against one float32 pass with the
// runtime's own cache. Windows are off (kivi2/oscars2: a 16-token
// residual) so that quantization is exercised; oscar2/oscar4 use the
// uncalibrated Hadamard rotation.
func TestStories260KEndToEnd(t *testing.T) {
	m, d := loadStories(t, 2)
	const T = 64
	V := d.VocabSize
	toks := storyTokens(t, T)
	ref := make([]float32, T*V)
	if err := m.Forward(context.Background(), toks, m.NewCache(T), ref, true); err != nil {
		t.Fatal(err)
	}
	layers := LayersOf(d)
	cases := []struct {
		name       string
		opt        Options
		maxAbs, kl float64 // upper bounds
		top1       float64 // lower bound
		quantizes  bool
	}{
		{"fp32", Options{}, 1e-3, 1e-7, 1, false},
		{"fp16", Options{}, 0.05, 1e-4, 0.98, true},
		{"int8", Options{}, 1, 2e-3, 0.9, true},
		{"int4", Options{}, math.Inf(1), 0.5, 0.6, true},
		{"int2-naive", Options{}, math.Inf(1), 5, 0.1, true},
		{"kivi2", Options{Recent: 16}, math.Inf(1), 5, 0.1, true},
		{"quarot2", Options{}, math.Inf(1), 5, 0.1, true},
		{"oscar2", Options{Rotations: hadamardRotations(layers, 0.96, 0.92)}, math.Inf(1), 5, 0.1, true},
		{"oscar4", Options{Rotations: hadamardRotations(layers, 0.96, 0.92)}, math.Inf(1), 0.5, 0.6, true},
		{"oscars2", Options{Recent: 16}, math.Inf(1), 5, 0.1, true},
	}
	for _, c := range cases {
		cache := mustNew(t, c.name, layers, T, c.opt)
		got := forwardSteps(t, m, V, cache, toks, 32)
		for i, x := range got {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Fatalf("%s: logit %d is %v", c.name, i, x)
			}
		}
		ma, kl, top1 := logitStats(ref, got, V)
		bits := cache.(Sizer).BitsPerElement()
		t.Logf("%-10s max|Δlogit| %.4f  KL %.5f nats  top-1 %.3f  %.3f bits/element", c.name, ma, kl, top1, bits)
		if !(ma <= c.maxAbs) || !(kl <= c.kl) || top1 < c.top1 {
			t.Errorf("%s: max|Δ| %.4g (≤ %g), KL %.4g (≤ %g), top-1 %.3f (≥ %g)", c.name, ma, c.maxAbs, kl, c.kl, top1, c.top1)
		}
		if c.quantizes && kl == 0 {
			t.Errorf("%s: logits identical to fp32: the cache did not quantize", c.name)
		}
	}
}

// TestRotationLeavesAttentionUnchanged: with the quantizer removed (a
// float32 store), the OSCAR rotation (random orthogonal R_K, R_V per
// layer, applied to K and V and undone on Read) leaves the model's logits
// — and so every layer's attention output — unchanged within 1e-5
// relative. (OScaR's transforms are checked element-wise in
// TestTransformsWithoutQuantization; its fixed fp16 residual window would
// add fp16 rounding to a logit comparison.)
func TestRotationLeavesAttentionUnchanged(t *testing.T) {
	m, d := loadStories(t, 1)
	layers := LayersOf(d)
	toks := storyTokens(t, 160)
	V := d.VocabSize
	ref := forwardSteps(t, m, V, m.NewCache(len(toks)), toks, 40)
	rng := rand.New(rand.NewPCG(5, 6))
	rot := randRotations(rng, layers, 0, 0)
	for _, sp := range []spec{
		{name: "oscar-f32", k: sideSpec{store: storeF32, rot: rotMatrix}, v: sideSpec{store: storeF32, rot: rotMatrix}, block: 1, needRot: true},
	} {
		c, err := newCache(sp, layers, len(toks), Options{Rotations: rot})
		if err != nil {
			t.Fatal(err)
		}
		got := forwardSteps(t, m, V, c, toks, 40)
		maxAbs, _, top1 := logitStats(ref, got, V)
		t.Logf("%s: max |Δlogit| %.3g", sp.name, maxAbs)
		if maxAbs > 1e-5*20 || top1 != 1 { // logits reach |20|: 1e-5 relative
			t.Errorf("%s: max |Δlogit| %.3g, top-1 agreement %g", sp.name, maxAbs, top1)
		}
		if maxAbs == 0 {
			t.Errorf("%s: logits identical to the bit: the rotation did not run", sp.name)
		}
	}
}
