package cuda

import (
	"strings"
	"testing"

	"github.com/lmpack/lmpack/runtime"
)

// TestPlanBatch (no GPU): the ragged batch's host-side layout and its
// refusals, each naming the sequence, before any device work.
func TestPlanBatch(t *testing.T) {
	desc, _ := syntheticModel(t, 1, 32, 2, 1, 16, 64, 50, 1)
	m := &Model{d: desc}
	other := &Model{d: desc}
	V := desc.VocabSize
	cache := func(owner *Model, B, n, capacity int) *DeviceCache {
		return &DeviceCache{m: owner, method: "fp16", B: B, n: n, cap: capacity}
	}
	a, b, c := cache(m, 1, 3, 16), cache(m, 1, 0, 16), cache(m, 1, 9, 16)
	seqs := []runtime.Seq{
		{Tokens: []int{1}, Cache: a, Logits: make([]float32, V)},
		{Tokens: []int{2, 3, 4, 5}, Cache: b, Logits: make([]float32, 4*V), AllLogits: true},
		{Tokens: []int{6, 7}, Cache: c, Logits: make([]float32, V)},
	}
	plan, R, lrows, err := m.planBatch(seqs)
	if err != nil {
		t.Fatal(err)
	}
	if R != 7 || lrows != 6 {
		t.Fatalf("R %d, logit rows %d; want 7, 6", R, lrows)
	}
	want := []struct{ r0, T, pos, lr0, lrows, first int }{{0, 1, 3, 0, 1, 0}, {1, 4, 0, 1, 4, 0}, {5, 2, 9, 5, 1, 1}}
	for i, w := range want {
		p := plan[i]
		if p.r0 != w.r0 || p.T != w.T || p.pos != w.pos || p.lr0 != w.lr0 || p.lrows != w.lrows || p.first != w.first || p.nTok != w.pos+w.T {
			t.Errorf("sequence %d: plan %+v, want %+v", i, p, w)
		}
	}
	bad := []struct {
		name string
		s    runtime.Seq
		want string
	}{
		{"foreign cache", runtime.Seq{Tokens: []int{1}, Cache: cache(other, 1, 0, 4), Logits: make([]float32, V)}, "sequence 1: the cache is a *cuda.DeviceCache"},
		{"CPU cache", runtime.Seq{Tokens: []int{1}, Cache: runtime.NewF32Cache([]int{16}, []int{16}, 4), Logits: make([]float32, V)}, "sequence 1: the cache is a *runtime.F32Cache"},
		{"batched cache", runtime.Seq{Tokens: []int{1}, Cache: cache(m, 2, 0, 4), Logits: make([]float32, V)}, "sequence 1: the cache holds 2 sequences"},
		{"no tokens", runtime.Seq{Cache: cache(m, 1, 0, 4), Logits: make([]float32, V)}, "sequence 1: no tokens"},
		{"full", runtime.Seq{Tokens: []int{1, 2}, Cache: cache(m, 1, 3, 4), Logits: make([]float32, V)}, "sequence 1: 2 tokens at position 3 exceed the KV cache capacity 4"},
		{"short logits", runtime.Seq{Tokens: []int{1, 2}, Cache: cache(m, 1, 0, 4), Logits: make([]float32, V), AllLogits: true}, "sequence 1: logits has"},
		{"id", runtime.Seq{Tokens: []int{V}, Cache: cache(m, 1, 0, 4), Logits: make([]float32, V)}, "sequence 1: token 50 at index 0 out of range"},
		{"shared", runtime.Seq{Tokens: []int{1}, Cache: a, Logits: make([]float32, V)}, "sequences 0 and 1 share one KV cache"},
	}
	for _, c := range bad {
		_, _, _, err := m.planBatch([]runtime.Seq{seqs[0], c.s})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
	if _, _, _, err := m.planBatch(nil); err == nil || !strings.Contains(err.Error(), "no sequences") {
		t.Errorf("no sequences: error %v", err)
	}
	if a.n != 3 || b.n != 0 || c.n != 9 {
		t.Errorf("planning changed the caches' lengths: %d, %d, %d", a.n, b.n, c.n)
	}
}
