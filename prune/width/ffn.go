package width

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
)

// DefaultDamping is the relative damping λ/mean(diag H) added to H before it
// is inverted or factored: H + λI with λ = 0.01 · mean(diag H), as GPTQ-style
// second-order pruning methods do. It is needed whenever H = XᵀX is singular
// or ill-conditioned: fewer tokens than channels (n < F), dead channels (a
// node whose activation is always zero gives a zero row and column) or
// linearly dependent channels. Damping biases the refit towards zero: for an
// exactly representable Y = X Wᵀ the refit returns W·H(H+λI)⁻¹, so along an
// eigenvector of H with eigenvalue σ the weights shrink by λ/(σ+λ).
const DefaultDamping = 0.01

// ErrDamping: a damping that is negative, NaN or infinite.
var ErrDamping = errors.New("width: invalid damping")

// Scores returns Putri's FFN node scores (docs/METHODS.md §6; arXiv 2605.18331):
//
//	score_c = Σ_r e_r · W[r,c]² / ([(H + λI)⁻¹]_cc)²,  λ = damp · mean(diag H)
//
// w is down_proj.weight [D, F] float32 row-major, s the statistics gathered at
// that down_proj; the result is [F] float64, larger = more important. A node
// with all-zero weights scores 0. The scale of the scores (tokens², squared
// output units) carries no meaning; only their order does. Cost: one F×F
// Cholesky factorisation and inverse, O(F³) float64 flops.
// Errors: ErrShape, ErrNonFinite (w), ErrDamping, ErrNoData (no tokens or
// zero H), ErrNotPositiveDefinite (damp = 0 with a singular H).
func Scores(s *FFNStats, w []float32, damp float64) ([]float64, error) {
	if err := checkW(s, w); err != nil {
		return nil, err
	}
	all := make([]int, s.f)
	for i := range all {
		all[i] = i
	}
	chol, err := dampedCholesky(s, all, damp)
	if err != nil {
		return nil, err
	}
	var inv mat.SymDense
	if err := chol.InverseTo(&inv); err != nil {
		return nil, fmt.Errorf("%w: inverting damped H [%d, %d]: %v", ErrNotPositiveDefinite, s.f, s.f, err)
	}
	e := s.Energy()
	scores := make([]float64, s.f)
	for r := 0; r < s.d; r++ {
		row := w[r*s.f : (r+1)*s.f]
		for c, v := range row {
			scores[c] += e[r] * float64(v) * float64(v)
		}
	}
	for c := range scores {
		d := inv.At(c, c)
		scores[c] /= d * d
	}
	return scores, nil
}

// SelectFFN scores every node with [Scores] at [DefaultDamping] and keeps the
// keep highest. It returns the kept node indices in ascending order (ties
// broken towards the lower index) and the scores of all F nodes.
// w is down_proj.weight [D, F] float32 row-major.
// Errors: ErrKeep when keep is outside [1, F], and those of [Scores].
func SelectFFN(s *FFNStats, w []float32, keep int) ([]int, []float64, error) {
	if s == nil {
		return nil, nil, fmt.Errorf("%w: FFN stats are nil", ErrShape)
	}
	if keep < 1 || keep > s.f {
		return nil, nil, fmt.Errorf("%w: keep %d FFN nodes, want 1..F = 1..%d", ErrKeep, keep, s.f)
	}
	scores, err := Scores(s, w, DefaultDamping)
	if err != nil {
		return nil, nil, err
	}
	kept, err := TopK(scores, keep)
	if err != nil {
		return nil, nil, err
	}
	return kept, scores, nil
}

// TopK returns the indices of the keep largest scores, sorted ascending;
// among equal scores the lower index wins.
// Errors: ErrKeep when keep is outside [1, len(scores)], ErrNonFinite for a
// NaN score.
func TopK(scores []float64, keep int) ([]int, error) {
	if keep < 1 || keep > len(scores) {
		return nil, fmt.Errorf("%w: keep %d of %d scores", ErrKeep, keep, len(scores))
	}
	for i, v := range scores {
		if math.IsNaN(v) {
			return nil, fmt.Errorf("%w: score of node %d is NaN", ErrNonFinite, i)
		}
	}
	idx := make([]int, len(scores))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case scores[a] > scores[b]:
			return -1
		case scores[a] < scores[b]:
			return 1
		}
		return 0
	})
	kept := idx[:keep:keep]
	slices.Sort(kept)
	return kept, nil
}

// RefitDown returns the least-squares down_proj for the kept nodes
// (docs/METHODS.md §6, Putri's "update" step):
//
//	W' = ((X_pᵀX_p + λI)⁻¹ X_pᵀ Y)ᵀ,  λ = damp · mean(diag X_pᵀX_p)
//
// computed from the accumulated H and XᵀY restricted to the kept rows/columns
// by a gonum Cholesky solve. With damp = 0 it is the exact minimiser of
// ‖X_p W'ᵀ − Y‖²_F; use [DefaultDamping] in production (see its comment for
// the bias). kept: ascending, distinct node indices in [0, F). Returns W'
// [D, len(kept)] float32 row-major, the new down_proj.weight.
// Errors: ErrKeep, ErrDamping, ErrNoData, ErrNotPositiveDefinite, and
// ErrNonFinite when the solution overflows float32.
func RefitDown(s *FFNStats, kept []int, damp float64) ([]float32, error) {
	if s == nil {
		return nil, fmt.Errorf("%w: FFN stats are nil", ErrShape)
	}
	if err := checkKept(kept, s.f); err != nil {
		return nil, err
	}
	chol, err := dampedCholesky(s, kept, damp)
	if err != nil {
		return nil, err
	}
	k := len(kept)
	b := mat.NewDense(k, s.d, nil)
	for i, c := range kept {
		b.SetRow(i, s.xty[c*s.d:(c+1)*s.d])
	}
	var z mat.Dense
	if err := chol.SolveTo(&z, b); err != nil {
		return nil, fmt.Errorf("%w: solving the kept-node normal equations [%d, %d]: %v", ErrNotPositiveDefinite, k, k, err)
	}
	out := make([]float32, s.d*k)
	for i := 0; i < k; i++ {
		for r := 0; r < s.d; r++ {
			v := z.At(i, r)
			if math.IsNaN(v) || math.Abs(v) > math.MaxFloat32 {
				return nil, fmt.Errorf("%w: refit down_proj [%d, %d] is %v", ErrNonFinite, r, i, v)
			}
			out[r*k+i] = float32(v)
		}
	}
	return out, nil
}

// SliceColumns returns the no-refit down_proj: the kept columns of w
// [rows, cols] float32 row-major, giving [rows, len(kept)].
// Errors: ErrShape, ErrKeep.
func SliceColumns(w []float32, rows, cols int, kept []int) ([]float32, error) {
	if rows <= 0 || cols <= 0 || len(w) != rows*cols {
		return nil, fmt.Errorf("%w: weight has %d elements, want rows×cols = %d×%d", ErrShape, len(w), rows, cols)
	}
	if err := checkKept(kept, cols); err != nil {
		return nil, err
	}
	k := len(kept)
	out := make([]float32, rows*k)
	for r := 0; r < rows; r++ {
		src := w[r*cols : (r+1)*cols]
		dst := out[r*k : (r+1)*k]
		for i, c := range kept {
			dst[i] = src[c]
		}
	}
	return out, nil
}

// SliceRows returns the kept rows of w [rows, cols] float32 row-major, giving
// [len(kept), cols]; used for gate_proj and up_proj ([F, D]) after FFN
// selection. Errors: ErrShape, ErrKeep.
func SliceRows(w []float32, rows, cols int, kept []int) ([]float32, error) {
	if rows <= 0 || cols <= 0 || len(w) != rows*cols {
		return nil, fmt.Errorf("%w: weight has %d elements, want rows×cols = %d×%d", ErrShape, len(w), rows, cols)
	}
	if err := checkKept(kept, rows); err != nil {
		return nil, err
	}
	out := make([]float32, 0, len(kept)*cols)
	for _, r := range kept {
		out = append(out, w[r*cols:(r+1)*cols]...)
	}
	return out, nil
}

func checkW(s *FFNStats, w []float32) error {
	if s == nil {
		return fmt.Errorf("%w: FFN stats are nil", ErrShape)
	}
	if len(w) != s.d*s.f {
		return fmt.Errorf("%w: down_proj weight has %d elements, want [D, F] = [%d, %d]", ErrShape, len(w), s.d, s.f)
	}
	if i := firstNonFinite32(w); i >= 0 {
		return fmt.Errorf("%w: down_proj weight [%d, %d] is %v", ErrNonFinite, i/s.f, i%s.f, w[i])
	}
	return nil
}

func checkKept(kept []int, n int) error {
	if len(kept) == 0 {
		return fmt.Errorf("%w: no kept nodes", ErrKeep)
	}
	for i, c := range kept {
		if c < 0 || c >= n {
			return fmt.Errorf("%w: kept node %d out of range [0, %d)", ErrKeep, c, n)
		}
		if i > 0 && c <= kept[i-1] {
			return fmt.Errorf("%w: kept nodes not strictly ascending at position %d (%d after %d)", ErrKeep, i, c, kept[i-1])
		}
	}
	return nil
}

// dampedCholesky factors H_pp + λI for the index set p (ascending).
func dampedCholesky(s *FFNStats, p []int, damp float64) (*mat.Cholesky, error) {
	if math.IsNaN(damp) || math.IsInf(damp, 0) || damp < 0 {
		return nil, fmt.Errorf("%w: damping %v, want finite ≥ 0", ErrDamping, damp)
	}
	if s.n == 0 {
		return nil, fmt.Errorf("%w: FFN stats hold no tokens", ErrNoData)
	}
	k := len(p)
	f := s.f
	a := make([]float64, k*k)
	var tr float64
	for i, ci := range p {
		for j := i; j < k; j++ {
			a[i*k+j] = s.h[ci*f+p[j]] // ci ≤ p[j]: upper triangle of H
		}
		tr += a[i*k+i]
	}
	if tr <= 0 {
		return nil, fmt.Errorf("%w: H of the %d nodes is zero (all down_proj inputs zero)", ErrNoData, k)
	}
	lambda := damp * tr / float64(k)
	for i := 0; i < k; i++ {
		a[i*k+i] += lambda
	}
	var chol mat.Cholesky
	if ok := chol.Factorize(mat.NewSymDense(k, a)); !ok {
		return nil, fmt.Errorf("%w: H [%d, %d] + %g·I (damping %g × mean diag)", ErrNotPositiveDefinite, k, k, lambda, damp)
	}
	return &chol, nil
}
