package alloc_test

import (
	"fmt"

	"github.com/lmpack/lmpack/quantize/alloc"
)

// Two experts of one layer, 2 or 4 bits, at 3 bits per weight on average:
// the more sensitive expert gets 4 bits.
func ExampleSolveDP() {
	const params = 1000
	items := []alloc.Item{
		{Name: "layers.0.experts.0", Options: []alloc.Option{
			{Bits: 2, Cost: 2 * params, Error: 1.0}, {Bits: 4, Cost: 4 * params, Error: 0.25}}},
		{Name: "layers.0.experts.1", Options: []alloc.Option{
			{Bits: 2, Cost: 2 * params, Error: 4.0}, {Bits: 4, Cost: 4 * params, Error: 1.0}}},
	}
	budget := alloc.BudgetForBPW([]int64{params, params}, 3)
	pl, err := alloc.SolveDP(items, budget, alloc.DPOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(pl.Choice, pl.Cost, pl.Error)
	lg, _ := alloc.SolveLagrangian(items, budget, alloc.LagrangianOptions{})
	fmt.Println(lg.Choice, lg.Error, lg.LowerBound)
	// Output:
	// [0 1] 6000 2
	// [0 1] 2 2
}
