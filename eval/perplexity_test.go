package eval

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/runtime"
)

// bigramModel is a fake runtime.Model whose logits at a position depend
// only on the token there: logit a for (token+1) mod V, 0 elsewhere. So
// P(next = token+1) = e^a / (e^a + V − 1), known in closed form.
type bigramModel struct {
	d     *arch.Description
	a     float32
	calls int
}

func (m *bigramModel) Description() *arch.Description { return m.d }
func (m *bigramModel) NewCache(n int) runtime.KVCache {
	return runtime.NewF32Cache([]int{2}, []int{2}, n)
}
func (m *bigramModel) SetObserver(any) {}
func (m *bigramModel) Close() error    { return nil }
func (m *bigramModel) Forward(ctx context.Context, toks []int, c runtime.KVCache, logits []float32, all bool) error {
	m.calls++
	if c.Len() != 0 {
		return errors.New("window not run from position 0")
	}
	V := m.d.VocabSize
	for i, t := range toks {
		row := logits[i*V : (i+1)*V]
		clear(row)
		row[(t+1)%V] = m.a
	}
	c.Commit(len(toks))
	return nil
}

func TestPerplexityClosedForm(t *testing.T) {
	const V = 16
	m := &bigramModel{d: &arch.Description{VocabSize: V}, a: 2}
	// ids: 0,1,2,...: every next token is the predicted one, except across
	// the jump at index 13 (13 -> 0).
	var ids []int
	for i := 0; i < 23; i++ {
		ids = append(ids, i%13)
	}
	hit := -math.Log(math.Exp(2) / (math.Exp(2) + V - 1))
	miss := -math.Log(1 / (math.Exp(2) + V - 1))
	// ctx 5: windows [0,5) [5,10) [10,15) [15,20); tail 3 dropped.
	// Window 2 holds 10,11,12,0,1: pairs (12->0) is a miss.
	r, err := Perplexity(context.Background(), m, ids, PerplexityOptions{Ctx: 5})
	if err != nil {
		t.Fatal(err)
	}
	if r.Windows != 4 || r.TokensScored != 16 || m.calls != 4 {
		t.Fatalf("windows %d, scored %d, calls %d", r.Windows, r.TokensScored, m.calls)
	}
	wantNLL := (15*hit + miss) / 16
	if math.Abs(r.NLL-wantNLL) > 1e-12 || math.Abs(r.Perplexity-math.Exp(wantNLL)) > 1e-12 {
		t.Fatalf("NLL %.15g, want %.15g", r.NLL, wantNLL)
	}
	if math.Abs(r.WindowNLL[2]-(3*hit+miss)/4) > 1e-12 || math.Abs(r.WindowNLL[0]-hit) > 1e-12 {
		t.Fatalf("window NLLs %v", r.WindowNLL)
	}
	r, err = Perplexity(context.Background(), m, ids, PerplexityOptions{Ctx: 5, MaxWindows: 2})
	if err != nil || r.Windows != 2 || r.TokensScored != 8 || math.Abs(r.NLL-hit) > 1e-12 {
		t.Fatalf("max windows: %+v %v", r, err)
	}
}

func TestPerplexityErrors(t *testing.T) {
	m := &bigramModel{d: &arch.Description{VocabSize: 4}}
	if _, err := Perplexity(context.Background(), m, []int{1, 2, 3}, PerplexityOptions{Ctx: 4}); !errors.Is(err, ErrTooShort) {
		t.Errorf("short text: %v", err)
	}
	if _, err := Perplexity(context.Background(), m, []int{1, 2, 3}, PerplexityOptions{Ctx: 1}); err == nil {
		t.Error("ctx 1: no error")
	}
}

func TestNLL(t *testing.T) {
	l := []float32{1, 2, 3}
	z := math.Exp(1) + math.Exp(2) + math.Exp(3)
	for i := range l {
		if got, want := NLL(l, i), -math.Log(math.Exp(float64(l[i]))/z); math.Abs(got-want) > 1e-12 {
			t.Errorf("NLL(%d) = %g, want %g", i, got, want)
		}
	}
}

// nanModel returns NaN logits: Perplexity must fail with ErrNonFinite.
type nanModel struct{ bigramModel }

func (m *nanModel) Forward(ctx context.Context, toks []int, c runtime.KVCache, logits []float32, all bool) error {
	for i := range logits {
		logits[i] = float32(math.NaN())
	}
	c.Commit(len(toks))
	return nil
}

func TestPerplexityNonFinite(t *testing.T) {
	m := &nanModel{bigramModel{d: &arch.Description{VocabSize: 4}}}
	_, err := Perplexity(context.Background(), m, []int{1, 2, 3, 0}, PerplexityOptions{Ctx: 4})
	if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), "window 0 position 0") {
		t.Fatalf("want ErrNonFinite at window 0 position 0, got %v", err)
	}
}
