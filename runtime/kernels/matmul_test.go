package kernels

import (
	"fmt"
	"math"
	"testing"
)

// ntCase runs MatMulNT on an [m,k]·[n,k]ᵀ product with the given row
// paddings and checks it against the float64 reference. The operands are
// allocated with guarded so that any access past their last element faults.
func ntCase(t *testing.T, seed uint64, m, n, k, padX, padW, padY int) {
	t.Helper()
	r := newRand(seed)
	ldx, ldw, ldy := k+padX, k+padW, n+padY
	x := guarded(t, (m-1)*ldx+k)
	w := guarded(t, (n-1)*ldw+k)
	y := guarded(t, (m-1)*ldy+n)
	fillRand(r, x)
	fillRand(r, w)
	fill(y, sentinel)
	MatMulNT(m, n, k, x, ldx, w, ldw, y, ldy)
	ref, mag := refNT(m, n, k, x, ldx, w, ldw)
	checkMatResult(t, fmt.Sprintf("MatMulNT m=%d n=%d k=%d ld=(%d,%d,%d)", m, n, k, ldx, ldw, ldy), m, n, y, ldy, ref, mag)
}

func TestMatMulNTSmall(t *testing.T) {
	ms := []int{1, 2, 3, 4, 5, 7, 8, 9, 13}
	ns := []int{1, 2, 3, 4, 5, 6, 7, 11, 12, 13}
	ks := []int{1, 2, 5, 7, 8, 9, 15, 16, 17, 24, 31, 33, 64, 65}
	bothPaths(t, func(t *testing.T) {
		seed := uint64(1)
		for _, m := range ms {
			for _, n := range ns {
				for _, k := range ks {
					seed++
					ntCase(t, seed, m, n, k, int(seed%3), int(seed/3%3), int(seed/9%3))
				}
			}
		}
	})
}

func TestMatMulNTLarge(t *testing.T) {
	cases := []struct{ m, n, k int }{
		{1, 1408, 512},  // decode GEMV, gate/up
		{1, 513, 1408},  // decode GEMV, n not a multiple of 4
		{2, 67, 300},    // m below the 4-row tile
		{64, 300, 700},  // several L2 blocks of w (k=700: 93 rows each)
		{37, 130, 1408}, // down projection's k, odd m and n
		{12, 1000, 97},  // many tiles, short k with a tail
		{128, 128, 64},  // attention scores Q·Kᵀ with head_dim 64
		{9, 14, 1541},   // k cut into slices of 770 and 771: masked tails that accumulate
		{8, 6, 2000},    // three k slices
	}
	bothPaths(t, func(t *testing.T) {
		for i, c := range cases {
			ntCase(t, uint64(100+i), c.m, c.n, c.k, i%2*5, i%3, 7*(i%2))
		}
	})
}

// TestMatMulNTPathsAgree compares the assembly and Go paths directly on the
// model's prefill shapes (scaled down in m).
func TestMatMulNTPathsAgree(t *testing.T) {
	if !hasAsm {
		t.Skip("no assembly kernels in this build or CPU")
	}
	r := newRand(7)
	for _, c := range []struct{ m, n, k int }{{16, 512, 512}, {16, 128, 512}, {8, 1408, 512}, {8, 512, 1408}, {1, 1408, 512}} {
		x := randSlice(r, c.m*c.k)
		w := randSlice(r, c.n*c.k)
		ya := make([]float32, c.m*c.n)
		yg := make([]float32, c.m*c.n)
		setAsm(t, true)
		MatMulNT(c.m, c.n, c.k, x, c.k, w, c.k, ya, c.n)
		useAsm = false
		MatMulNT(c.m, c.n, c.k, x, c.k, w, c.k, yg, c.n)
		_, mag := refNT(c.m, c.n, c.k, x, c.k, w, c.k)
		for i := range ya {
			if d := math.Abs(float64(ya[i]) - float64(yg[i])); d > 2*matTol*mag[i] {
				t.Fatalf("m=%d n=%d k=%d: element %d: asm %v, go %v", c.m, c.n, c.k, i, ya[i], yg[i])
			}
		}
	}
}

func TestMatMulNTZeroK(t *testing.T) {
	bothPaths(t, func(t *testing.T) {
		y := []float32{1, 2, sentinel, 3, 4, sentinel}
		MatMulNT(2, 2, 0, nil, 0, nil, 0, y, 3)
		want := []float32{0, 0, sentinel, 0, 0, sentinel}
		for i := range y {
			if y[i] != want[i] {
				t.Fatalf("k=0: y = %v, want %v", y, want)
			}
		}
		MatMulNT(0, 5, 5, nil, 5, nil, 5, nil, 5) // empty: no panic, no access
	})
}

func nnCase(t *testing.T, seed uint64, m, n, k, padX, padW, padY int) {
	t.Helper()
	r := newRand(seed)
	ldx, ldw, ldy := k+padX, n+padW, n+padY
	x := guarded(t, (m-1)*ldx+k)
	w := guarded(t, (k-1)*ldw+n)
	y := guarded(t, (m-1)*ldy+n)
	fillRand(r, x)
	fillRand(r, w)
	fill(y, sentinel)
	MatMulNN(m, n, k, x, ldx, w, ldw, y, ldy)
	ref, mag := refNN(m, n, k, x, ldx, w, ldw)
	checkMatResult(t, fmt.Sprintf("MatMulNN m=%d n=%d k=%d ld=(%d,%d,%d)", m, n, k, ldx, ldw, ldy), m, n, y, ldy, ref, mag)
}

func TestMatMulNN(t *testing.T) {
	ms := []int{1, 2, 5, 6, 7, 12, 13}
	ns := []int{1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 64, 65, 128}
	ks := []int{1, 2, 7, 8, 33, 130}
	bothPaths(t, func(t *testing.T) {
		seed := uint64(1000)
		for _, m := range ms {
			for _, n := range ns {
				for _, k := range ks {
					seed++
					nnCase(t, seed, m, n, k, int(seed%3), int(seed/3%3), int(seed/9%3))
				}
			}
		}
		// Attention P·V: 64 queries over 512 keys, head_dim 64, V rows
		// interleaved with a second KV head (ldw = 128).
		nnCase(t, 2000, 64, 64, 512, 0, 64, 0)
	})
}

func TestMatMulPanics(t *testing.T) {
	x := make([]float32, 12)
	w := make([]float32, 12)
	y := make([]float32, 9)
	mustPanic(t, "len(x)=12", func() { MatMulNT(3, 3, 5, x, 5, w, 4, y, 3) })
	mustPanic(t, "ldw=3 < 4", func() { MatMulNT(3, 3, 4, x, 4, w, 3, y, 3) })
	mustPanic(t, "len(y)=9", func() { MatMulNT(3, 3, 4, x, 4, w, 4, y, 4) })
	mustPanic(t, "negative", func() { MatMulNT(-1, 3, 4, x, 4, w, 4, y, 3) })
	mustPanic(t, "MatMulNN: len(w)=12", func() { MatMulNN(2, 3, 5, x, 5, w, 3, y, 3) })
}
