package gemq

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/quantize/alloc"
)

// synthCoeffs returns L layers of E experts with seeded coefficients
// decreasing in the width and params that differ between experts.
func synthCoeffs(seed uint64, L, E int) *Coefficients {
	r := rand.New(rand.NewPCG(seed, 9))
	c := &Coefficients{Bits: DefaultBits, Weighting: WeightRouted, Tokens: 100}
	for l := 0; l < L; l++ {
		lc := LayerCoeffs{Layer: 2 * l}
		for e := 0; e < E; e++ {
			I := 4 + r.IntN(3)
			x := ExpertCoeffs{Params: int64(3 * 8 * I), Inter: I, Routed: int64(r.IntN(50))}
			s := math.Exp(r.NormFloat64())
			for b := range DefaultBits {
				x.C = append(x.C, s*math.Pow(3.5+r.Float64(), -float64(b)))
			}
			lc.Experts = append(lc.Experts, x)
		}
		c.Layers = append(c.Layers, lc)
	}
	return c
}

// brute enumerates every width assignment and returns the least total
// coefficient within the budget (code bits ≤ ⌊budget·Σ params⌋), under
// the rule when asked; ok is false when nothing fits.
func brute(c *Coefficients, budget float64, rule bool) (best float64, ok bool) {
	var xs []ExpertCoeffs
	var layer []int
	var total int64
	for li, l := range c.Layers {
		for _, x := range l.Experts {
			xs = append(xs, x)
			layer = append(layer, li)
			total += x.Params
		}
	}
	limit := int64(math.Floor(budget * float64(total)))
	n, W := len(xs), len(c.Bits)
	choice := make([]int, n)
	best = math.Inf(1)
	for {
		var cost int64
		var err float64
		top := make([]int, len(c.Layers))
		sec := make([]int, len(c.Layers))
		for i, o := range choice {
			cost += int64(c.Bits[o]) * xs[i].Params
			err += xs[i].C[o]
			if o == W-1 {
				top[layer[i]]++
			}
			if o == W-2 {
				sec[layer[i]]++
			}
		}
		fits := cost <= limit
		if rule {
			for l := range top {
				fits = fits && top[l] > 0 && sec[l] > 0
			}
		}
		if fits && err < best {
			best, ok = err, true
		}
		i := 0
		for ; i < n; i++ {
			choice[i]++
			if choice[i] < W {
				break
			}
			choice[i] = 0
		}
		if i == n {
			return best, ok
		}
	}
}

// TestAllocateBruteForce: on 3 layers × 3 experts (4^9 assignments) the
// DP allocation is the brute-force optimum for several budgets with and
// without the per-layer rule, fits the budget, uses only the given widths
// and meets the rule; the Lagrangian allocation fits too, its lower bound
// is at most the optimum and its gap is Error − LowerBound ≥ 0.
func TestAllocateBruteForce(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		c := synthCoeffs(seed, 3, 3)
		for _, budget := range []float64{1.2, 1.5, 2.0, 2.5, 3.0, 3.7} {
			for _, rule := range []bool{false, true} {
				opt, ok := brute(c, budget, rule)
				a, err := Allocate(c, budget, AllocOptions{Rule: rule})
				if !ok {
					if !errors.Is(err, alloc.ErrInfeasible) {
						t.Errorf("seed %d budget %v rule %v: brute force finds no plan, Allocate: %v", seed, budget, rule, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("seed %d budget %v rule %v: %v", seed, budget, rule, err)
				}
				if math.Abs(a.PredictedError-opt) > 1e-12*opt || a.Method != "dp" || a.Gap != 0 {
					t.Errorf("seed %d budget %v rule %v: DP %v (%s, gap %v), brute force %v", seed, budget, rule, a.PredictedError, a.Method, a.Gap, opt)
				}
				checkAllocation(t, c, a, budget, rule)
				l, err := Allocate(c, budget, AllocOptions{Rule: rule, Solver: SolverLagrangian})
				if err != nil {
					t.Fatal(err)
				}
				checkAllocation(t, c, l, budget, rule)
				if l.Method != "lagrangian" || l.LowerBound > opt*(1+1e-12) || l.PredictedError < opt*(1-1e-12) || l.Gap < 0 {
					t.Errorf("seed %d budget %v rule %v: Lagrangian %v bound %v gap %v, optimum %v", seed, budget, rule, l.PredictedError, l.LowerBound, l.Gap, opt)
				}
			}
		}
	}
}

// checkAllocation asserts the relations every allocation must satisfy.
func checkAllocation(t *testing.T, c *Coefficients, a *Allocation, budget float64, rule bool) {
	t.Helper()
	var cost, params int64
	var sum float64
	count := 0
	for li, l := range c.Layers {
		if a.Layers[li] != l.Layer {
			t.Fatalf("layer entry %d is %d, want %d", li, a.Layers[li], l.Layer)
		}
		top, sec := 0, 0
		for e, x := range l.Experts {
			b := a.Bits[li][e]
			bi := -1
			for i, w := range c.Bits {
				if w == b {
					bi = i
				}
			}
			if bi < 0 {
				t.Fatalf("layer %d expert %d: %d bits is not a candidate width", l.Layer, e, b)
			}
			cost += int64(b) * x.Params
			params += x.Params
			sum += x.C[bi]
			count++
			if bi == len(c.Bits)-1 {
				top++
			}
			if bi == len(c.Bits)-2 {
				sec++
			}
		}
		if rule && (top == 0 || sec == 0) {
			t.Errorf("layer %d: %d experts at the top width, %d at the next; the rule wants one each", l.Layer, top, sec)
		}
	}
	n := 0
	for _, v := range a.Widths {
		n += v
	}
	if cost != a.CostBits || params != a.Params || cost > a.BudgetBits || float64(cost) > budget*float64(params) || n != count ||
		math.Abs(sum-a.PredictedError) > 1e-12*sum || math.Abs(a.BitsPerWeight-float64(cost)/float64(params)) > 1e-15 {
		t.Errorf("cost %d (allocation says %d, budget %d), params %d/%d, error %v/%v, widths %v", cost, a.CostBits, a.BudgetBits, params, a.Params, sum, a.PredictedError, a.Widths)
	}
	if a.Overhead || a.CodeBitsPerWeight != a.BitsPerWeight {
		t.Errorf("code bits per weight %v, budget quantity %v (overhead %v)", a.CodeBitsPerWeight, a.BitsPerWeight, a.Overhead)
	}
	if !(a.BitsPerWeightStored > a.BitsPerWeight) {
		t.Errorf("stored bits per weight %v not above the code bits %v", a.BitsPerWeightStored, a.BitsPerWeight)
	}
}

// TestAllocateOptions: Overhead budgets count scales (fewer bits for codes
// at the same budget), and bad input is refused with a clear error.
func TestAllocateOptions(t *testing.T) {
	c := synthCoeffs(9, 2, 4)
	for _, l := range c.Layers { // H = 64, I = 16: per-channel scales add 0.5 bits (gate, up) and 2 bits (down) per weight
		for e := range l.Experts {
			l.Experts[e].Params, l.Experts[e].Inter = 3*64*16, 16
		}
	}
	plain, err := Allocate(c, 3.5, AllocOptions{})
	if err != nil {
		t.Fatal(err)
	}
	over, err := Allocate(c, 3.5, AllocOptions{Overhead: true})
	if err != nil {
		t.Fatal(err)
	}
	if over.BitsPerWeightStored > 3.5 || over.BitsPerWeight > 3.5 || plain.BitsPerWeightStored <= 3.5 || over.PredictedError < plain.PredictedError {
		t.Errorf("overhead: stored %v code-or-stored %v error %v; plain stored %v error %v",
			over.BitsPerWeightStored, over.BitsPerWeight, over.PredictedError, plain.BitsPerWeightStored, plain.PredictedError)
	}
	if math.Abs(plain.BitsPerWeightStored-plain.BitsPerWeight-1) > 1e-12 || math.Abs(over.BitsPerWeight-over.BitsPerWeightStored) > 1e-12 {
		t.Errorf("with Overhead the budgeted bits %v should be the stored bits %v", over.BitsPerWeight, over.BitsPerWeightStored)
	}
	bad := synthCoeffs(9, 2, 4)
	bad.Layers[1].Experts[2].C[1] = math.NaN()
	for _, x := range []struct {
		c      *Coefficients
		budget float64
		opt    AllocOptions
		want   string
	}{
		{bad, 3, AllocOptions{}, "layer 2 expert 2: coefficient at 2 bits is NaN"},
		{c, -1, AllocOptions{}, "budget -1"},
		{c, math.NaN(), AllocOptions{}, "budget NaN"},
		{c, 0.5, AllocOptions{}, "below the minimum cost"},
		{c, 2, AllocOptions{Rule: true}, "below the minimum cost"},
		{c, 1.8, AllocOptions{Overhead: true}, "below the minimum cost"},
		{c, 3, AllocOptions{Solver: "milp"}, `solver "milp"`},
		{&Coefficients{Bits: DefaultBits}, 3, AllocOptions{}, "no experts"},
	} {
		if _, err := Allocate(x.c, x.budget, x.opt); err == nil || !strings.Contains(err.Error(), x.want) {
			t.Errorf("budget %v %+v: %v; want %q", x.budget, x.opt, err, x.want)
		}
	}
}

// TestWriteText: the report names the budget, solver, widths per layer
// and the warnings; the JSON form round-trips.
func TestWriteText(t *testing.T) {
	c := synthCoeffs(3, 2, 3)
	c.Layers[1].Experts[2].Routed = 0
	a, err := Allocate(c, 2.5, AllocOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := a.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	row := fmt.Sprintf("      2  %d %d %d\n", a.Bits[1][0], a.Bits[1][1], a.Bits[1][2])
	for _, want := range []string{"budget 2.5 bits per expert weight", "solver dp", "gap 0", row, "warning: layer 2 expert 2: never routed"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	js, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back Allocation
	if err := json.Unmarshal(js, &back); err != nil || back.PredictedError != a.PredictedError || back.Bits[1][2] != a.Bits[1][2] || back.Widths[4] != a.Widths[4] {
		t.Errorf("JSON round trip: %v\n%s", err, js)
	}
}
