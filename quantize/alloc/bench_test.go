package alloc

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// moeInstance is a Qwen3-MoE-30B-A3B-sized allocation: layers × experts
// items, each expert 3·2048·768 weights, widths 1..4 bits at group 128
// (cost (b + 0.25)·P bits), error sensitivity·4^−b with a seeded
// log-normal sensitivity per expert. The budget is bpe bits per expert
// weight plus the scale overhead.
func moeInstance(layers, experts int, bpe float64) ([]Item, int64) {
	const rows, cols = 3 * 768, 2048
	rng := rand.New(rand.NewPCG(11, 12))
	items := make([]Item, 0, layers*experts)
	for l := 0; l < layers; l++ {
		for e := 0; e < experts; e++ {
			s := math.Exp(rng.NormFloat64())
			it := Item{Name: fmt.Sprintf("layers.%d.experts.%d", l, e), Group: l}
			for b := 1; b <= 4; b++ {
				it.Options = append(it.Options, Option{
					Bits: float64(b), Group: 128,
					Cost:  TensorCost(rows, cols, b, 128),
					Error: s * math.Pow(4, -float64(b)),
				})
			}
			items = append(items, it)
		}
	}
	return items, int64(float64(len(items)) * (bpe + 0.25) * rows * cols)
}

func peakHeap(f func()) uint64 {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func BenchmarkDPQwen3MoE(b *testing.B) {
	for _, rule := range []bool{false, true} {
		b.Run(fmt.Sprintf("48x128x4/rule=%v", rule), func(b *testing.B) {
			items, budget := moeInstance(48, 128, 2.5)
			var pl *Plan
			var bytes uint64
			for b.Loop() {
				bytes = peakHeap(func() {
					var err error
					if pl, err = SolveDP(items, budget, DPOptions{GroupRule: rule}); err != nil {
						b.Fatal(err)
					}
				})
			}
			b.ReportMetric(float64(bytes)/(1<<20), "alloc-MiB/op")
			b.ReportMetric(float64(pl.Cost)/float64(len(items)*3*768*2048), "bits/weight")
			b.ReportMetric(pl.Error, "error")
		})
	}
}

func BenchmarkLagrangian(b *testing.B) {
	for _, c := range []struct {
		layers, experts int
		rule            bool
	}{{48, 128, false}, {48, 128, true}, {80, 128, false}, {782, 128, false}} {
		b.Run(fmt.Sprintf("%dx%dx4/rule=%v", c.layers, c.experts, c.rule), func(b *testing.B) {
			items, budget := moeInstance(c.layers, c.experts, 2.5)
			var pl *Plan
			var bytes uint64
			for b.Loop() {
				bytes = peakHeap(func() {
					var err error
					if pl, err = SolveLagrangian(items, budget, LagrangianOptions{GroupRule: c.rule}); err != nil {
						b.Fatal(err)
					}
				})
			}
			b.ReportMetric(float64(bytes)/(1<<20), "alloc-MiB/op")
			b.ReportMetric(float64(len(items)), "items")
			b.ReportMetric(pl.Error, "error")
			b.ReportMetric(pl.Gap()/pl.LowerBound, "rel-gap")
		})
	}
}
