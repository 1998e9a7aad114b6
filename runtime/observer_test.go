package runtime

import (
	"math"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
)

type recorder struct {
	in, out [][]float32 // per layer
	q, k    [][]float32
	ffnX    [][]float32
	ffnH    [][]float32
	calls   int
}

func (r *recorder) BlockInput(l, pos, n int, x []float32) {
	r.in[l] = append([]float32(nil), x...)
	r.calls++
}
func (r *recorder) BlockOutput(l, pos, n int, x []float32) { r.out[l] = append([]float32(nil), x...) }
func (r *recorder) QKV(l, pos, n int, q, k, v []float32) {
	r.q[l], r.k[l] = append([]float32(nil), q...), append([]float32(nil), k...)
}
func (r *recorder) FFNInput(l, pos, n int, x, h []float32) {
	r.ffnX[l], r.ffnH[l] = append([]float32(nil), x...), append([]float32(nil), h...)
}

// TestObservers: each hook sees the right slices: block l's input is block
// l-1's output; keys handed to QKV equal those stored in the cache; FFN
// hooks get [n, hidden] and [n, intermediate_size]; post-RoPE q at
// position 0 equals the pre-RoPE projection (RoPE is the identity there).
func TestObservers(t *testing.T) {
	m, d := loadDir(t, shared.Path(t, "stories260K-hf"), 1)
	L := len(d.Layers)
	r := &recorder{in: make([][]float32, L), out: make([][]float32, L), q: make([][]float32, L), k: make([][]float32, L),
		ffnX: make([][]float32, L), ffnH: make([][]float32, L)}
	m.SetObserver(r)
	toks := []int{1, 403, 407, 261}
	c := m.NewCache(len(toks)).(*F32Cache)
	logits := make([]float32, d.VocabSize)
	if err := m.Forward(t.Context(), toks, c, logits, false); err != nil {
		t.Fatal(err)
	}
	if r.calls != L {
		t.Fatalf("BlockInput called %d times, want %d", r.calls, L)
	}
	H, n := d.HiddenSize, len(toks)
	for l := 1; l < L; l++ {
		for i := range r.in[l] {
			if r.in[l][i] != r.out[l-1][i] {
				t.Fatalf("layer %d input differs from layer %d output at %d", l, l-1, i)
			}
		}
	}
	for l := 0; l < L; l++ {
		kc, _ := c.F32(l)
		kv := d.Layers[l].KVDim()
		if len(r.k[l]) != n*kv || len(r.q[l]) != n*d.Layers[l].QDim() {
			t.Fatalf("layer %d: q %d, k %d elements", l, len(r.q[l]), len(r.k[l]))
		}
		for i := 0; i < n*kv; i++ {
			if r.k[l][i] != kc[i] {
				t.Fatalf("layer %d: observed key %d differs from the cache", l, i)
			}
		}
		if len(r.ffnX[l]) != n*H || len(r.ffnH[l]) != n*d.Layers[l].MLP.IntermediateSize {
			t.Fatalf("layer %d: FFN hooks got %d and %d elements", l, len(r.ffnX[l]), len(r.ffnH[l]))
		}
	}
	// The embedding row of token 1 is layer 0's input row 0.
	ck := loadCheckpoint(t, shared.Path(t, "stories260K-hf"))
	emb, _ := ck.Tensor("model.embed_tokens.weight")
	e, _ := emb.Float32()
	for i := 0; i < H; i++ {
		if r.in[0][i] != e[H+i] {
			t.Fatalf("layer 0 input[0][%d] = %g, want embedding %g", i, r.in[0][i], e[H+i])
		}
	}
	// Removing the observer stops the calls.
	m.SetObserver(nil)
	r.calls = 0
	c.Truncate(0)
	if err := m.Forward(t.Context(), toks, c, logits, false); err != nil {
		t.Fatal(err)
	}
	if r.calls != 0 {
		t.Fatalf("observer called %d times after removal", r.calls)
	}
}

// readOnlyCache hides F32Cache's zero-copy ability so attention goes
// through KVCache.Read, the path quantized caches use.
type readOnlyCache struct{ KVCache }

// TestGenericCachePath: a cache without F32KV gives the same logits.
func TestGenericCachePath(t *testing.T) {
	for _, name := range []string{"stories260K-hf", "stories260K-moe-hf"} {
		m, d := loadDir(t, shared.Path(t, name), 2)
		toks := []int{1, 403, 407, 261, 378, 432, 383, 286}
		V := d.VocabSize
		want := forwardSteps(t, m, toks, 3)
		c := readOnlyCache{m.NewCache(len(toks))}
		if _, ok := KVCache(c).(F32KV); ok {
			t.Fatal("wrapper still exposes F32KV")
		}
		got := make([]float32, len(toks)*V)
		for i := 0; i < len(toks); i += 3 {
			j := min(i+3, len(toks))
			if err := m.Forward(t.Context(), toks[i:j], c, got[i*V:j*V], true); err != nil {
				t.Fatal(err)
			}
		}
		var diff float64
		for i := range got {
			diff = math.Max(diff, math.Abs(float64(got[i]-want[i])))
		}
		if diff > 1e-5 {
			t.Errorf("%s: generic cache path differs by %.3g", name, diff)
		}
		if b := c.Bytes(); b != int64(len(toks)*8*d.Layers[0].KVDim()*len(d.Layers)) {
			t.Errorf("%s: cache bytes %d", name, b)
		}
	}
}
