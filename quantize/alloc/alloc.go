package alloc

import (
	"errors"
	"fmt"
	"math"
	"sort"
)

// Sentinel errors. Every error returned by this package wraps one of them.
var (
	// ErrInvalid marks malformed input: no items, an item without options,
	// a negative cost, a negative, NaN or infinite error or bit width, a
	// negative budget, or total costs that overflow int64.
	ErrInvalid = errors.New("alloc: invalid input")
	// ErrInfeasible marks a budget below the cheapest admissible plan (the
	// message names that minimum cost in bits), or a per-group rule that no
	// choice can satisfy.
	ErrInfeasible = errors.New("alloc: infeasible")
	// ErrTooLarge marks a dynamic-programming table above
	// DPOptions.MaxTableBytes; use SolveLagrangian or a coarser
	// DPOptions.Quantum instead.
	ErrTooLarge = errors.New("alloc: DP table too large")
)

// Option is one way to quantize an item.
//
// Bits is the code width in bits per weight (e.g. 2, 3, 4; it may be
// fractional for mixed formats); with the per-group rule, options are ranked
// by Bits. Group is the quantization group size in weights (32/64/128; 0 =
// one group per output channel) and is carried for reports only. Cost is the
// storage of the whole item under this option in bits, codes plus scales and
// zero-points (see TensorCost). Error is the predicted output error of the
// item under this option (any non-negative unit, the same for all items,
// e.g. GEMQ's c[l,e,b] of docs/METHODS.md §4 step 2).
type Option struct {
	Bits  float64 `json:"bits"`
	Group int     `json:"group_size"`
	Cost  int64   `json:"cost_bits"`
	Error float64 `json:"error"`
}

// Item is one unit that receives exactly one Option: an (layer, expert)
// pair of an MoE model, or one tensor of a dense model.
//
// Group is the rule group (for GEMQ, the layer index); it matters only when
// the per-group rule is on, and items with Group < 0 are exempt from it.
type Item struct {
	Name    string   `json:"name"`
	Group   int      `json:"group"`
	Options []Option `json:"options"`
}

// Plan is the result of an allocation, serialisable as JSON.
//
// Choice[i] is the index into items[i].Options; Cost is Σ Cost of the chosen
// options in bits (≤ the budget); Error is Σ Error of the chosen options,
// summed in item order. Method names the solver ("dp", "dp-quantized",
// "lagrangian"). LowerBound is a proven lower bound on the optimal Error:
// equal to Error for the exact DP, the Lagrangian dual bound otherwise.
type Plan struct {
	Choice     []int   `json:"choice"`
	Cost       int64   `json:"cost_bits"`
	Error      float64 `json:"error"`
	Method     string  `json:"method"`
	LowerBound float64 `json:"lower_bound"`
}

// Gap returns Error − LowerBound, the largest amount by which the plan can
// exceed the optimum (0 for the exact DP).
func (p *Plan) Gap() float64 { return p.Error - p.LowerBound }

// BitsPerWeight returns the plan's cost in bits divided by Σ params (the
// number of weights covered by the items), or NaN when Σ params ≤ 0.
func (p *Plan) BitsPerWeight(params []int64) float64 {
	var n int64
	for _, v := range params {
		n += v
	}
	if n <= 0 {
		return math.NaN()
	}
	return float64(p.Cost) / float64(n)
}

// BudgetForBPW returns the budget in bits for a target of bpw bits per
// weight over tensors of params[i] weights: ⌊bpw · Σ params⌋. The target
// counts scales and zero-points (docs/METHODS.md §7), as TensorCost does. It returns
// -1 (which the solvers reject with ErrInvalid) when bpw is NaN, infinite or
// negative, a params entry is negative, or the result overflows int64.
func BudgetForBPW(params []int64, bpw float64) int64 {
	if math.IsNaN(bpw) || math.IsInf(bpw, 0) || bpw < 0 {
		return -1
	}
	var n int64
	for _, v := range params {
		if v < 0 || n > math.MaxInt64-v {
			return -1
		}
		n += v
	}
	b := math.Floor(bpw * float64(n))
	if b >= math.MaxInt64 {
		return -1
	}
	return int64(b)
}

// TensorCost returns the storage in bits of a [rows, cols] weight quantized
// to bits-bit codes with an fp16 scale and an fp16 zero-point per group of
// group consecutive weights of a row (group ≤ 0 or ≥ cols: one group per
// row): rows·cols·bits + rows·⌈cols/group⌉·32. At group 128 the overhead is
// 0.25 bits per weight. It returns -1 for negative sizes or bits, or on
// int64 overflow.
func TensorCost(rows, cols int64, bits, group int) int64 {
	if rows < 0 || cols < 0 || bits < 0 {
		return -1
	}
	if rows == 0 || cols == 0 {
		return 0
	}
	g := int64(group)
	if g <= 0 || g > cols {
		g = cols
	}
	groups := (cols + g - 1) / g
	codes, ok1 := mul64(rows, cols)
	codes, ok2 := mul64(codes, int64(bits))
	scales, ok3 := mul64(rows, groups)
	scales, ok4 := mul64(scales, 32)
	if !ok1 || !ok2 || !ok3 || !ok4 || codes > math.MaxInt64-scales {
		return -1
	}
	return codes + scales
}

// mul64 returns a·b for a, b ≥ 0 and whether it fits in int64.
func mul64(a, b int64) (int64, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	if a > math.MaxInt64/b {
		return 0, false
	}
	return a * b, true
}

// Flags of an option under the per-group rule.
const (
	flagTop    = 1 // option has the group's highest Bits
	flagSecond = 2 // option has the group's second-highest Bits
	flagBoth   = flagTop | flagSecond
)

// problem is the validated input shared by both solvers.
type problem struct {
	items   []Item
	budget  int64
	rule    bool
	minCost []int64 // per item, bits
	sumMin  int64   // Σ minCost, bits
	// Rule only: flags[i][o] ∈ {0, flagTop, flagSecond}; groups lists
	// the item indices of each rule group in increasing group id;
	// groupIDs the ids; exempt the items with Group < 0.
	flags    [][]uint8
	groups   [][]int
	groupIDs []int
	exempt   []int
	groupOf  []int // rule group index per item, -1 when exempt or no rule
}

func itemName(items []Item, i int) string {
	return fmt.Sprintf("item %d %q", i, items[i].Name)
}

// prepare validates items and budget and builds the rule bookkeeping.
func prepare(items []Item, budget int64, rule bool) (*problem, error) {
	if len(items) == 0 {
		return nil, fmt.Errorf("%w: no items", ErrInvalid)
	}
	if budget < 0 {
		return nil, fmt.Errorf("%w: budget %d bits is negative", ErrInvalid, budget)
	}
	p := &problem{items: items, budget: budget, rule: rule, minCost: make([]int64, len(items)), groupOf: make([]int, len(items))}
	for i := range p.groupOf {
		p.groupOf[i] = -1
	}
	var sumMax int64
	for i, it := range items {
		if len(it.Options) == 0 {
			return nil, fmt.Errorf("%w: %s: no options", ErrInvalid, itemName(items, i))
		}
		mn, mx := int64(math.MaxInt64), int64(0)
		for o, op := range it.Options {
			switch {
			case op.Cost < 0:
				return nil, fmt.Errorf("%w: %s: option %d: cost %d bits is negative", ErrInvalid, itemName(items, i), o, op.Cost)
			case math.IsNaN(op.Error) || math.IsInf(op.Error, 0) || op.Error < 0:
				return nil, fmt.Errorf("%w: %s: option %d: error %v, want finite and ≥ 0", ErrInvalid, itemName(items, i), o, op.Error)
			case math.IsNaN(op.Bits) || math.IsInf(op.Bits, 0) || op.Bits < 0:
				return nil, fmt.Errorf("%w: %s: option %d: bits %v, want finite and ≥ 0", ErrInvalid, itemName(items, i), o, op.Bits)
			}
			mn = min(mn, op.Cost)
			mx = max(mx, op.Cost)
		}
		p.minCost[i] = mn
		if p.sumMin > math.MaxInt64-mn || sumMax > math.MaxInt64-mx {
			return nil, fmt.Errorf("%w: total cost overflows int64 at %s", ErrInvalid, itemName(items, i))
		}
		p.sumMin += mn
		sumMax += mx
	}
	if rule {
		byGroup := map[int][]int{}
		for i, it := range items {
			if it.Group < 0 {
				p.exempt = append(p.exempt, i)
				continue
			}
			byGroup[it.Group] = append(byGroup[it.Group], i)
		}
		for g := range byGroup {
			p.groupIDs = append(p.groupIDs, g)
		}
		sort.Ints(p.groupIDs)
		p.flags = make([][]uint8, len(items))
		for _, g := range p.groupIDs {
			idx := byGroup[g]
			for _, i := range idx {
				p.groupOf[i] = len(p.groups)
			}
			p.groups = append(p.groups, idx)
			top, second := math.Inf(-1), math.Inf(-1)
			for _, i := range idx {
				for _, op := range items[i].Options {
					top = max(top, op.Bits)
				}
			}
			for _, i := range idx {
				for _, op := range items[i].Options {
					if op.Bits < top {
						second = max(second, op.Bits)
					}
				}
			}
			if math.IsInf(second, -1) {
				return nil, fmt.Errorf("%w: rule group %d: every option has %v bits, the rule needs two distinct widths", ErrInfeasible, g, top)
			}
			for _, i := range idx {
				f := make([]uint8, len(items[i].Options))
				for o, op := range items[i].Options {
					switch op.Bits {
					case top:
						f[o] = flagTop
					case second:
						f[o] = flagSecond
					}
				}
				p.flags[i] = f
			}
		}
	}
	// The cheapest admissible plan decides feasibility.
	minPlan, err := p.pick(func(i, o int) (float64, float64) {
		op := items[i].Options[o]
		return float64(op.Cost), op.Error
	})
	if err != nil {
		return nil, err
	}
	var minTotal int64
	for i, o := range minPlan {
		minTotal += items[i].Options[o].Cost
	}
	if minTotal > budget {
		return nil, fmt.Errorf("%w: budget %d bits is below the minimum cost %d bits", ErrInfeasible, budget, minTotal)
	}
	return p, nil
}

// pick chooses for every item the option minimising key (primary, then
// secondary, then lowest index), subject to the per-group rule when it is
// on; the group subproblem is solved exactly (the best pair of distinct
// items forced to the top and second widths). It fails only when a rule
// group cannot be satisfied.
func (p *problem) pick(key func(i, o int) (float64, float64)) ([]int, error) {
	items := p.items
	choice := make([]int, len(items))
	// bestMasked returns the best option of item i among those whose flag
	// equals want (want < 0: any option), or -1.
	bestMasked := func(i int, want int) (int, float64) {
		bo, bp, bs := -1, math.Inf(1), math.Inf(1)
		for o := range items[i].Options {
			if want >= 0 && int(p.flags[i][o]) != want {
				continue
			}
			pk, sk := key(i, o)
			if bo < 0 || pk < bp || (pk == bp && sk < bs) {
				bo, bp, bs = o, pk, sk
			}
		}
		return bo, bp
	}
	for i := range items {
		choice[i], _ = bestMasked(i, -1)
	}
	if !p.rule {
		return choice, nil
	}
	for gi, idx := range p.groups {
		// Two smallest penalties for forcing the top and second widths.
		type cand struct {
			d float64
			i int
			o int
		}
		inf := cand{math.Inf(1), -1, -1}
		t1, t2, s1, s2 := inf, inf, inf, inf
		for _, i := range idx {
			_, base := bestMasked(i, -1)
			if o, v := bestMasked(i, flagTop); o >= 0 {
				c := cand{v - base, i, o}
				if p.flags[i][choice[i]] == flagTop {
					c = cand{0, i, choice[i]}
				}
				if c.d < t1.d {
					t1, t2 = c, t1
				} else if c.d < t2.d {
					t2 = c
				}
			}
			if o, v := bestMasked(i, flagSecond); o >= 0 {
				c := cand{v - base, i, o}
				if p.flags[i][choice[i]] == flagSecond {
					c = cand{0, i, choice[i]}
				}
				if c.d < s1.d {
					s1, s2 = c, s1
				} else if c.d < s2.d {
					s2 = c
				}
			}
		}
		a, b := t1, s1
		if t1.i == s1.i {
			a, b = t1, s2
			if t2.d+s1.d < t1.d+s2.d {
				a, b = t2, s1
			}
		}
		if a.i < 0 || b.i < 0 || a.i == b.i {
			return nil, fmt.Errorf("%w: rule group %d: needs one item at the top width and another at the second width", ErrInfeasible, p.groupIDs[gi])
		}
		choice[a.i] = a.o
		choice[b.i] = b.o
	}
	return choice, nil
}

// finish fills Cost and Error of a plan from its choices, in item order.
func (p *problem) finish(choice []int, method string) *Plan {
	pl := &Plan{Choice: choice, Method: method}
	for i, o := range choice {
		op := p.items[i].Options[o]
		pl.Cost += op.Cost
		pl.Error += op.Error
	}
	return pl
}

// RuleSatisfied reports whether choice (one option index per item) meets
// the per-group rule: in every group of items with Group ≥ 0, at least one
// item has an option with the group's highest Bits and another has the
// second-highest Bits (widths ranked over all options of the group's
// items). It returns false for a malformed choice.
func RuleSatisfied(items []Item, choice []int) bool {
	if len(choice) != len(items) {
		return false
	}
	type tw struct{ top, second float64 }
	w := map[int]*tw{}
	for _, it := range items {
		if it.Group < 0 {
			continue
		}
		g := w[it.Group]
		if g == nil {
			g = &tw{math.Inf(-1), math.Inf(-1)}
			w[it.Group] = g
		}
		for _, op := range it.Options {
			g.top = max(g.top, op.Bits)
		}
	}
	for _, it := range items {
		if it.Group < 0 {
			continue
		}
		g := w[it.Group]
		for _, op := range it.Options {
			if op.Bits < g.top {
				g.second = max(g.second, op.Bits)
			}
		}
	}
	has := map[int]uint8{}
	for i, it := range items {
		if choice[i] < 0 || choice[i] >= len(it.Options) {
			return false
		}
		if it.Group < 0 {
			continue
		}
		b := it.Options[choice[i]].Bits
		switch b {
		case w[it.Group].top:
			has[it.Group] |= flagTop
		case w[it.Group].second:
			has[it.Group] |= flagSecond
		}
	}
	for g := range w {
		if has[g] != flagBoth {
			return false
		}
	}
	return true
}
