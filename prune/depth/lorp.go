package depth

import (
	"fmt"
	"math"
	"slices"
)

// RLS returns the Representation Locality Score of an L×L row-major
// similarity matrix (LoRP, arXiv 2605.27786, eq. 5–6; docs/METHODS.md §5):
//
//	RLS = −log2( mean_{i<j} S_ij )
//
// A high RLS means similarity decays quickly with depth distance (localised
// representations). Errors: ErrShape, ErrNonFinite, ErrNotSimilarity, and
// ErrUndefinedRLS when L < 2 or the mean is <= 0.
func RLS(S []float64, L int) (float64, error) {
	if err := checkS(S, L); err != nil {
		return 0, fmt.Errorf("depth: rls: %w", err)
	}
	if L < 2 {
		return 0, fmt.Errorf("%w: %d layer(s) have no pairs", ErrUndefinedRLS, L)
	}
	var sum float64
	for i := 0; i < L; i++ {
		for j := i + 1; j < L; j++ {
			sum += S[i*L+j]
		}
	}
	mean := sum / float64(L*(L-1)/2)
	if !(mean > 0) {
		return 0, fmt.Errorf("%w: mean off-diagonal similarity %g is not positive", ErrUndefinedRLS, mean)
	}
	return -math.Log2(mean), nil
}

// ClustersForRLS maps an RLS value to LoRP's number of clusters K
// (paper §5.1, docs/METHODS.md §5): RLS >= 1.0 → 2; 0.7 <= RLS < 1.0 → 3;
// RLS < 0.7 → 4.
func ClustersForRLS(rls float64) int {
	switch {
	case rls >= 1.0:
		return 2
	case rls >= 0.7:
		return 3
	}
	return 4
}

// LoRPOptions tunes [LoRPWithOptions]. The zero value gives [LoRP].
type LoRPOptions struct {
	// K overrides the RLS-derived number of clusters when > 0.
	K int
	// Spectral tunes the clustering (seed, restarts).
	Spectral SpectralOptions
}

// LoRP selects n of the L decoder blocks to remove with Locality-Aware
// Redundancy Pruning (arXiv 2605.27786; docs/METHODS.md §5), with default options.
// See [LoRPWithOptions].
func LoRP(S []float64, L, n int) (*Plan, error) {
	return LoRPWithOptions(S, L, n, LoRPOptions{})
}

// LoRPWithOptions runs LoRP on S, the row-major [L*L] float64 matrix of mean
// cosine similarities of block inputs (diagonal ignored, taken as 1):
//
//  1. RLS = −log2(mean_{i<j} S_ij) (eq. 5–6); K = ClustersForRLS(RLS) unless
//     opt.K > 0. K is clamped to L.
//  2. Spectral clustering of A = (S+1)/2 into K clusters (eq. 7; see
//     [SpectralClusters]), labels numbered by first depth of appearance.
//  3. Layers 0 and L−1 are protected. Redundancy of layer l in cluster C(l):
//     r(l) = mean_{m∈C(l), m≠l} S_lm (eq. 8). Within each cluster the
//     eligible layers are ranked by r descending (ties: lower index first).
//  4. Stage 1 (coverage): for clusters 0..K−1 in order, remove the cluster's
//     top-ranked eligible layer, until n layers are chosen.
//  5. Stage 2 (residual): while fewer than n are chosen, among clusters with
//     an eligible layer left pick the one whose remaining (not removed)
//     members, protected ones included, have the highest mean pairwise
//     similarity (eq. 10; a cluster with fewer than two remaining members
//     scores −∞; ties: lower cluster), and remove its next-ranked layer; if
//     every candidate cluster scores −∞, take the lowest-numbered one.
//  6. Degenerate clusterings: when a layer steps 4–5 choose sits alone in
//     its cluster (so r(l) is undefined and the choice would rest on
//     cluster order and index alone; with few layers RLS can even give
//     K = L singletons), the whole selection falls back to the
//     single-layer similarity proxy, ShortGPT's Block Influence
//     BI_l = 1 − S_{l,l+1} (arXiv 2403.03853, see [ShortGPT]): the n
//     eligible layers of lowest BI are removed (ties: lower index). The
//     plan then has Fallback = FallbackBlockInfluence, FallbackReason in
//     words, and BlockInfluence [L−1]; RLS, K, Labels and Redundancy still
//     describe the clustering.
//
// Returns a Plan with Method "lorp", RLS, K, Labels [L], Redundancy [L] and
// Removed ascending. n = 0 gives an empty Removed. Deterministic: the same S,
// L, n and options always give the same plan.
//
// Errors: ErrTooManyLayers (n < 0 or n >= L−1), ErrShape, ErrNonFinite,
// ErrNotSimilarity, ErrUndefinedRLS.
func LoRPWithOptions(S []float64, L, n int, opt LoRPOptions) (*Plan, error) {
	if err := checkBudget(n, L); err != nil {
		return nil, fmt.Errorf("depth: lorp: %w", err)
	}
	rls, err := RLS(S, L)
	if err != nil {
		return nil, fmt.Errorf("depth: lorp: %w", err)
	}
	K := ClustersForRLS(rls)
	if opt.K > 0 {
		K = opt.K
	}
	K = min(K, L)

	A := make([]float64, L*L)
	for i := 0; i < L; i++ {
		for j := 0; j < L; j++ {
			A[i*L+j] = (S[i*L+j] + 1) / 2
		}
		A[i*L+i] = 1
	}
	labels, err := SpectralClusters(A, L, K, opt.Spectral)
	if err != nil {
		return nil, fmt.Errorf("depth: lorp: %w", err)
	}
	members := make([][]int, K)
	for l, c := range labels {
		members[c] = append(members[c], l)
	}

	red := make([]float64, L)
	for l := 0; l < L; l++ {
		var s float64
		cnt := 0
		for _, m := range members[labels[l]] {
			if m != l {
				s += S[l*L+m]
				cnt++
			}
		}
		if cnt == 0 {
			red[l] = -1
		} else {
			red[l] = s / float64(cnt)
		}
	}

	cands := make([][]int, K)
	for c := range members {
		for _, l := range members[c] {
			if l != 0 && l != L-1 {
				cands[c] = append(cands[c], l)
			}
		}
		slices.SortStableFunc(cands[c], func(a, b int) int {
			switch {
			case red[a] > red[b]:
				return -1
			case red[a] < red[b]:
				return 1
			}
			return 0
		})
	}
	next := make([]int, K)
	removed := make([]int, 0, n)
	gone := make([]bool, L)
	take := func(c int) {
		l := cands[c][next[c]]
		next[c]++
		removed = append(removed, l)
		gone[l] = true
	}
	// Stage 1: one layer per cluster, in cluster order.
	for c := 0; c < K && len(removed) < n; c++ {
		if next[c] < len(cands[c]) {
			take(c)
		}
	}
	// Stage 2: residual redundancy allocation.
	for len(removed) < n {
		best, bestMean := -1, math.Inf(-1)
		first := -1
		for c := 0; c < K; c++ {
			if next[c] >= len(cands[c]) {
				continue
			}
			if first < 0 {
				first = c
			}
			if mu := residualMean(S, L, members[c], gone); mu > bestMean {
				best, bestMean = c, mu
			}
		}
		if best < 0 {
			best = first
		}
		if best < 0 {
			// Unreachable: n <= L−2 eligible layers exist.
			return nil, fmt.Errorf("depth: lorp: ran out of eligible layers after %d of %d", len(removed), n)
		}
		take(best)
	}
	slices.Sort(removed)
	p := &Plan{
		Method:     MethodLoRP,
		Layers:     L,
		RLS:        rls,
		K:          K,
		Labels:     labels,
		Removed:    removed,
		Redundancy: red,
	}
	var alone []int
	for _, l := range removed {
		if len(members[labels[l]]) == 1 {
			alone = append(alone, l)
		}
	}
	if len(alone) > 0 {
		if err := blockInfluenceFallback(p, S, alone); err != nil {
			return nil, fmt.Errorf("depth: lorp: %w", err)
		}
	}
	return p, nil
}

// FallbackBlockInfluence is Plan.Fallback when a degenerate LoRP clustering
// made the selection fall back to ShortGPT's Block Influence (see
// [LoRPWithOptions], step 6).
const FallbackBlockInfluence = "block_influence"

// blockInfluenceFallback replaces p.Removed (LoRP's selection, whose layers
// alone lie in singleton clusters) by the len(p.Removed) eligible layers of
// lowest BI_l = 1 − S_{l,l+1} computed from the L×L matrix S, and records
// why in p.
func blockInfluenceFallback(p *Plan, S []float64, alone []int) error {
	L, n := p.Layers, len(p.Removed)
	sg, err := ShortGPT(S, L, n)
	if err != nil {
		return err
	}
	why := fmt.Sprintf("layer(s) %v would be removed alone in their cluster", alone)
	if p.K == L {
		why = fmt.Sprintf("RLS %.4f gives K = %d clusters for %d layers, every layer alone", p.RLS, p.K, L)
	}
	p.Fallback = FallbackBlockInfluence
	p.FallbackReason = fmt.Sprintf("degenerate LoRP clustering (%s; redundancy is undefined there): removed the %d layer(s) of lowest block influence BI_l = 1 − cos(x_l, x_{l+1}) instead (ShortGPT); LoRP alone would have removed %v",
		why, n, p.Removed)
	p.Removed = sg.Removed
	p.BlockInfluence = sg.BlockInfluence
	return nil
}

// residualMean is the mean of S over pairs of cluster members not yet
// removed; −∞ when fewer than two remain.
func residualMean(S []float64, L int, members []int, gone []bool) float64 {
	var s float64
	cnt := 0
	for a, i := range members {
		if gone[i] {
			continue
		}
		for _, j := range members[a+1:] {
			if !gone[j] {
				s += S[i*L+j]
				cnt++
			}
		}
	}
	if cnt == 0 {
		return math.Inf(-1)
	}
	return s / float64(cnt)
}
