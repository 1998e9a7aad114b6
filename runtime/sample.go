package runtime

import (
	"math"
	"math/rand/v2"
	"sort"
)

// Sampler picks the next token from logits: softmax of logits/Temperature,
// then top-k, then top-p (nucleus) over the top-k tokens' renormalized
// probabilities, then one draw of the seeded generator (the order vLLM's
// and Hugging Face's samplers apply them in).
type Sampler struct {
	// Temperature divides the logits; 0 means greedy (argmax, ties to the
	// lowest id), whatever TopK and TopP say.
	Temperature float64
	// TopP keeps the smallest set of most-likely tokens whose probability
	// sums to at least TopP (nucleus sampling); 0 or >= 1 keeps all.
	TopP float64
	// TopK keeps the TopK most likely tokens (ties to the lowest id)
	// before TopP applies; 0 (or >= vocab) keeps all. TopK 1 is greedy.
	TopK int
	rng  *rand.Rand
	idx  []int
	prob []float64
}

// NewSampler returns a sampler seeded with seed (PCG), so the same seed,
// logits and settings give the same tokens.
func NewSampler(temperature, topP float64, seed uint64) *Sampler {
	return &Sampler{Temperature: temperature, TopP: topP, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// Argmax returns the index of the largest value (the lowest index on ties).
func Argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// Sample returns a token id for logits: [vocab] float32.
func (s *Sampler) Sample(logits []float32) int {
	if s.Temperature <= 0 {
		return Argmax(logits)
	}
	n := len(logits)
	if cap(s.prob) < n {
		s.prob = make([]float64, n)
		s.idx = make([]int, n)
	}
	p, idx := s.prob[:n], s.idx[:n]
	mx := float64(logits[Argmax(logits)])
	var sum float64
	for i, l := range logits {
		p[i] = math.Exp((float64(l) - mx) / s.Temperature)
		sum += p[i]
		idx[i] = i
	}
	keep := n
	topK := s.TopK > 0 && s.TopK < n
	topP := s.TopP > 0 && s.TopP < 1
	if topK || topP {
		sort.Slice(idx, func(a, b int) bool {
			if p[idx[a]] != p[idx[b]] {
				return p[idx[a]] > p[idx[b]]
			}
			return idx[a] < idx[b]
		})
		if topK {
			keep = s.TopK
			// Top-p runs over the top-k tokens' renormalized mass.
			sum = 0
			for _, j := range idx[:keep] {
				sum += p[j]
			}
		}
		if topP {
			var c float64
			for i, j := range idx[:keep] {
				c += p[j] / sum
				if c >= s.TopP {
					keep = i + 1
					break
				}
			}
		}
		sum = 0
		for _, j := range idx[:keep] {
			sum += p[j]
		}
	}
	r := s.rng.Float64() * sum
	for _, j := range idx[:keep] {
		r -= p[j]
		if r < 0 {
			return j
		}
	}
	return idx[keep-1]
}
