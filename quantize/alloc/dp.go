package alloc

import (
	"fmt"
	"math"
)

// DefaultMaxTableBytes is the back-pointer table cap SolveDP uses when
// DPOptions.MaxTableBytes is 0: 1 GiB.
const DefaultMaxTableBytes = 1 << 30

// DPOptions configures SolveDP.
type DPOptions struct {
	// GroupRule turns on GEMQ's per-group rule (docs/METHODS.md §4 step 3): in
	// every group of items with Group ≥ 0, at least one item takes an
	// option with the group's highest Bits and another the second-highest.
	GroupRule bool
	// Quantum is the budget step in bits. 0 (the default) uses the GCD of
	// the reduced costs (cost − the item's cheapest cost), which is exact.
	// A coarser quantum q rounds every reduced cost up to a multiple of q
	// and the remaining budget down, so the plan always fits the true
	// budget but may be suboptimal; it is exact only when q divides that
	// GCD. The returned Method is then "dp-quantized" and LowerBound the
	// Lagrangian dual bound.
	Quantum int64
	// MaxTableBytes caps the back-pointer table (items × (budget/quantum+1)
	// × states, 1 or 2 bytes each; 4 states with GroupRule). 0 means
	// DefaultMaxTableBytes.
	MaxTableBytes int64
}

// SolveDP returns an optimal plan for the multiple-choice knapsack
// min Σ_i Error[i][Choice[i]] s.t. Σ_i Cost[i][Choice[i]] ≤ budget (bits),
// one option per item, optionally under the per-group rule
// (opt.GroupRule), by dynamic programming over the integer budget (GEMQ,
// arXiv 2605.23078, allocation step = docs/METHODS.md §4 step 3; for dense models the
// exllamav2 per-tensor (bits, group) search, solved exactly).
//
// Costs are first reduced by each item's cheapest option and divided by
// their GCD (or opt.Quantum, see DPOptions), so the table spans only the
// budget above the cheapest plan. With the rule, each group is swept with
// four states (has top width, has second width) and must end in the state
// with both. Time O(items × options × W × states), memory O(items × W ×
// states) back-pointers, W = (budget − Σ cheapest)/quantum, capped at the
// budget that buys every item's most expensive option.
//
// Errors: ErrInvalid for malformed input or options; ErrInfeasible when
// the budget is below the cheapest admissible plan (naming its cost in
// bits), the rule cannot be met, or a coarse quantum's rounding leaves no
// feasible plan; ErrTooLarge when the table exceeds opt.MaxTableBytes.
func SolveDP(items []Item, budget int64, opt DPOptions) (*Plan, error) {
	if opt.Quantum < 0 {
		return nil, fmt.Errorf("%w: DP quantum %d bits is negative", ErrInvalid, opt.Quantum)
	}
	if opt.MaxTableBytes < 0 {
		return nil, fmt.Errorf("%w: DP table cap %d bytes is negative", ErrInvalid, opt.MaxTableBytes)
	}
	p, err := prepare(items, budget, opt.GroupRule)
	if err != nil {
		return nil, err
	}
	maxBytes := opt.MaxTableBytes
	if maxBytes == 0 {
		maxBytes = DefaultMaxTableBytes
	}

	// Reduced costs, their GCD and the useful budget span.
	var g, sumMaxRed int64
	maxOpts := 0
	for i, it := range items {
		var mx int64
		for _, op := range it.Options {
			r := op.Cost - p.minCost[i]
			g = gcd(g, r)
			mx = max(mx, r)
		}
		sumMaxRed += mx
		maxOpts = max(maxOpts, len(it.Options))
	}
	span := min(budget-p.sumMin, sumMaxRed)
	q, exact := g, true
	if q == 0 {
		q = 1
	}
	if opt.Quantum > 0 {
		q = opt.Quantum
		exact = g%q == 0
	}
	W := span / q
	cs := make([][]int64, len(items))
	for i, it := range items {
		cs[i] = make([]int64, len(it.Options))
		for o, op := range it.Options {
			r := op.Cost - p.minCost[i]
			c := r / q
			if r%q != 0 {
				c++
			}
			cs[i][o] = c
		}
	}

	S := 1
	if opt.GroupRule {
		S = 4
	}
	bytesPer := 2
	if maxOpts <= 63 {
		bytesPer = 1
	}
	if maxOpts > 16383 {
		return nil, fmt.Errorf("%w: %d options on one item, SolveDP supports at most 16383", ErrInvalid, maxOpts)
	}
	need := float64(len(items)) * float64(W+1) * float64(S) * float64(bytesPer)
	need += 2 * float64(W+1) * float64(S) * 8
	if need > float64(maxBytes) {
		return nil, fmt.Errorf("%w: %d items × %d budget steps of %d bits × %d states need %.0f bytes > cap %d; use SolveLagrangian or a coarser DPOptions.Quantum",
			ErrTooLarge, len(items), W+1, q, S, need, maxBytes)
	}

	// Processing order: without the rule, item order; with it, exempt
	// items first, then each group contiguously.
	order := make([]int, 0, len(items))
	groupEnd := make([]bool, len(items))
	if opt.GroupRule {
		order = append(order, p.exempt...)
		for _, idx := range p.groups {
			order = append(order, idx...)
			groupEnd[len(order)-1] = true
		}
	} else {
		for i := range items {
			order = append(order, i)
		}
	}

	var choice []int
	var ok bool
	if bytesPer == 1 {
		choice, ok = runDP[uint8](p, order, groupEnd, cs, int(W), S)
	} else {
		choice, ok = runDP[uint16](p, order, groupEnd, cs, int(W), S)
	}
	if !ok {
		return nil, fmt.Errorf("%w: no plan fits budget %d bits after rounding costs up to quantum %d bits; use a finer DPOptions.Quantum", ErrInfeasible, budget, q)
	}
	if exact {
		pl := p.finish(choice, "dp")
		pl.LowerBound = pl.Error
		return pl, nil
	}
	pl := p.finish(choice, "dp-quantized")
	lb, err := lagrangianBound(p, 0)
	if err != nil {
		return nil, err
	}
	pl.LowerBound = min(lb, pl.Error)
	return pl, nil
}

// runDP fills the table f_k[s][w] = least error of the first k items (in
// order) with reduced cost ≤ w and rule state s, keeping one back-pointer
// (option<<2 | previous state) per cell, then walks it back from the full
// budget. It reports false when no plan fits.
func runDP[T uint8 | uint16](p *problem, order []int, groupEnd []bool, cs [][]int64, W, S int) ([]int, bool) {
	W1 := W + 1
	n := len(order)
	table := make([]T, n*S*W1)
	prev := make([]float64, S*W1)
	cur := make([]float64, S*W1)
	inf := math.Inf(1)
	for k := W1; k < len(prev); k++ {
		prev[k] = inf
	}
	alive := make([]bool, S)
	alive[0] = true
	for k, i := range order {
		for j := range cur {
			cur[j] = inf
		}
		bp := table[k*S*W1 : (k+1)*S*W1]
		var fl []uint8
		if p.rule {
			fl = p.flags[i] // nil for exempt items
		}
		for s := 0; s < S; s++ {
			if !alive[s] {
				continue
			}
			src := prev[s*W1 : (s+1)*W1]
			for o, op := range p.items[i].Options {
				c := int(cs[i][o])
				if c > W {
					continue
				}
				ns := s
				if fl != nil {
					ns |= int(fl[o])
				}
				dst := cur[ns*W1 : (ns+1)*W1]
				bd := bp[ns*W1 : (ns+1)*W1]
				code := T(o<<2 | s)
				e := op.Error
				for w := c; w < W1; w++ {
					if v := src[w-c] + e; v < dst[w] {
						dst[w] = v
						bd[w] = code
					}
				}
			}
		}
		if groupEnd[k] {
			// Leaving a group: only "has both" survives, as state 0.
			copy(cur[:W1], cur[flagBoth*W1:(flagBoth+1)*W1])
			for j := W1; j < len(cur); j++ {
				cur[j] = inf
			}
		}
		for s := range alive {
			alive[s] = !math.IsInf(cur[s*W1+W], 1)
		}
		prev, cur = cur, prev
	}
	if math.IsInf(prev[W], 1) {
		return nil, false
	}
	choice := make([]int, len(p.items))
	s, w := 0, W
	for k := n - 1; k >= 0; k-- {
		i := order[k]
		if groupEnd[k] {
			s = flagBoth
		}
		code := int(table[k*S*W1+s*W1+w])
		o := code >> 2
		choice[i] = o
		w -= int(cs[i][o])
		s = code & 3
	}
	return choice, true
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
