package kernels

import (
	"fmt"
	"math"
	"testing"
)

// rowsCase runs MatMulNTRows on [m,k]·[n,k]ᵀ and checks it against the
// float64 reference, then checks that every row and every column range
// computed on its own, and the pool's split on 2 and 3 threads, give the
// same bits.
func rowsCase(t *testing.T, seed uint64, m, n, k, padX, padW, padY int) {
	t.Helper()
	r := newRand(seed)
	ldx, ldw, ldy := k+padX, k+padW, n+padY
	x := guarded(t, (m-1)*ldx+k)
	w := guarded(t, (n-1)*ldw+k)
	y := guarded(t, (m-1)*ldy+n)
	fillRand(r, x)
	fillRand(r, w)
	fill(y, sentinel)
	what := fmt.Sprintf("MatMulNTRows m=%d n=%d k=%d ld=(%d,%d,%d)", m, n, k, ldx, ldw, ldy)
	MatMulNTRows(m, n, k, x, ldx, w, ldw, y, ldy)
	ref, mag := refNT(m, n, k, x, ldx, w, ldw)
	checkMatResult(t, what, m, n, y, ldy, ref, mag)
	same := func(how string, i, j int, got float32) {
		t.Helper()
		if want := y[i*ldy+j]; math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("%s: %s: y[%d,%d] = %v, want %v (the full product's)", what, how, i, j, got, want)
		}
	}
	one := make([]float32, n)
	for i := 0; i < m; i++ {
		MatMulNTRows(1, n, k, x[i*ldx:], ldx, w, ldw, one, n)
		for j := range one {
			same("row alone", i, j, one[j])
		}
	}
	// Column ranges [j0, j1) of every row block [i0, i1).
	for _, cut := range [][2]int{{0, 1}, {1, min(3, n)}, {n / 2, n}, {n - 1, n}} {
		for _, rows := range [][2]int{{0, m}, {m / 2, m}, {m - 1, m}} {
			j0, j1, i0, i1 := cut[0], cut[1], rows[0], rows[1]
			if j1 <= j0 || i1 <= i0 {
				continue
			}
			part := make([]float32, (i1-i0)*(j1-j0))
			MatMulNTRows(i1-i0, j1-j0, k, x[i0*ldx:], ldx, w[j0*ldw:], ldw, part, j1-j0)
			for i := i0; i < i1; i++ {
				for j := j0; j < j1; j++ {
					same(fmt.Sprintf("rows [%d,%d) columns [%d,%d)", i0, i1, j0, j1), i, j, part[(i-i0)*(j1-j0)+j-j0])
				}
			}
		}
	}
	for _, th := range []int{2, 3} {
		p := NewPool(th)
		got := make([]float32, m*n)
		p.MatMulNTRows(m, n, k, x, ldx, w, ldw, got, n)
		p.Close()
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				same(fmt.Sprintf("pool of %d threads", th), i, j, got[i*n+j])
			}
		}
	}
}

func TestMatMulNTRowsSmall(t *testing.T) {
	ms := []int{1, 2, 3, 4, 5, 7, 9}
	ns := []int{1, 2, 3, 4, 5, 7, 11, 13}
	ks := []int{1, 5, 8, 9, 16, 17, 33, 65}
	bothPaths(t, func(t *testing.T) {
		seed := uint64(7)
		for _, m := range ms {
			for _, n := range ns {
				for _, k := range ks {
					seed++
					rowsCase(t, seed, m, n, k, int(seed%3), int(seed/3%3), int(seed/9%3))
				}
			}
		}
	})
}

func TestMatMulNTRowsLarge(t *testing.T) {
	cases := []struct{ m, n, k int }{
		{1, 1408, 512},  // decode gate/up
		{5, 513, 1408},  // two k slices, n a multiple of 3
		{6, 514, 1541},  // k slices of 770 and 771 with masked tails, n%3 = 1
		{17, 260, 2000}, // three k slices, n%3 = 2, several L2 blocks
		{64, 130, 97},   // many rows, short k with a tail
	}
	bothPaths(t, func(t *testing.T) {
		for i, c := range cases {
			rowsCase(t, uint64(300+i), c.m, c.n, c.k, i%2*5, i%3, 7*(i%2))
		}
	})
}

// TestMatMulNTNotRowIndependent documents why MatMulNTRows exists: the
// plain MatMulNT sums a row alone (GEMV) in another order than the same
// row inside a 4-row tile, so its bits depend on the batch.
func TestMatMulNTNotRowIndependent(t *testing.T) {
	if !hasAsm {
		t.Skip("no assembly kernels: the portable MatMulNT happens to be row-independent")
	}
	setAsm(t, true)
	r := newRand(9)
	const m, n, k = 4, 64, 512
	x, w := randSlice(r, m*k), randSlice(r, n*k)
	y, one := make([]float32, m*n), make([]float32, n)
	MatMulNT(m, n, k, x, k, w, k, y, n)
	MatMulNT(1, n, k, x, k, w, k, one, n)
	diff := 0
	for j := range one {
		if one[j] != y[j] {
			diff++
		}
	}
	if diff == 0 {
		t.Fatalf("MatMulNT's row 0 alone equals it in a 4-row product in all %d columns: the premise of MatMulNTRows is gone", n)
	}
}
