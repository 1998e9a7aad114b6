package width

import (
	"fmt"
	"math"
)

// AttentionUnits returns the number of attention units to remove at global
// sparsity s (2SSP's balance rule, arXiv 2501.17771, used by Putri,
// docs/METHODS.md §6):
//
//	n_attn = round(L · s^((pMLP/pAttn)/1.5))
//
// L is the number of decoder layers; s ∈ [0, 1] the fraction of block
// parameters to remove; pMLP and pAttn are the parameter counts of one
// layer's MLP and attention (only their ratio matters, so any common unit
// works; lmpack passes parameters, i.e. weight elements). One unit is one
// layer's worth of attention parameters (pAttn); Putri spends it as GQA head
// groups. Rounding is half away from zero (math.Round). The result lies in
// [0, L].
// Errors: ErrBudget for L < 1, s outside [0, 1] or NaN, or non-positive /
// non-finite pMLP, pAttn.
func AttentionUnits(L int, s float64, pMLP, pAttn float64) (int, error) {
	if err := checkBudget(L, s); err != nil {
		return 0, err
	}
	if !(pMLP > 0) || !(pAttn > 0) || math.IsInf(pMLP, 0) || math.IsInf(pAttn, 0) {
		return 0, fmt.Errorf("%w: parameter counts pMLP=%v, pAttn=%v, want finite and positive", ErrBudget, pMLP, pAttn)
	}
	return int(math.Round(float64(L) * math.Pow(s, (pMLP/pAttn)/1.5))), nil
}

// FFNKeep returns how many of the F intermediate nodes every FFN keeps so that
// the FFNs remove the rest of the parameter budget evenly (docs/METHODS.md §6):
//
//	total  = s · L · (pAttn + 3·D·F)            parameters to remove
//	perFFN = (total − nAttn · pAttn) / L        parameters each FFN removes
//	keep   = F − round(perFFN / (3·D))          clamped to [1, F]
//
// Units are parameters (weight elements). A gated FFN node owns 3·D of them:
// one row of gate_proj [F, D], one row of up_proj [F, D] and one column of
// down_proj [D, F] (no biases), so pMLP = 3·D·F. pAttn is one layer's
// attention parameter count (q, k, v, o projections) and nAttn the attention
// units removed (see [AttentionUnits]). When attention already covers the
// budget the FFNs keep everything (F).
// Errors: ErrBudget for L < 1, s outside [0, 1], F or D < 1, nAttn outside
// [0, L], pAttn negative or non-finite.
func FFNKeep(L, F, D int, s float64, nAttn int, pAttn float64) (int, error) {
	if err := checkBudget(L, s); err != nil {
		return 0, err
	}
	if F < 1 || D < 1 {
		return 0, fmt.Errorf("%w: FFN dims F=%d, D=%d, want positive", ErrBudget, F, D)
	}
	if nAttn < 0 || nAttn > L {
		return 0, fmt.Errorf("%w: %d attention units removed, want 0..L = 0..%d", ErrBudget, nAttn, L)
	}
	if !(pAttn >= 0) || math.IsInf(pAttn, 0) {
		return 0, fmt.Errorf("%w: attention parameter count %v, want finite and ≥ 0", ErrBudget, pAttn)
	}
	node := 3 * float64(D)
	total := s * float64(L) * (pAttn + node*float64(F))
	perFFN := (total - float64(nAttn)*pAttn) / float64(L)
	remove := int(math.Round(perFFN / node))
	keep := F - max(remove, 0)
	return min(max(keep, 1), F), nil
}

func checkBudget(L int, s float64) error {
	if L < 1 {
		return fmt.Errorf("%w: %d layers, want ≥ 1", ErrBudget, L)
	}
	if !(s >= 0 && s <= 1) {
		return fmt.Errorf("%w: sparsity %v, want in [0, 1]", ErrBudget, s)
	}
	return nil
}
