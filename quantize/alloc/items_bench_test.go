package alloc

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// itemsInstance is an MoE-shaped allocation with exactly n items (100
// experts per layer group), each expert 3·2048·768 weights at widths 1..4
// (codes plus per-128 fp16 scale and zero), error s·4^−b with a seeded
// log-normal sensitivity s, and a budget of 2.5 bits per weight plus the
// scale overhead. The reduced costs share the GCD 3·2048·768 bits, so the
// exact DP spans 1.5·n budget steps.
func itemsInstance(n int) ([]Item, int64) {
	const rows, cols = 3 * 768, 2048
	rng := rand.New(rand.NewPCG(21, 22))
	items := make([]Item, n)
	for i := range items {
		s := math.Exp(rng.NormFloat64())
		it := Item{Name: fmt.Sprintf("layers.%d.experts.%d", i/100, i%100), Group: i / 100}
		for b := 1; b <= 4; b++ {
			it.Options = append(it.Options, Option{Bits: float64(b), Group: 128, Cost: TensorCost(rows, cols, b, 128), Error: s * math.Pow(4, -float64(b))})
		}
		items[i] = it
	}
	return items, int64(float64(n) * 2.75 * rows * cols)
}

// BenchmarkAllocItems times the solvers at 10k and 100k items: the exact
// DP at 10k (at 100k its exact table would need 15 GB) and the Lagrangian
// solver at both sizes. Reports items, the bytes allocated per run and the
// relative gap (Error − LowerBound)/Error: 0 for the DP; for the
// Lagrangian solver the gap to its dual bound, which is the LP bound
// without the rule. Run with -benchtime=1x (about 15 s in all).
func BenchmarkAllocItems(b *testing.B) {
	for _, c := range []struct {
		n      int
		solver string
		rule   bool
	}{{10000, "dp", false}, {10000, "dp", true}, {10000, "lagrangian", false}, {100000, "lagrangian", false}, {100000, "lagrangian", true}} {
		b.Run(fmt.Sprintf("%dk/%s/rule=%v", c.n/1000, c.solver, c.rule), func(b *testing.B) {
			items, budget := itemsInstance(c.n)
			var pl *Plan
			var bytes uint64
			for b.Loop() {
				bytes = peakHeap(func() {
					var err error
					switch c.solver {
					case "dp":
						pl, err = SolveDP(items, budget, DPOptions{GroupRule: c.rule, MaxTableBytes: 4 << 30})
					default:
						pl, err = SolveLagrangian(items, budget, LagrangianOptions{GroupRule: c.rule})
					}
					if err != nil {
						b.Fatal(err)
					}
				})
			}
			b.ReportMetric(float64(len(items)), "items")
			b.ReportMetric(float64(bytes)/(1<<20), "alloc-MiB/op")
			b.ReportMetric(pl.Gap()/pl.Error, "rel-gap")
		})
	}
}
