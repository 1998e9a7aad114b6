package kvq

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

// sylvester builds the unnormalized Hadamard matrix of size d by the
// recursion H_{2n} = [[H,H],[H,−H]], independently of HadamardMatrix.
func sylvester(d int) [][]float64 {
	h := [][]float64{{1}}
	for len(h) < d {
		n := len(h)
		g := make([][]float64, 2*n)
		for i := range g {
			g[i] = make([]float64, 2*n)
		}
		for i := 0; i < n; i++ {
			for j := 0; j < n; j++ {
				g[i][j], g[i][j+n], g[i+n][j], g[i+n][j+n] = h[i][j], h[i][j], h[i][j], -h[i][j]
			}
		}
		h = g
	}
	return h
}

var pow2Sizes = []int{1, 2, 4, 8, 16, 64, 128, 256}

func TestHadamardMatrixIsSylvester(t *testing.T) {
	for _, d := range pow2Sizes {
		h := HadamardMatrix(d)
		ref := sylvester(d)
		s := 1 / math.Sqrt(float64(d))
		for i := 0; i < d; i++ {
			for j := 0; j < d; j++ {
				if got, want := h[i*d+j], ref[i][j]*s; got != want {
					t.Fatalf("d=%d H[%d][%d]=%v, want %v", d, i, j, got, want)
				}
			}
		}
	}
}

func TestHadamardMatrixOrthogonal(t *testing.T) {
	for _, d := range pow2Sizes {
		h := HadamardMatrix(d)
		var worst float64
		for i := 0; i < d; i++ {
			for j := 0; j < d; j++ {
				var s float64
				for k := 0; k < d; k++ {
					s += h[i*d+k] * h[j*d+k]
				}
				if i == j {
					s--
				}
				worst = max(worst, math.Abs(s))
			}
		}
		if worst >= 1e-12 {
			t.Errorf("d=%d: max|HHᵀ−I| = %g, want < 1e-12", d, worst)
		}
	}
}

func TestFWHTMatchesMatrix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, d := range pow2Sizes {
		ref := sylvester(d)
		s := 1 / math.Sqrt(float64(d))
		x := make([]float64, d)
		for i := range x {
			x[i] = rng.NormFloat64()
		}
		want := make([]float64, d) // x·H
		for j := 0; j < d; j++ {
			for i := 0; i < d; i++ {
				want[j] += x[i] * ref[i][j] * s
			}
		}
		x32 := make([]float32, d)
		for i := range x {
			x32[i] = float32(x[i])
		}
		x64 := slices.Clone(x)
		FWHT(x32)
		FWHT64(x64)
		for j := range want {
			if e := math.Abs(float64(x32[j]) - want[j]); e > 1e-5*(1+math.Abs(want[j])) {
				t.Errorf("d=%d FWHT[%d]=%v, want %v", d, j, x32[j], want[j])
			}
			if e := math.Abs(x64[j] - want[j]); e > 1e-12 {
				t.Errorf("d=%d FWHT64[%d]=%v, want %v", d, j, x64[j], want[j])
			}
		}
	}
}

func TestFWHTInvolution(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, d := range pow2Sizes {
		x := make([]float32, d)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * 3)
		}
		y := slices.Clone(x)
		FWHT(y)
		FWHT(y)
		for i := range x {
			if math.Abs(float64(y[i]-x[i])) > 1e-5 {
				t.Fatalf("d=%d: FWHT∘FWHT[%d]=%v, want %v", d, i, y[i], x[i])
			}
		}
	}
}

func mustPanic(t *testing.T, name string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", name)
		}
	}()
	f()
}

func TestNotPowerOfTwoPanics(t *testing.T) {
	for _, d := range []int{0, 3, 6, 12, 100} {
		mustPanic(t, fmt.Sprint("FWHT ", d), func() { FWHT(make([]float32, d)) })
		mustPanic(t, fmt.Sprint("FWHT64 ", d), func() { FWHT64(make([]float64, d)) })
		mustPanic(t, fmt.Sprint("HadamardMatrix ", d), func() { HadamardMatrix(d) })
		mustPanic(t, fmt.Sprint("BitReversal ", d), func() { BitReversal(d) })
	}
}

func TestBitReversal(t *testing.T) {
	if got, want := BitReversal(8), []int{0, 4, 2, 6, 1, 5, 3, 7}; !slices.Equal(got, want) {
		t.Fatalf("BitReversal(8) = %v, want %v", got, want)
	}
	if got := BitReversal(1); !slices.Equal(got, []int{0}) {
		t.Fatalf("BitReversal(1) = %v", got)
	}
	for _, d := range pow2Sizes[1:] {
		p := BitReversal(d)
		nb := len(strconv.FormatInt(int64(d-1), 2))
		for i := range p {
			// Reverse the zero-padded binary string of i.
			s := []byte(fmt.Sprintf("%0*b", nb, i))
			slices.Reverse(s)
			want, _ := strconv.ParseInt(string(s), 2, 64)
			if p[i] != int(want) {
				t.Fatalf("d=%d perm[%d]=%d, want %d", d, i, p[i], want)
			}
			if p[p[i]] != i {
				t.Fatalf("d=%d: not an involution at %d", d, i)
			}
		}
	}
}

func BenchmarkFWHT(b *testing.B) {
	for _, d := range []int{64, 128} {
		b.Run(fmt.Sprint("d=", d), func(b *testing.B) {
			x := make([]float32, d)
			for i := range x {
				x[i] = float32(i%7) - 3
			}
			b.SetBytes(int64(4 * d))
			for b.Loop() {
				FWHT(x)
			}
		})
	}
}
