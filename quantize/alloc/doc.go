// Package alloc chooses a bit width per item under a global bit budget: the
// multiple-choice knapsack behind GEMQ's expert-level mixed precision for
// MoE models (arXiv 2605.23078; docs/METHODS.md §4 step 3) and,
// over per-tensor (bits, group size) options, the bits-per-weight
// allocation of dense models (the idea of exllamav2's measurement-driven
// allocation, solved exactly here instead of annealed).
//
// Problem. Items i (an (layer, expert) pair, or a tensor) each have options
// o with an integer cost c[i][o] in bits (codes plus fp16 scales and
// zero-points, see TensorCost; docs/METHODS.md §7: bits per weight count scales)
// and a predicted error e[i][o] ≥ 0. Choose one option per item to minimise
// Σ e subject to Σ c ≤ budget, optionally with GEMQ's per-group rule: in
// every group (layer), at least one item at the group's highest width and
// another at the second-highest.
//
// Solvers. SolveDP is exact (dynamic programming over the budget reduced by
// the cheapest plan and divided by the GCD of the costs; a coarser quantum
// trades exactness for memory, see DPOptions). SolveLagrangian bisects the
// multiplier λ of the budget constraint, repairs greedily and reports the
// dual bound, which without the rule equals the LP relaxation bound; use it
// when the DP table would exceed its cap (ErrTooLarge). Both return a Plan,
// plain data that serialises to JSON and can be asserted without weights.
//
// Not for: computing the errors (calibration and quantizers do that),
// quantizing weights, or reading and writing files. Everything here works on
// slices and small structs.
package alloc
