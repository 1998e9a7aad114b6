//go:build !amd64 || purego

package weights

// hasAVX2 is false: this build has no assembly tile kernel.
const hasAVX2 = false

func dotNT2x4AVX2(a0, a1, b *float64, ldb, n4 int, out *[8]float64) {
	panic("weights: dotNT2x4AVX2 without assembly")
}
