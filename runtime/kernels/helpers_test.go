package kernels

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// bothPaths runs f once on the portable Go kernels and, where this build and
// CPU have them, once on the AVX2+FMA assembly. Tests that call it must not
// run in parallel: the switch is a package variable.
func bothPaths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	t.Run("go", func(t *testing.T) {
		setAsm(t, false)
		f(t)
	})
	if !hasAsm {
		t.Log("no assembly kernels in this build or CPU; only the Go path ran")
		return
	}
	t.Run("asm", func(t *testing.T) {
		setAsm(t, true)
		f(t)
	})
}

func setAsm(tb testing.TB, on bool) {
	old := useAsm
	useAsm = on
	tb.Cleanup(func() { useAsm = old })
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x6c6d7061636b)) }

// randSlice returns n values uniform in [-1, 1).
func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	fillRand(r, s)
	return s
}

func fillRand(r *rand.Rand, s []float32) {
	for i := range s {
		s[i] = float32(2*r.Float64() - 1)
	}
}

// sentinel marks elements a kernel must not write.
const sentinel = float32(-12345.5)

func fill(s []float32, v float32) {
	for i := range s {
		s[i] = v
	}
}

// refNT returns the float64 reference of y = x·wᵀ and, per element, the sum
// of |x·w| terms that scales the permitted float32 rounding error.
func refNT(m, n, k int, x []float32, ldx int, w []float32, ldw int) (ref, mag []float64) {
	ref = make([]float64, m*n)
	mag = make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, a float64
			for p := 0; p < k; p++ {
				v := float64(x[i*ldx+p]) * float64(w[j*ldw+p])
				s += v
				a += math.Abs(v)
			}
			ref[i*n+j], mag[i*n+j] = s, a
		}
	}
	return
}

// refNN is refNT for y = x·w with w [k,n].
func refNN(m, n, k int, x []float32, ldx int, w []float32, ldw int) (ref, mag []float64) {
	ref = make([]float64, m*n)
	mag = make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s, a float64
			for p := 0; p < k; p++ {
				v := float64(x[i*ldx+p]) * float64(w[p*ldw+j])
				s += v
				a += math.Abs(v)
			}
			ref[i*n+j], mag[i*n+j] = s, a
		}
	}
	return
}

// matTol is the permitted error of one float32 dot product relative to the
// sum of its term magnitudes: reordered float32 summation of up to ~1500
// terms stays far inside it for random data (see the package tests).
const matTol = 1e-5

// checkMatResult compares y ([m,n] at leading dimension ldy) with ref and
// checks that the padding columns of y still hold the sentinel.
func checkMatResult(t *testing.T, what string, m, n int, y []float32, ldy int, ref, mag []float64) {
	t.Helper()
	bad := 0
	for i := 0; i < m; i++ {
		for j := 0; j < ldy && i*ldy+j < len(y); j++ {
			got := y[i*ldy+j]
			if j >= n {
				if got != sentinel {
					t.Fatalf("%s: y[%d,%d] (padding) = %v, was overwritten", what, i, j, got)
				}
				continue
			}
			want := ref[i*n+j]
			if d := math.Abs(float64(got) - want); !(d <= matTol*mag[i*n+j]+1e-30) {
				bad++
				if bad <= 3 {
					t.Errorf("%s: y[%d,%d] = %v, want %v (|err| %.3g > %.3g)", what, i, j, got, want, d, matTol*mag[i*n+j])
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d wrong elements", what, bad)
	}
}

// mustPanic asserts that f panics with a message starting "kernels: " and
// containing want.
func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic, want one mentioning %q", want)
		}
		msg, ok := r.(string)
		if !ok || !strings.HasPrefix(msg, "kernels: ") || !strings.Contains(msg, want) {
			t.Fatalf("panic %v, want a kernels: message mentioning %q", r, want)
		}
	}()
	f()
}
