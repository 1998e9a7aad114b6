package kvq

import (
	"fmt"
	"math"
	"math/bits"
)

// isPow2 reports whether n is a positive power of two.
func isPow2(n int) bool { return n > 0 && n&(n-1) == 0 }

// FWHT applies the normalized fast Walsh–Hadamard transform to x in place:
// x ← x·H_d with H_d = HadamardMatrix(d), d = len(x) (H_d is symmetric, so
// this is also H_d·x). Entries of H_d are ±1/√d, so the transform is
// orthogonal and its own inverse: FWHT(FWHT(x)) = x up to rounding.
// Butterflies are computed in float32; cost d·log2(d) additions.
//
// It panics unless len(x) is a power of two (a kernel precondition: the
// caller chose d).
func FWHT(x []float32) {
	d := len(x)
	if !isPow2(d) {
		panic(fmt.Sprintf("kvq: FWHT: length %d is not a power of two", d))
	}
	h := 1
	if d >= 4 {
		// The first two stages on groups of four.
		for i := 0; i+4 <= d; i += 4 {
			g := x[i : i+4 : i+4]
			a, b := g[0]+g[1], g[0]-g[1]
			c, e := g[2]+g[3], g[2]-g[3]
			g[0], g[1], g[2], g[3] = a+c, b+e, a-c, b-e
		}
		h = 4
	}
	for ; h < d; h <<= 1 {
		for i := 0; i < d; i += h << 1 {
			a := x[i : i+h : i+h]
			b := x[i+h : i+2*h : i+2*h]
			b = b[:len(a)]
			for j := range a {
				u, v := a[j], b[j]
				a[j], b[j] = u+v, u-v
			}
		}
	}
	s := float32(1 / math.Sqrt(float64(d)))
	for i := range x {
		x[i] *= s
	}
}

// FWHT64 is FWHT on float64 data (calibration-time rotations). It panics
// unless len(x) is a power of two.
func FWHT64(x []float64) {
	d := len(x)
	if !isPow2(d) {
		panic(fmt.Sprintf("kvq: FWHT64: length %d is not a power of two", d))
	}
	for h := 1; h < d; h <<= 1 {
		for i := 0; i < d; i += h << 1 {
			a, b := x[i:i+h], x[i+h:i+2*h]
			for j := range a {
				u, v := a[j], b[j]
				a[j], b[j] = u+v, u-v
			}
		}
	}
	s := 1 / math.Sqrt(float64(d))
	for i := range x {
		x[i] *= s
	}
}

// HadamardMatrix returns the normalized Walsh–Hadamard matrix H_d as a
// [d, d] row-major float64 slice, in Sylvester order:
//
//	H_1 = [1],  H_{2n} = [[H_n, H_n], [H_n, −H_n]],  then scaled by 1/√d,
//
// so H[i][j] = (−1)^popcount(i AND j) / √d. H is symmetric and orthogonal
// (H·Hᵀ = I). It panics unless d is a power of two.
func HadamardMatrix(d int) []float64 {
	if !isPow2(d) {
		panic(fmt.Sprintf("kvq: HadamardMatrix: size %d is not a power of two", d))
	}
	s := 1 / math.Sqrt(float64(d))
	h := make([]float64, d*d)
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			if bits.OnesCount(uint(i&j))&1 == 1 {
				h[i*d+j] = -s
			} else {
				h[i*d+j] = s
			}
		}
	}
	return h
}

// BitReversal returns the bit-reversal permutation of size d: perm[i] is i
// with its log2(d) low bits reversed (d = 8: [0 4 2 6 1 5 3 7]). It is an
// involution (perm[perm[i]] = i). OSCAR (docs/METHODS.md §1) places the i-th
// largest eigen-direction at position perm[i]. It panics unless d is a
// power of two.
func BitReversal(d int) []int {
	if !isPow2(d) {
		panic(fmt.Sprintf("kvq: BitReversal: size %d is not a power of two", d))
	}
	n := bits.TrailingZeros(uint(d))
	p := make([]int, d)
	for i := range p {
		if n == 0 {
			p[i] = 0
			continue
		}
		p[i] = int(bits.Reverse(uint(i)) >> (bits.UintSize - n))
	}
	return p
}
