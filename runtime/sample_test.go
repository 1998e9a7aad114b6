package runtime

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// legacySample is Sampler.Sample as it was before TopK (temperature and
// top-p only), kept here to check that TopK 0 changes nothing.
func legacySample(temperature, topP float64, rng *rand.Rand, logits []float32) int {
	if temperature <= 0 {
		return Argmax(logits)
	}
	n := len(logits)
	p, idx := make([]float64, n), make([]int, n)
	mx := float64(logits[Argmax(logits)])
	var sum float64
	for i, l := range logits {
		p[i] = math.Exp((float64(l) - mx) / temperature)
		sum += p[i]
		idx[i] = i
	}
	keep := n
	if topP > 0 && topP < 1 {
		sort.Slice(idx, func(a, b int) bool {
			if p[idx[a]] != p[idx[b]] {
				return p[idx[a]] > p[idx[b]]
			}
			return idx[a] < idx[b]
		})
		var c float64
		for i, j := range idx {
			c += p[j] / sum
			if c >= topP {
				keep = i + 1
				break
			}
		}
		sum = 0
		for _, j := range idx[:keep] {
			sum += p[j]
		}
	}
	r := rng.Float64() * sum
	for _, j := range idx[:keep] {
		r -= p[j]
		if r < 0 {
			return j
		}
	}
	return idx[keep-1]
}

func randLogits(rng *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 2)
	}
	return x
}

// TestSamplerTopKZeroKeepsBehaviour: without TopK the sampler draws the
// same tokens as before TopK existed, for greedy, plain and top-p.
func TestSamplerTopKZeroKeepsBehaviour(t *testing.T) {
	data := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ temp, topP float64 }{{0, 0}, {1, 0}, {0.7, 0.9}, {1.3, 0.5}} {
		s := NewSampler(c.temp, c.topP, 42)
		ref := rand.New(rand.NewPCG(42, 42^0x9e3779b97f4a7c15))
		for i := 0; i < 300; i++ {
			l := randLogits(data, 97)
			if got, want := s.Sample(l), legacySample(c.temp, c.topP, ref, l); got != want {
				t.Fatalf("temp %g top_p %g draw %d: token %d, the sampler before TopK gives %d", c.temp, c.topP, i, got, want)
			}
		}
	}
}

// TestSamplerTopK: only the K most likely tokens are drawn, each about as
// often as its renormalized probability; TopK 1 is greedy at any
// temperature; top-p then cuts inside the top-k set.
func TestSamplerTopK(t *testing.T) {
	// Probabilities at temperature 1: softmax of log(w).
	w := []float64{0.05, 0.30, 0.10, 0.40, 0.15}
	logits := make([]float32, len(w))
	for i, v := range w {
		logits[i] = float32(math.Log(v))
	}
	const draws = 20000
	count := func(s *Sampler) []int {
		c := make([]int, len(w))
		for i := 0; i < draws; i++ {
			c[s.Sample(logits)]++
		}
		return c
	}
	s := NewSampler(1, 0, 7)
	s.TopK = 3 // ids 3, 1, 4: mass 0.85
	c := count(s)
	if c[0] != 0 || c[2] != 0 {
		t.Fatalf("top_k 3 drew ids outside {3, 1, 4}: counts %v", c)
	}
	for _, id := range []int{3, 1, 4} {
		want := w[id] / 0.85
		got := float64(c[id]) / draws
		// 5 standard deviations of a binomial share.
		if tol := 5 * math.Sqrt(want*(1-want)/draws); math.Abs(got-want) > tol {
			t.Errorf("top_k 3: id %d drawn %.4f of the time, want %.4f ± %.4f", id, got, want, tol)
		}
	}
	// top_k 3 then top_p 0.8 over the renormalized {0.47, 0.35, 0.18}:
	// ids 3 and 1 (cumulative 0.82).
	s = NewSampler(1, 0.8, 7)
	s.TopK = 3
	c = count(s)
	if c[0]+c[2]+c[4] != 0 || c[3] == 0 || c[1] == 0 {
		t.Fatalf("top_k 3, top_p 0.8: counts %v, want only ids 3 and 1", c)
	}
	// Without top-k, top_p 0.8 keeps ids 3, 1, 4 (0.40+0.30+0.15 = 0.85).
	s = NewSampler(1, 0.8, 7)
	if c = count(s); c[4] == 0 {
		t.Fatalf("top_p 0.8 alone: counts %v, want id 4 drawn too", c)
	}
	s = NewSampler(5, 0, 7)
	s.TopK = 1
	if c = count(s); c[3] != draws {
		t.Fatalf("top_k 1 at temperature 5: counts %v, want all %d on id 3", c, draws)
	}
}

// TestSamplerSeed: the same seed and settings give the same tokens; another
// seed gives others.
func TestSamplerSeed(t *testing.T) {
	data := rand.New(rand.NewPCG(3, 4))
	ls := make([][]float32, 200)
	for i := range ls {
		ls[i] = randLogits(data, 64)
	}
	run := func(seed uint64) []int {
		s := NewSampler(0.9, 0.95, seed)
		s.TopK = 20
		out := make([]int, len(ls))
		for i, l := range ls {
			out[i] = s.Sample(l)
		}
		return out
	}
	a, b, c := run(11), run(11), run(12)
	same := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("seed 11 twice: draw %d gives %d then %d", i, a[i], b[i])
		}
		if a[i] == c[i] {
			same++
		}
	}
	if same == len(a) {
		t.Fatalf("seeds 11 and 12 drew the same %d tokens", len(a))
	}
}
