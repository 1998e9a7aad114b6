package alloc

import (
	"container/heap"
	"fmt"
	"math"
)

// LagrangianOptions configures SolveLagrangian.
type LagrangianOptions struct {
	// GroupRule turns on the per-group rule, as DPOptions.GroupRule. The
	// per-λ subproblem then solves each group exactly (best pair of
	// distinct items forced to the top and second widths) and the greedy
	// fill never breaks the rule.
	GroupRule bool
	// MaxIter caps the bisection steps on λ; 0 means 200 (enough to reach
	// adjacent float64 values).
	MaxIter int
}

// SolveLagrangian returns a feasible plan for the same problem as SolveDP
// in O(items × options × iterations) time and O(items × options) memory,
// for instances too large for the DP table (GEMQ, arXiv 2605.23078,
// docs/METHODS.md §4 step 3, "Lagrangian relaxation with bisection on λ").
//
// For λ ≥ 0 every item independently takes the option minimising
// Error + λ·Cost (λ in error per bit); λ is bisected (geometric bracket,
// then halving) to the smallest value whose plan fits the budget. The
// remaining budget is then spent greedily on the upgrades with the largest
// error reduction per bit. LowerBound is the Lagrangian dual bound
// max_λ Σ_i min_o (e + λc) − λ·budget, evaluated at both ends of the final
// bracket and at the crossing of their supporting lines; without the rule
// it equals the LP relaxation optimum of the knapsack. Plan.Gap() bounds
// the distance to the optimum.
//
// Errors: ErrInvalid and ErrInfeasible as SolveDP.
func SolveLagrangian(items []Item, budget int64, opt LagrangianOptions) (*Plan, error) {
	if opt.MaxIter < 0 {
		return nil, fmt.Errorf("%w: MaxIter %d is negative", ErrInvalid, opt.MaxIter)
	}
	p, err := prepare(items, budget, opt.GroupRule)
	if err != nil {
		return nil, err
	}
	r, err := p.bisect(opt.MaxIter)
	if err != nil {
		return nil, err
	}
	choice := p.fill(r.choice)
	pl := p.finish(choice, "lagrangian")
	pl.LowerBound = min(r.bound, pl.Error)
	return pl, nil
}

// lagrangianBound returns the Lagrangian dual bound of a validated problem.
func lagrangianBound(p *problem, maxIter int) (float64, error) {
	r, err := p.bisect(maxIter)
	if err != nil {
		return 0, err
	}
	return r.bound, nil
}

// lagEval is the per-item minimiser of Error + λ·Cost at one λ.
type lagEval struct {
	lam    float64
	choice []int
	sumErr float64 // Σ Error of choice
	slack  int64   // Σ Cost of choice − budget, bits
}

// dual returns L(λ) = Σ_i min_o (e + λc) − λ·budget.
func (e lagEval) dual() float64 { return e.sumErr + e.lam*float64(e.slack) }

func (p *problem) eval(lam float64) (lagEval, error) {
	ch, err := p.pick(func(i, o int) (float64, float64) {
		op := p.items[i].Options[o]
		return op.Error + lam*float64(op.Cost), float64(op.Cost)
	})
	if err != nil {
		return lagEval{}, err
	}
	r := lagEval{lam: lam, choice: ch, slack: -p.budget}
	for i, o := range ch {
		op := p.items[i].Options[o]
		r.sumErr += op.Error
		r.slack += op.Cost
	}
	return r, nil
}

type bisectResult struct {
	choice []int   // the fitting plan at the upper end of the bracket
	bound  float64 // best dual value found
}

func (p *problem) bisect(maxIter int) (bisectResult, error) {
	if maxIter == 0 {
		maxIter = 200
	}
	lo, err := p.eval(0)
	if err != nil {
		return bisectResult{}, err
	}
	if lo.slack <= 0 {
		// The least-error plan fits: it is optimal.
		return bisectResult{lo.choice, lo.dual()}, nil
	}
	// Geometric bracket: grow from 1 until a plan fits, or shrink while
	// it still fits.
	hi, err := p.eval(1)
	if err != nil {
		return bisectResult{}, err
	}
	if hi.slack > 0 {
		for hi.slack > 0 {
			lo = hi
			if math.IsInf(hi.lam*2, 1) {
				return bisectResult{}, fmt.Errorf("%w: no multiplier makes the plan fit the budget", ErrInfeasible)
			}
			if hi, err = p.eval(hi.lam * 2); err != nil {
				return bisectResult{}, err
			}
		}
	} else {
		for {
			m, err := p.eval(hi.lam / 2)
			if err != nil {
				return bisectResult{}, err
			}
			if m.slack > 0 {
				lo = m
				break
			}
			hi = m
			if m.lam == 0 {
				break
			}
		}
	}
	for it := 0; it < maxIter; it++ {
		mid := lo.lam + (hi.lam-lo.lam)/2
		if mid <= lo.lam || mid >= hi.lam {
			break
		}
		m, err := p.eval(mid)
		if err != nil {
			return bisectResult{}, err
		}
		if m.slack <= 0 {
			hi = m
		} else {
			lo = m
		}
	}
	bound := max(lo.dual(), hi.dual())
	// The dual is concave and piecewise linear; the supporting lines at lo
	// (slope lo.slack > 0) and hi (slope hi.slack ≤ 0) cross at its maximum
	// when one breakpoint is left in the bracket.
	sl, sh := float64(lo.slack), float64(hi.slack)
	if sl > sh {
		x := (hi.dual() - lo.dual() + sl*lo.lam - sh*hi.lam) / (sl - sh)
		if x > lo.lam && x < hi.lam {
			m, err := p.eval(x)
			if err != nil {
				return bisectResult{}, err
			}
			bound = max(bound, m.dual())
		}
	}
	return bisectResult{hi.choice, bound}, nil
}

// upgrade is a candidate move of one item to a lower-error option.
type upgrade struct {
	ratio float64 // error reduction per bit; +Inf when the cost does not rise
	gain  float64 // error reduction
	i, o  int
	ver   int
}

type upgradeHeap []upgrade

func (h upgradeHeap) Len() int { return len(h) }
func (h upgradeHeap) Less(a, b int) bool {
	if h[a].ratio != h[b].ratio {
		return h[a].ratio > h[b].ratio
	}
	if h[a].gain != h[b].gain {
		return h[a].gain > h[b].gain
	}
	return h[a].i < h[b].i
}
func (h upgradeHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *upgradeHeap) Push(x any)   { *h = append(*h, x.(upgrade)) }
func (h *upgradeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// fill spends the budget left by choice on lower-error options, best error
// reduction per bit first, keeping the per-group rule. choice fits the
// budget and is modified in place.
func (p *problem) fill(choice []int) []int {
	left := p.budget
	for i, o := range choice {
		left -= p.items[i].Options[o].Cost
	}
	var count [][3]int // per rule group: items at top (1) and second (2)
	if p.rule {
		count = make([][3]int, len(p.groups))
		for i, o := range choice {
			if g := p.groupOf[i]; g >= 0 {
				count[g][p.flags[i][o]]++
			}
		}
	}
	allowed := func(i, o int) bool {
		g := p.groupOf[i]
		if g < 0 {
			return true
		}
		f, nf := p.flags[i][choice[i]], p.flags[i][o]
		return f == 0 || f == nf || count[g][f] > 1
	}
	ver := make([]int, len(choice))
	best := func(i int) (upgrade, bool) {
		cur := p.items[i].Options[choice[i]]
		u, ok := upgrade{i: i, ver: ver[i]}, false
		for o, op := range p.items[i].Options {
			dc := op.Cost - cur.Cost
			gain := cur.Error - op.Error
			if gain <= 0 || dc > left || !allowed(i, o) {
				continue
			}
			r := math.Inf(1)
			if dc > 0 {
				r = gain / float64(dc)
			}
			if !ok || r > u.ratio || (r == u.ratio && gain > u.gain) {
				u.ratio, u.gain, u.o, ok = r, gain, o, true
			}
		}
		return u, ok
	}
	h := &upgradeHeap{}
	for i := range choice {
		if u, ok := best(i); ok {
			*h = append(*h, u)
		}
	}
	heap.Init(h)
	for h.Len() > 0 {
		u := heap.Pop(h).(upgrade)
		if u.ver != ver[u.i] {
			continue
		}
		cur := p.items[u.i].Options[choice[u.i]]
		op := p.items[u.i].Options[u.o]
		if op.Cost-cur.Cost > left || !allowed(u.i, u.o) {
			if nu, ok := best(u.i); ok {
				heap.Push(h, nu)
			}
			continue
		}
		left -= op.Cost - cur.Cost
		if g := p.groupOf[u.i]; g >= 0 {
			count[g][p.flags[u.i][choice[u.i]]]--
			count[g][p.flags[u.i][u.o]]++
		}
		choice[u.i] = u.o
		ver[u.i]++
		if nu, ok := best(u.i); ok {
			heap.Push(h, nu)
		}
	}
	return choice
}
