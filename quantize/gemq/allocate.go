package gemq

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/quantize/alloc"
)

// Solver names an allocation solver.
type Solver string

const (
	// SolverDP is the exact dynamic program over the integer budget
	// (alloc.SolveDP), falling back to SolverLagrangian only when its table
	// would exceed AllocOptions.MaxTableBytes (Allocation.Method says
	// which ran). It is the default.
	SolverDP Solver = "dp"
	// SolverLagrangian bisects the budget multiplier (alloc.SolveLagrangian)
	// and reports its gap to the Lagrangian (without the rule, LP) bound.
	SolverLagrangian Solver = "lagrangian"
)

// AllocOptions configures Allocate.
type AllocOptions struct {
	// Rule requires, in every layer, at least one expert at the highest
	// width and another at the second-highest (docs/METHODS.md §4 step 3).
	Rule bool
	// Solver is SolverDP (default when empty) or SolverLagrangian.
	Solver Solver
	// Overhead counts the fp16 scale and zero-point of every group
	// (alloc.TensorCost at Group) and each row's padding to whole bytes in
	// both the option costs and the budget, so the budget is bits per
	// weight exactly as the quantized checkpoint stores the experts. Without it (the GEMQ
	// convention) an option costs bits·params and the budget is the
	// average code width per expert weight.
	Overhead bool
	// Group is the group size of the overhead (0: one group per output
	// channel); used with Overhead and for BitsPerWeightStored.
	Group int
	// MaxTableBytes caps the DP table (alloc.DPOptions); 0: the alloc
	// default.
	MaxTableBytes int64
}

// Allocation is a bit width per (layer, expert), as plain data.
type Allocation struct {
	// Budget is the requested bits per expert weight.
	Budget float64 `json:"budget_bits_per_weight"`
	// BudgetBits is the budget in bits over all experts,
	// ⌊Budget · Σ params⌋ (alloc.BudgetForBPW).
	BudgetBits int64 `json:"budget_bits"`
	// Layers are the decoder layer indices; Bits[i][e] is the width of
	// expert e of layer Layers[i], one of Coefficients.Bits.
	Layers []int   `json:"layers"`
	Bits   [][]int `json:"bits"`
	// CostBits is the allocation's cost in the budget's unit (<= BudgetBits).
	CostBits int64 `json:"cost_bits"`
	// Params is Σ params over all experts.
	Params int64 `json:"params"`
	// BitsPerWeight is CostBits / Params (the quantity the budget bounds:
	// stored bits with Overhead, else code bits).
	BitsPerWeight float64 `json:"bits_per_weight"`
	// Overhead echoes AllocOptions.Overhead.
	Overhead bool `json:"overhead"`
	// CodeBitsPerWeight is Σ b·params / Params, the code bits alone.
	CodeBitsPerWeight float64 `json:"code_bits_per_weight"`
	// BitsPerWeightStored counts codes plus an fp16 scale and zero-point
	// per group of AllocOptions.Group, from the experts' shapes.
	BitsPerWeightStored float64 `json:"bits_per_weight_stored"`
	// PredictedError is Σ c[l,e,b] of the chosen widths.
	PredictedError float64 `json:"predicted_error"`
	// LowerBound is a proven lower bound on the optimal PredictedError
	// (equal to it for the exact DP) and Gap their difference.
	LowerBound float64 `json:"lower_bound"`
	Gap        float64 `json:"gap"`
	// Method is the solver that ran ("dp", "lagrangian").
	Method string `json:"method"`
	// Widths counts experts per width: Widths[b] for b in Coefficients.Bits.
	Widths map[int]int `json:"widths"`
	// Warnings are the coefficients' warnings (experts that fell back)
	// and one per expert never routed during calibration.
	Warnings []string `json:"warnings,omitempty"`
}

// Items returns the multiple-choice knapsack of c: one alloc.Item per
// expert (named "layers.L.experts.E", Group = L) with one option per width
// (Error = c[l,e,b], Cost as AllocOptions.Overhead says), and the params
// of each item. Errors: an expert with C of the wrong
// length or non-finite values, or a cost overflow.
func Items(c *Coefficients, opt AllocOptions) ([]alloc.Item, []int64, error) {
	var items []alloc.Item
	var params []int64
	for _, l := range c.Layers {
		for e, x := range l.Experts {
			if len(x.C) != len(c.Bits) {
				return nil, nil, fmt.Errorf("gemq: layer %d expert %d: %d coefficients for %d widths", l.Layer, e, len(x.C), len(c.Bits))
			}
			if x.Params <= 0 {
				return nil, nil, fmt.Errorf("gemq: layer %d expert %d: %d params, want > 0", l.Layer, e, x.Params)
			}
			it := alloc.Item{Name: fmt.Sprintf("layers.%d.experts.%d", l.Layer, e), Group: l.Layer}
			for bi, b := range c.Bits {
				cost := int64(b) * x.Params
				if opt.Overhead {
					cost = storedBits(x.Params, x.Inter, b, opt.Group)
					if cost < 0 {
						return nil, nil, fmt.Errorf("gemq: layer %d expert %d: cost overflows", l.Layer, e)
					}
				}
				if v := x.C[bi]; math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					return nil, nil, fmt.Errorf("gemq: layer %d expert %d: coefficient at %d bits is %v", l.Layer, e, b, v)
				}
				it.Options = append(it.Options, alloc.Option{Bits: float64(b), Group: opt.Group, Cost: cost, Error: x.C[bi]})
			}
			items = append(items, it)
			params = append(params, x.Params)
		}
	}
	if len(items) == 0 {
		return nil, nil, fmt.Errorf("gemq: no experts to allocate")
	}
	return items, params, nil
}

// storedBits is the storage of an expert of params = 3·H·I weights at b
// bits with an fp16 scale and zero-point per group, as the quantized
// checkpoint stores it (docs/QUANT.md): each row's codes padded to whole
// bytes, gate and up_proj [I, H], down_proj [H, I]. An I that does not
// divide params/3 counts the expert as one [1, params] row.
func storedBits(params int64, I, b, group int) int64 {
	if I <= 0 || params%(3*int64(I)) != 0 {
		return rowPadded(1, params, b, group)
	}
	H := params / (3 * int64(I))
	gu := rowPadded(int64(I), H, b, group)
	dn := rowPadded(H, int64(I), b, group)
	if gu < 0 || dn < 0 {
		return -1
	}
	return 2*gu + dn
}

// rowPadded is alloc.TensorCost with every row's codes rounded up to a
// whole byte (weights.RowBytes), -1 on overflow.
func rowPadded(rows, cols int64, b, group int) int64 {
	c := alloc.TensorCost(rows, cols, b, group)
	if c < 0 {
		return -1
	}
	pad := (8 - cols*int64(b)%8) % 8
	if rows > 0 && pad > (math.MaxInt64-c)/rows {
		return -1
	}
	return c + rows*pad
}

// Allocate chooses a width for every expert of c minimising Σ c[l,e,b]
// subject to Σ cost ≤ ⌊budget · Σ params⌋ bits (GEMQ, docs/METHODS.md §4 step
// 3). Experts never routed during calibration get a warning; their
// coefficients are those of Options.MinTokens's fallback (or 0, and then
// they take the cheapest width). Errors: invalid coefficients (Items); a
// budget that is NaN, negative or below the cheapest admissible plan
// (alloc.ErrInfeasible naming that cost, e.g. the rule at a small budget);
// an unknown solver.
func Allocate(c *Coefficients, budget float64, opt AllocOptions) (*Allocation, error) {
	items, params, err := Items(c, opt)
	if err != nil {
		return nil, err
	}
	bb := alloc.BudgetForBPW(params, budget)
	if bb < 0 {
		return nil, fmt.Errorf("gemq: budget %v bits per weight: want finite and >= 0", budget)
	}
	var pl *alloc.Plan
	switch opt.Solver {
	case "", SolverDP:
		pl, err = alloc.SolveDP(items, bb, alloc.DPOptions{GroupRule: opt.Rule, MaxTableBytes: opt.MaxTableBytes})
		if errors.Is(err, alloc.ErrTooLarge) {
			pl, err = alloc.SolveLagrangian(items, bb, alloc.LagrangianOptions{GroupRule: opt.Rule})
		}
	case SolverLagrangian:
		pl, err = alloc.SolveLagrangian(items, bb, alloc.LagrangianOptions{GroupRule: opt.Rule})
	default:
		return nil, fmt.Errorf("gemq: solver %q: want %q or %q", opt.Solver, SolverDP, SolverLagrangian)
	}
	if err != nil {
		return nil, fmt.Errorf("gemq: budget %v bits per expert weight: %w", budget, err)
	}
	a := &Allocation{Budget: budget, BudgetBits: bb, CostBits: pl.Cost, PredictedError: pl.Error, LowerBound: pl.LowerBound,
		Gap: pl.Gap(), Method: pl.Method, Widths: map[int]int{}, Warnings: append([]string(nil), c.Warnings...)}
	var stored, code int64
	k := 0
	for _, l := range c.Layers {
		a.Layers = append(a.Layers, l.Layer)
		row := make([]int, len(l.Experts))
		for e, x := range l.Experts {
			b := c.Bits[pl.Choice[k]]
			row[e] = b
			a.Widths[b]++
			a.Params += x.Params
			stored += storedBits(x.Params, x.Inter, b, opt.Group)
			code += int64(b) * x.Params
			if x.Routed == 0 {
				a.Warnings = append(a.Warnings, fmt.Sprintf("layer %d expert %d: never routed during calibration; allocated %d bits from fallback coefficients %v", l.Layer, e, b, x.C))
			}
			k++
		}
		a.Bits = append(a.Bits, row)
	}
	a.BitsPerWeight = float64(a.CostBits) / float64(a.Params)
	a.BitsPerWeightStored = float64(stored) / float64(a.Params)
	a.CodeBitsPerWeight = float64(code) / float64(a.Params)
	a.Overhead = opt.Overhead
	return a, nil
}

// WriteText writes a human-readable report of a: the budget and solver,
// code and stored bits per weight, the predicted error with its lower
// bound and gap, the number of experts per width, one line per layer with
// each expert's width, and the warnings. Errors: those of w.
func (a *Allocation) WriteText(w io.Writer) error {
	var b strings.Builder
	unit := "code bits"
	if a.Overhead {
		unit = "stored bits, fp16 scales and zero-points counted"
	}
	fmt.Fprintf(&b, "GEMQ allocation: budget %.4g bits per expert weight (%s; %d bits), solver %s\n", a.Budget, unit, a.BudgetBits, a.Method)
	fmt.Fprintf(&b, "  %d weights: %.4f code bits per weight, %.4f stored (with fp16 scales and zero-points)\n", a.Params, a.CodeBitsPerWeight, a.BitsPerWeightStored)
	fmt.Fprintf(&b, "  allocation objective (sum of the chosen GEMQ coefficients) %.6g (lower bound %.6g, gap %.3g)\n", a.PredictedError, a.LowerBound, a.Gap)
	ws := make([]int, 0, len(a.Widths))
	for k := range a.Widths {
		ws = append(ws, k)
	}
	slices.Sort(ws)
	parts := make([]string, len(ws))
	for i, k := range ws {
		parts[i] = fmt.Sprintf("%d bits: %d", k, a.Widths[k])
	}
	b.WriteString("  experts per width: " + strings.Join(parts, "; "))
	b.WriteString("\n  layer  bits per expert\n")
	for i, l := range a.Layers {
		fmt.Fprintf(&b, "  %5d ", l)
		for _, x := range a.Bits[i] {
			fmt.Fprintf(&b, " %d", x)
		}
		b.WriteString("\n")
	}
	for _, s := range a.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", s)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
