package alloc

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// randInstance builds n items in `groups` rule groups, each with 1..maxOpts
// options of widths drawn from {1,2,3,4}; costs are unit·(bits·k + r) so
// they share the factor unit; errors are integers when intErr.
func randInstance(rng *rand.Rand, n, maxOpts, groups int, unit int64, intErr bool) []Item {
	items := make([]Item, n)
	for i := range items {
		k := int64(1 + rng.IntN(5))
		no := 1 + rng.IntN(maxOpts)
		it := Item{Name: fmt.Sprintf("l%d.e%d", i%groups, i), Group: i % groups}
		for o := 0; o < no; o++ {
			b := float64(1 + rng.IntN(4))
			e := rng.Float64() * math.Pow(4, -b) * 100
			if intErr {
				e = float64(rng.IntN(50))
			}
			it.Options = append(it.Options, Option{
				Bits:  b,
				Group: 128,
				Cost:  unit * (int64(b)*k + int64(rng.IntN(3))),
				Error: e,
			})
		}
		items[i] = it
	}
	return items
}

// bruteForce enumerates every choice; it returns the least error (summed in
// item order) among plans within budget (and the rule), and whether any fits.
func bruteForce(items []Item, budget int64, rule bool) (float64, bool) {
	choice := make([]int, len(items))
	best, found := math.Inf(1), false
	var rec func(k int)
	rec = func(k int) {
		if k == len(items) {
			var c int64
			var e float64
			for i, o := range choice {
				c += items[i].Options[o].Cost
				e += items[i].Options[o].Error
			}
			if c > budget || (rule && !RuleSatisfied(items, choice)) {
				return
			}
			if e < best {
				best = e
			}
			found = true
			return
		}
		for o := range items[k].Options {
			choice[k] = o
			rec(k + 1)
		}
	}
	rec(0)
	return best, found
}

func costRange(items []Item) (lo, hi int64) {
	for _, it := range items {
		mn, mx := int64(math.MaxInt64), int64(0)
		for _, op := range it.Options {
			mn, mx = min(mn, op.Cost), max(mx, op.Cost)
		}
		lo += mn
		hi += mx
	}
	return lo, hi
}

// checkPlan verifies a plan against its items independently of the solver.
func checkPlan(t *testing.T, items []Item, budget int64, rule bool, pl *Plan) {
	t.Helper()
	if len(pl.Choice) != len(items) {
		t.Fatalf("%d choices for %d items", len(pl.Choice), len(items))
	}
	var c int64
	var e float64
	for i, o := range pl.Choice {
		if o < 0 || o >= len(items[i].Options) {
			t.Fatalf("item %d: choice %d out of range", i, o)
		}
		c += items[i].Options[o].Cost
		e += items[i].Options[o].Error
	}
	if c != pl.Cost || c > budget {
		t.Fatalf("plan cost %d (recomputed %d), budget %d", pl.Cost, c, budget)
	}
	if e != pl.Error {
		t.Fatalf("plan error %v, recomputed %v", pl.Error, e)
	}
	if rule && !RuleSatisfied(items, pl.Choice) {
		t.Fatalf("plan %v breaks the per-group rule", pl.Choice)
	}
}

func TestDPMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases, ruled := 0, 0
	for trial := 0; trial < 600; trial++ {
		n := 1 + rng.IntN(7)
		groups := 1 + rng.IntN(3)
		rule := trial%2 == 1
		intErr := trial%3 == 0
		unit := int64(1 + rng.IntN(3))
		items := randInstance(rng, n, 4, groups, unit, intErr)
		lo, hi := costRange(items)
		budget := lo + rng.Int64N(hi-lo+2)
		want, ok := bruteForce(items, budget, rule)
		pl, err := SolveDP(items, budget, DPOptions{GroupRule: rule})
		if !ok {
			if !errors.Is(err, ErrInfeasible) {
				t.Fatalf("trial %d: brute force finds no plan, DP returned %v, %v", trial, pl, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("trial %d (rule %v): %v", trial, rule, err)
		}
		checkPlan(t, items, budget, rule, pl)
		if intErr && pl.Error != want {
			t.Fatalf("trial %d (rule %v): DP error %v, brute force %v", trial, rule, pl.Error, want)
		}
		if math.Abs(pl.Error-want) > 1e-12*max(1, want) {
			t.Fatalf("trial %d (rule %v): DP error %v, brute force %v", trial, rule, pl.Error, want)
		}
		if pl.Method != "dp" || pl.LowerBound != pl.Error {
			t.Fatalf("exact DP: method %q lower bound %v error %v", pl.Method, pl.LowerBound, pl.Error)
		}
		cases++
		if rule {
			ruled++
		}
	}
	if cases < 350 || ruled < 80 {
		t.Fatalf("only %d feasible cases (%d with the rule)", cases, ruled)
	}
}

func TestLagrangianBracketsOptimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	worst := 0.0
	for trial := 0; trial < 400; trial++ {
		rule := trial%2 == 1
		items := randInstance(rng, 2+rng.IntN(12), 4, 1+rng.IntN(3), 1, false)
		lo, hi := costRange(items)
		budget := lo + rng.Int64N(hi-lo+1)
		dp, err := SolveDP(items, budget, DPOptions{GroupRule: rule})
		if errors.Is(err, ErrInfeasible) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		lg, err := SolveLagrangian(items, budget, LagrangianOptions{GroupRule: rule})
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		checkPlan(t, items, budget, rule, lg)
		tol := 1e-9 * max(1, dp.Error)
		if lg.Error < dp.Error-tol || dp.Error < lg.LowerBound-tol {
			t.Fatalf("trial %d (rule %v): lagrangian %v, DP %v, lower bound %v", trial, rule, lg.Error, dp.Error, lg.LowerBound)
		}
		if lg.Method != "lagrangian" || lg.Gap() < 0 {
			t.Fatalf("method %q gap %v", lg.Method, lg.Gap())
		}
		if dp.Error > 0 {
			worst = max(worst, (lg.Error-dp.Error)/dp.Error)
		}
	}
	t.Logf("worst relative excess of the Lagrangian plan over the DP optimum: %.3g", worst)
}

// lpRelaxation solves min Σ e·x s.t. Σ_o x_io = 1, Σ c·x + slack = budget,
// x, slack ≥ 0 with gonum's simplex.
func lpRelaxation(t *testing.T, items []Item, budget int64) float64 {
	t.Helper()
	nv := 1
	for _, it := range items {
		nv += len(it.Options)
	}
	A := mat.NewDense(len(items)+1, nv, nil)
	c := make([]float64, nv)
	b := make([]float64, len(items)+1)
	col := 0
	for i, it := range items {
		for _, op := range it.Options {
			A.Set(i, col, 1)
			A.Set(len(items), col, float64(op.Cost)/float64(budget))
			c[col] = op.Error
			col++
		}
		b[i] = 1
	}
	A.Set(len(items), col, 1) // slack
	b[len(items)] = 1
	opt, _, err := lp.Simplex(c, A, b, 1e-12, nil)
	if err != nil {
		t.Fatalf("simplex: %v", err)
	}
	return opt
}

func TestLowerBoundEqualsLP(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	n := 0
	for trial := 0; trial < 100; trial++ {
		items := randInstance(rng, 2+rng.IntN(10), 4, 1, 1, false)
		lo, hi := costRange(items)
		if hi == lo {
			continue
		}
		budget := lo + 1 + rng.Int64N(hi-lo)
		lg, err := SolveLagrangian(items, budget, LagrangianOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := lpRelaxation(t, items, budget)
		if math.Abs(lg.LowerBound-want) > 1e-6 {
			t.Fatalf("trial %d: lower bound %.12g, LP relaxation %.12g", trial, lg.LowerBound, want)
		}
		n++
	}
	if n < 80 {
		t.Fatalf("only %d instances compared", n)
	}
}

// Costs that share a large factor (a Qwen3-MoE expert's 4,718,592
// weights) fit a tiny table after GCD scaling and stay exact.
func TestGCDScaling(t *testing.T) {
	const P = 3 * 2048 * 768
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 50; trial++ {
		items := randInstance(rng, 6, 4, 2, P, trial%2 == 0)
		lo, hi := costRange(items)
		budget := lo + rng.Int64N(hi-lo+1)
		want, ok := bruteForce(items, budget, false)
		if !ok {
			t.Fatal("cheapest plan must fit")
		}
		// Unscaled, the table would need 6·(hi−lo) ≥ 1e7 bytes.
		pl, err := SolveDP(items, budget, DPOptions{MaxTableBytes: 4096})
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		checkPlan(t, items, budget, false, pl)
		if math.Abs(pl.Error-want) > 1e-12*max(1, want) {
			t.Fatalf("trial %d: DP %v, brute force %v", trial, pl.Error, want)
		}
	}
}

func TestQuantum(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	coarse := 0
	for trial := 0; trial < 200; trial++ {
		items := randInstance(rng, 2+rng.IntN(6), 4, 2, 4, false)
		lo, hi := costRange(items)
		budget := lo + rng.Int64N(hi-lo+1)
		exact, err := SolveDP(items, budget, DPOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Quantum 2 divides the GCD (a multiple of 4): still exact.
		q2, err := SolveDP(items, budget, DPOptions{Quantum: 2})
		if err != nil {
			t.Fatal(err)
		}
		if q2.Error != exact.Error || q2.Method != "dp" {
			t.Fatalf("quantum 2: %v (%s), exact %v", q2.Error, q2.Method, exact.Error)
		}
		q, err := SolveDP(items, budget, DPOptions{Quantum: 7})
		if errors.Is(err, ErrInfeasible) {
			continue // rounding up left no plan
		}
		if err != nil {
			t.Fatal(err)
		}
		checkPlan(t, items, budget, false, q)
		if q.Method == "dp" { // 7 divides the GCD of the reduced costs (e.g. all 0)
			if q.Error != exact.Error {
				t.Fatalf("quantum 7 exact: %v, want %v", q.Error, exact.Error)
			}
			continue
		}
		if q.Method != "dp-quantized" || q.Error < exact.Error || q.LowerBound > exact.Error+1e-9 {
			t.Fatalf("quantum 7: %s error %v lower bound %v, exact %v", q.Method, q.Error, q.LowerBound, exact.Error)
		}
		coarse++
	}
	if coarse < 100 {
		t.Fatalf("only %d coarse cases", coarse)
	}
}

func TestErrors(t *testing.T) {
	ok := []Item{
		{Name: "a", Options: []Option{{Bits: 2, Cost: 20, Error: 3}, {Bits: 4, Cost: 40, Error: 1}}},
		{Name: "b", Options: []Option{{Bits: 2, Cost: 30, Error: 2}, {Bits: 4, Cost: 60, Error: 0}}},
	}
	with := func(f func(items []Item)) []Item {
		c := make([]Item, len(ok))
		for i := range ok {
			c[i] = ok[i]
			c[i].Options = append([]Option(nil), ok[i].Options...)
		}
		f(c)
		return c
	}
	cases := []struct {
		name   string
		items  []Item
		budget int64
		want   error
		text   string
	}{
		{"infeasible", ok, 49, ErrInfeasible, "minimum cost 50 bits"},
		{"no items", nil, 10, ErrInvalid, "no items"},
		{"no options", with(func(c []Item) { c[1].Options = nil }), 100, ErrInvalid, `item 1 "b": no options`},
		{"negative cost", with(func(c []Item) { c[0].Options[1].Cost = -1 }), 100, ErrInvalid, `item 0 "a": option 1: cost -1 bits is negative`},
		{"negative error", with(func(c []Item) { c[1].Options[0].Error = -1 }), 100, ErrInvalid, `option 0: error -1`},
		{"NaN error", with(func(c []Item) { c[1].Options[0].Error = math.NaN() }), 100, ErrInvalid, "error NaN"},
		{"NaN bits", with(func(c []Item) { c[0].Options[0].Bits = math.NaN() }), 100, ErrInvalid, "bits NaN"},
		{"negative budget", ok, -1, ErrInvalid, "budget -1 bits"},
		{"overflow", with(func(c []Item) { c[0].Options[0].Cost = math.MaxInt64; c[1].Options[0].Cost = math.MaxInt64 }), 100, ErrInvalid, "overflows"},
	}
	for _, tc := range cases {
		_, err1 := SolveDP(tc.items, tc.budget, DPOptions{})
		_, err2 := SolveLagrangian(tc.items, tc.budget, LagrangianOptions{})
		for _, err := range []error{err1, err2} {
			if !errors.Is(err, tc.want) || !strings.Contains(fmt.Sprint(err), tc.text) {
				t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.want, tc.text)
			}
		}
	}
	// The rule raises the minimum: one item must take 4 bits.
	ruled := with(func(c []Item) {})
	_, err := SolveDP(ruled, 60, DPOptions{GroupRule: true})
	if !errors.Is(err, ErrInfeasible) || !strings.Contains(err.Error(), "minimum cost 70 bits") {
		t.Errorf("rule: %v", err)
	}
	one := with(func(c []Item) { c[0].Options = c[0].Options[:1]; c[1].Options = c[1].Options[:1] })
	if _, err := SolveLagrangian(one, 100, LagrangianOptions{GroupRule: true}); !errors.Is(err, ErrInfeasible) {
		t.Errorf("rule with one width: %v", err)
	}
	if _, err := SolveDP(ok, 100, DPOptions{MaxTableBytes: 10}); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "SolveLagrangian") {
		t.Errorf("table cap: %v", err)
	}
}

func TestTensorCostAndBudget(t *testing.T) {
	cases := []struct {
		rows, cols  int64
		bits, group int
		want        int64
	}{
		{4, 256, 4, 128, 4*256*4 + 4*2*32},
		{4, 256, 2, 32, 4*256*2 + 4*8*32},
		{4, 100, 3, 64, 4*100*3 + 4*2*32}, // ⌈100/64⌉ = 2 groups
		{3, 10, 8, 0, 3*10*8 + 3*32},      // per channel
		{-1, 10, 8, 0, -1},
		{1 << 40, 1 << 30, 8, 128, -1},
	}
	for _, c := range cases {
		if got := TensorCost(c.rows, c.cols, c.bits, c.group); got != c.want {
			t.Errorf("TensorCost(%d,%d,%d,%d) = %d, want %d", c.rows, c.cols, c.bits, c.group, got, c.want)
		}
	}
	if got := BudgetForBPW([]int64{1000, 24}, 2.5); got != 2560 {
		t.Errorf("BudgetForBPW = %d, want 2560", got)
	}
	if got := BudgetForBPW([]int64{3}, 2.5); got != 7 {
		t.Errorf("BudgetForBPW rounds down: %d, want 7", got)
	}
	if BudgetForBPW([]int64{1}, math.NaN()) != -1 || BudgetForBPW([]int64{-1}, 2) != -1 {
		t.Error("BudgetForBPW accepts bad input")
	}
}

// denseModel is a small dense model: per tensor [rows, cols] and an error
// model err = sensitivity · 4^−bits · (1 + group/256) of RTN-like shape.
func denseModel() ([]Item, []int64) {
	shapes := [][2]int64{{64, 256}, {256, 64}, {128, 256}, {256, 128}}
	sens := []float64{1, 3, 0.5, 2}
	var items []Item
	var params []int64
	for t, s := range shapes {
		it := Item{Name: fmt.Sprintf("blk.%d", t), Group: -1}
		for _, b := range []int{2, 3, 4, 8} {
			for _, g := range []int{32, 64, 128} {
				it.Options = append(it.Options, Option{
					Bits: float64(b), Group: g,
					Cost:  TensorCost(s[0], s[1], b, g),
					Error: sens[t] * math.Pow(4, -float64(b)) * (1 + float64(g)/256),
				})
			}
		}
		items = append(items, it)
		params = append(params, s[0]*s[1])
	}
	return items, params
}

func TestDenseTargetBPW(t *testing.T) {
	items, params := denseModel()
	prevErr := math.Inf(1)
	for _, bpw := range []float64{2.5, 3.0, 3.5, 4.5} {
		budget := BudgetForBPW(params, bpw)
		pl, err := SolveDP(items, budget, DPOptions{})
		if err != nil {
			t.Fatalf("%.1f bpw: %v", bpw, err)
		}
		checkPlan(t, items, budget, false, pl)
		want, _ := bruteForce(items, budget, false)
		if math.Abs(pl.Error-want) > 1e-12*want {
			t.Fatalf("%.1f bpw: DP %v, brute force %v", bpw, pl.Error, want)
		}
		got := pl.BitsPerWeight(params)
		if got > bpw || got < bpw-0.25 {
			t.Fatalf("%.1f bpw target: plan has %.4f bpw", bpw, got)
		}
		if pl.Error >= prevErr {
			t.Fatalf("%.1f bpw: error %v did not fall below %v", bpw, pl.Error, prevErr)
		}
		prevErr = pl.Error
		t.Logf("target %.1f bpw: %.4f bpw (scales included), error %.4g", bpw, got, pl.Error)
	}
	// 2 bits at group 128 plus 0.25 bits of scales is the floor.
	if _, err := SolveDP(items, BudgetForBPW(params, 2.2), DPOptions{}); !errors.Is(err, ErrInfeasible) {
		t.Fatalf("2.2 bpw: %v, want ErrInfeasible", err)
	}
}
