package depth

import (
	"fmt"
	"slices"
)

// BlockInfluence returns ShortGPT's Block Influence (Men et al., "ShortGPT:
// Layers in Large Language Models are More Redundant Than You Expect",
// arXiv 2403.03853, eq. 1; docs/METHODS.md §5) from an m×m row-major similarity
// matrix of consecutive hidden states:
//
//	BI_i = 1 − S_{i,i+1} = 1 − mean_t cos(x_i(t), x_{i+1}(t)),  i = 0..m−2
//
// x_i is the input of block i, so x_{i+1} is its output. With the L block
// inputs alone (m = L) the last block has no score; pass m = L+1 with the
// final-norm input as state L to score it too. Returns [m−1] float64.
// Errors: ErrShape, ErrNonFinite, ErrNotSimilarity.
func BlockInfluence(S []float64, m int) ([]float64, error) {
	if err := checkS(S, m); err != nil {
		return nil, fmt.Errorf("depth: block influence: %w", err)
	}
	bi := make([]float64, m-1)
	for i := range bi {
		bi[i] = 1 - S[i*m+i+1]
	}
	return bi, nil
}

// ShortGPT selects the n blocks of an L-block model with the lowest Block
// Influence (see [BlockInfluence]). S is row-major [L*L] (block inputs) or
// [(L+1)*(L+1)] (block inputs plus the final-norm input as state L).
//
// Layers 0 and L−1 are protected, as for LoRP (the reference implementation
// protects layer 0 and never scores the last block). Ties go to the lower
// index. The plan records BlockInfluence ([L−1] or [L]) and Removed ascending.
//
// Errors: ErrTooManyLayers (n < 0 or n >= L−1), ErrShape (S neither L² nor
// (L+1)²), ErrNonFinite, ErrNotSimilarity.
func ShortGPT(S []float64, L, n int) (*Plan, error) {
	if err := checkBudget(n, L); err != nil {
		return nil, fmt.Errorf("depth: shortgpt: %w", err)
	}
	m := L
	if len(S) == (L+1)*(L+1) {
		m = L + 1
	}
	bi, err := BlockInfluence(S, m)
	if err != nil {
		return nil, fmt.Errorf("depth: shortgpt: %w", err)
	}
	cand := make([]int, 0, L)
	for l := 1; l < L-1; l++ {
		cand = append(cand, l)
	}
	slices.SortStableFunc(cand, func(a, b int) int {
		switch {
		case bi[a] < bi[b]:
			return -1
		case bi[a] > bi[b]:
			return 1
		}
		return 0
	})
	removed := slices.Clone(cand[:n])
	slices.Sort(removed)
	return &Plan{Method: MethodShortGPT, Layers: L, Removed: removed, BlockInfluence: bi}, nil
}
