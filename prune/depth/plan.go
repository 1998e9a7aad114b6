package depth

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Method names stored in [Plan.Method].
const (
	MethodLoRP     = "lorp"
	MethodShortGPT = "shortgpt"
	MethodList     = "list"
)

// Sentinel errors. Callers branch on them with errors.Is; the returned errors
// wrap them with the offending value.
var (
	// ErrTooManyLayers: the removal budget n is negative or n >= L−1 (at least
	// the protected layers 0 and L−1 plus nothing else would remain).
	ErrTooManyLayers = errors.New("depth: too many layers to remove")
	// ErrProtectedLayer: an explicit list names layer 0 or L−1.
	ErrProtectedLayer = errors.New("depth: layer is protected")
	// ErrLayerRange: a layer index is outside [0, L) or listed twice.
	ErrLayerRange = errors.New("depth: bad layer index")
	// ErrShape: a slice length does not match the stated dimensions.
	ErrShape = errors.New("depth: shape mismatch")
	// ErrNonFinite: an input holds NaN or ±Inf.
	ErrNonFinite = errors.New("depth: non-finite value")
	// ErrNotSimilarity: S is not symmetric or has entries outside [−1, 1].
	ErrNotSimilarity = errors.New("depth: not a cosine-similarity matrix")
	// ErrNoTokens: the similarity accumulator has seen no tokens.
	ErrNoTokens = errors.New("depth: no tokens accumulated")
	// ErrUndefinedRLS: mean_{i<j} S_ij <= 0, so RLS = −log2(mean) is undefined.
	ErrUndefinedRLS = errors.New("depth: RLS undefined")
)

// Plan is the serialisable result of a depth-pruning selection: which decoder
// blocks to remove and why. It is pure data (encoding/json round-trips it); a
// later stage applies it to a checkpoint.
//
// All per-layer slices have length L and are indexed by the original layer
// index 0..L−1.
type Plan struct {
	// Method is MethodLoRP, MethodShortGPT or MethodList.
	Method string `json:"method"`
	// Layers is L, the number of decoder blocks before pruning.
	Layers int `json:"layers"`
	// RLS is the Representation Locality Score −log2(mean_{i<j} S_ij)
	// (LoRP eq. 5–6); 0 for other methods.
	RLS float64 `json:"rls,omitempty"`
	// K is the number of LoRP clusters (phases); 0 for other methods.
	K int `json:"k,omitempty"`
	// Labels [L] are LoRP cluster labels 0..K−1, numbered by the depth at
	// which each cluster first appears (layer 0 is in cluster 0).
	Labels []int `json:"labels,omitempty"`
	// Removed are the layers to remove, ascending.
	Removed []int `json:"removed"`
	// Redundancy [L] is LoRP's r(l) = mean_{m∈C(l), m≠l} S_lm (eq. 8). A layer
	// alone in its cluster has no peers and gets −1, the lowest cosine; the
	// value is only ever compared within one cluster, and a selection that
	// would remove such a layer falls back to Block Influence (Fallback).
	Redundancy []float64 `json:"redundancy,omitempty"`
	// Fallback is FallbackBlockInfluence when LoRP's clustering was
	// degenerate and Removed was chosen by Block Influence instead (see
	// LoRPWithOptions, step 6); "" otherwise.
	Fallback string `json:"fallback,omitempty"`
	// FallbackReason says in words why the fallback was taken and what
	// LoRP alone would have removed; "" without a fallback.
	FallbackReason string `json:"fallback_reason,omitempty"`
	// BlockInfluence holds ShortGPT's BI_i = 1 − S_{i,i+1}: length L−1 when
	// S is L×L (the last block has no next input), length L when S is
	// (L+1)×(L+1) with the final-norm input as state L.
	BlockInfluence []float64 `json:"block_influence,omitempty"`
}

// Kept returns the layers that remain after applying p, ascending; the i-th
// entry is the original index of new layer i.
func (p *Plan) Kept() []int {
	kept := make([]int, 0, p.Layers-len(p.Removed))
	for l := 0; l < p.Layers; l++ {
		if !slices.Contains(p.Removed, l) {
			kept = append(kept, l)
		}
	}
	return kept
}

// checkBudget validates a removal budget n for L layers: 0 <= n < L−1.
func checkBudget(n, L int) error {
	if L < 1 {
		return fmt.Errorf("%w: %d layers", ErrShape, L)
	}
	if n < 0 || n >= L-1 {
		return fmt.Errorf("%w: asked to remove %d of %d layers; at most %d (layers 0 and %d are protected)",
			ErrTooManyLayers, n, L, max(L-2, 0), L-1)
	}
	return nil
}

// ListPlan returns the plan removing exactly the given layers of an L-layer
// model. layers may be in any order; the plan lists them ascending.
//
// Errors: ErrLayerRange for an index outside [0, L) or a duplicate,
// ErrProtectedLayer for 0 or L−1, ErrTooManyLayers when len(layers) >= L−1.
func ListPlan(layers []int, L int) (*Plan, error) {
	if err := checkBudget(len(layers), L); err != nil {
		return nil, err
	}
	removed := slices.Clone(layers)
	slices.Sort(removed)
	for i, l := range removed {
		if l < 0 || l >= L {
			return nil, fmt.Errorf("%w: layer %d outside [0, %d)", ErrLayerRange, l, L)
		}
		if i > 0 && removed[i-1] == l {
			return nil, fmt.Errorf("%w: layer %d listed twice", ErrLayerRange, l)
		}
		if l == 0 || l == L-1 {
			return nil, fmt.Errorf("%w: layer %d (layers 0 and %d are kept)", ErrProtectedLayer, l, L-1)
		}
	}
	return &Plan{Method: MethodList, Layers: L, Removed: removed}, nil
}

// checkS validates a row-major m×m similarity matrix: length, finiteness,
// symmetry and range, with a tolerance of 1e-6 for float32-accumulated input.
// The diagonal is not checked (callers treat it as 1).
func checkS(S []float64, m int) error {
	if m < 1 || len(S) != m*m {
		return fmt.Errorf("%w: S has %d entries, want %d×%d", ErrShape, len(S), m, m)
	}
	const tol = 1e-6
	for i := 0; i < m; i++ {
		for j := 0; j < m; j++ {
			v := S[i*m+j]
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("%w: S[%d][%d] = %v", ErrNonFinite, i, j, v)
			}
			if i == j {
				continue
			}
			if v < -1-tol || v > 1+tol {
				return fmt.Errorf("%w: S[%d][%d] = %g outside [-1, 1]", ErrNotSimilarity, i, j, v)
			}
			if d := v - S[j*m+i]; d > tol || d < -tol {
				return fmt.Errorf("%w: S[%d][%d] = %g but S[%d][%d] = %g", ErrNotSimilarity, i, j, v, j, i, S[j*m+i])
			}
		}
	}
	return nil
}
