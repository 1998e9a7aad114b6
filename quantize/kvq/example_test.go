package kvq_test

import (
	"fmt"

	"github.com/lmpack/lmpack/quantize/kvq"
)

// Quantize one 8-element row to INT2 (4 codes per byte) and back. Ties
// round up: 0 and 1 lie halfway between levels.
func ExampleQuantizeAsym() {
	x := []float32{-1.5, -0.5, 0, 0.5, 1.5, 0.25, -1, 1}
	codes := make([]byte, kvq.PackedLen(len(x), 2)) // 2 bytes
	scale, zero := kvq.QuantizeAsym(codes, x, 2)
	y := make([]float32, len(x))
	kvq.DecodeAsym(y, codes, 2, scale, zero)
	fmt.Printf("scale %.0f zero %.1f codes %08b\n", scale, zero, codes)
	fmt.Println(y)
	// Output:
	// scale 1 zero 1.5 codes [10100100 11011011]
	// [-1.5 -0.5 0.5 0.5 1.5 0.5 -0.5 1.5]
}

// The normalized Walsh–Hadamard transform spreads one large coordinate
// over all coordinates, and is its own inverse.
func ExampleFWHT() {
	x := []float32{4, 0, 0, 0}
	kvq.FWHT(x)
	fmt.Println(x)
	kvq.FWHT(x)
	fmt.Println(x)
	// Output:
	// [2 2 2 2]
	// [4 0 0 0]
}

// Clip a row at the value below which 75% of the magnitudes lie.
func ExampleClip() {
	x := []float32{0.1, -0.2, 0.3, -9, 0.5, 0.6, -0.7, 0.8}
	tau := kvq.Clip(x, 0.75) // sorted |x|[6] = 0.8
	fmt.Println(tau, x)
	// Output: 0.8 [0.1 -0.2 0.3 -0.8 0.5 0.6 -0.7 0.8]
}
