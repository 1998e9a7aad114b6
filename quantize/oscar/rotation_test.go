package oscar

import (
	"errors"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

// hadamard is an independent H_d: H[i][j] = (−1)^popcount(i&j)/√d.
func hadamard(d int) []float64 {
	h := make([]float64, d*d)
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			h[i*d+j] = 1 / math.Sqrt(float64(d))
			if bits.OnesCount(uint(i&j))%2 == 1 {
				h[i*d+j] = -h[i*d+j]
			}
		}
	}
	return h
}

// bitrev reverses the log2(d) low bits of i.
func bitrev(i, d int) int {
	r := 0
	for b := 1; b < d; b <<= 1 {
		r <<= 1
		if i&b != 0 {
			r |= 1
		}
	}
	return r
}

// randOrthogonal returns a seeded random orthogonal [d, d] matrix (modified
// Gram–Schmidt on Gaussian columns).
func randOrthogonal(r *rand.Rand, d int) []float64 {
	q := make([]float64, d*d)
	for i := range q {
		q[i] = r.NormFloat64()
	}
	for c := 0; c < d; c++ {
		for p := 0; p < c; p++ {
			var dot float64
			for a := 0; a < d; a++ {
				dot += q[a*d+c] * q[a*d+p]
			}
			for a := 0; a < d; a++ {
				q[a*d+c] -= dot * q[a*d+p]
			}
		}
		var n float64
		for a := 0; a < d; a++ {
			n += q[a*d+c] * q[a*d+c]
		}
		n = math.Sqrt(n)
		for a := 0; a < d; a++ {
			q[a*d+c] /= n
		}
	}
	return q
}

// covariance returns Q·diag(lam)·Qᵀ.
func covariance(q, lam []float64) []float64 {
	d := len(lam)
	c := make([]float64, d*d)
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			for k := 0; k < d; k++ {
				c[i*d+j] += q[i*d+k] * lam[k] * q[j*d+k]
			}
		}
	}
	return c
}

func matmul(a, b []float64, d int) []float64 {
	c := make([]float64, d*d)
	for i := 0; i < d; i++ {
		for k := 0; k < d; k++ {
			for j := 0; j < d; j++ {
				c[i*d+j] += a[i*d+k] * b[k*d+j]
			}
		}
	}
	return c
}

func transpose(a []float64, d int) []float64 {
	t := make([]float64, d*d)
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			t[j*d+i] = a[i*d+j]
		}
	}
	return t
}

// spectrum returns d distinct, shuffled, heavy-tailed eigenvalues (like a
// real C_Q: a few directions dominate).
func spectrum(r *rand.Rand, d int) []float64 {
	lam := make([]float64, d)
	for i := range lam {
		lam[i] = 100*math.Exp(-float64(i)/2) + 0.01*float64(i+1)
	}
	r.Shuffle(d, func(i, j int) { lam[i], lam[j] = lam[j], lam[i] })
	return lam
}

// TestRotation: for random covariances with a known spectrum, R is
// orthogonal to 1e-10, the eigenvalues come back in descending order,
// U = R·P_brᵀ·H holds eigenvectors (C·u_i = λ_i·u_i), and Rᵀ·C·R has every
// diagonal element equal to trace(C)/d (the Hadamard spreads importance),
// which the eigenbasis alone does not.
func TestRotation(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, d := range []int{1, 2, 4, 8, 16, 64, 128} {
		lam := spectrum(r, d)
		c := covariance(randOrthogonal(r, d), lam)
		R, ev, err := Rotation(c, d)
		if err != nil {
			t.Fatalf("d=%d: %v", d, err)
		}
		if e := Orthogonality(R, d); e > 1e-10 {
			t.Errorf("d=%d: max|RRᵀ−I| = %.3g", d, e)
		}
		want := slices.Clone(lam)
		slices.SortFunc(want, func(a, b float64) int { return -cmpF(a, b) })
		for i := range want {
			if math.Abs(ev[i]-want[i]) > 1e-10*want[0] {
				t.Errorf("d=%d: eigenvalue %d = %.12g, want %.12g", d, i, ev[i], want[i])
			}
		}
		// U[:, m] = Σ_i R[:, br(i)]·H[i][m].
		h := hadamard(d)
		m := make([]float64, d*d)
		for a := 0; a < d; a++ {
			for i := 0; i < d; i++ {
				m[a*d+i] = R[a*d+bitrev(i, d)]
			}
		}
		u := matmul(m, h, d)
		cu := matmul(c, u, d)
		var worst float64
		for a := 0; a < d; a++ {
			for i := 0; i < d; i++ {
				worst = max(worst, math.Abs(cu[a*d+i]-ev[i]*u[a*d+i]))
			}
		}
		if worst > 1e-9*want[0] {
			t.Errorf("d=%d: max|C·u_i − λ_i·u_i| = %.3g", d, worst)
		}
		// Equalised diagonal.
		rcr := matmul(transpose(R, d), matmul(c, R, d), d)
		var tr float64
		for _, x := range lam {
			tr += x
		}
		var spread float64
		for j := 0; j < d; j++ {
			spread = max(spread, math.Abs(rcr[j*d+j]-tr/float64(d)))
		}
		if spread > 1e-10*tr {
			t.Errorf("d=%d: diag(RᵀCR) deviates from trace/d = %.6g by %.3g", d, tr/float64(d), spread)
		}
		if d > 1 {
			ucu := matmul(transpose(u, d), cu, d)
			if math.Abs(ucu[0]-ucu[(d-1)*d+d-1]) < 1 {
				t.Errorf("d=%d: the eigenbasis alone already has an equal diagonal; the test proves nothing", d)
			}
		}
	}
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// TestBitReversalPlacement: for a diagonal covariance the eigenvectors are
// unit vectors, so R is fully predictable: with k_i the coordinate of the
// i-th largest variance, R[k_i][bitreverse(j)] = H[i][j].
func TestBitReversalPlacement(t *testing.T) {
	d := 8
	lam := []float64{3, 50, 0.5, 7, 20, 1, 9, 0.1}
	c := make([]float64, d*d)
	for i, x := range lam {
		c[i*d+i] = x
	}
	R, ev, err := Rotation(c, d)
	if err != nil {
		t.Fatal(err)
	}
	k := []int{1, 4, 6, 3, 0, 5, 2, 7} // coordinates by decreasing variance
	h := hadamard(d)
	if want := []int{0, 4, 2, 6, 1, 5, 3, 7}; !slices.Equal([]int{bitrev(0, 8), bitrev(1, 8), bitrev(2, 8), bitrev(3, 8), bitrev(4, 8), bitrev(5, 8), bitrev(6, 8), bitrev(7, 8)}, want) {
		t.Fatal("test's bitrev is wrong")
	}
	for i := 0; i < d; i++ {
		if ev[i] != lam[k[i]] {
			t.Errorf("eigenvalue %d = %g, want %g", i, ev[i], lam[k[i]])
		}
		for j := 0; j < d; j++ {
			if got := R[k[i]*d+bitrev(j, d)]; math.Abs(got-h[i*d+j]) > 1e-12 {
				t.Errorf("R[%d][%d] = %.6g, want H[%d][%d] = %.6g", k[i], bitrev(j, d), got, i, j, h[i*d+j])
			}
		}
	}
}

// TestReferenceConvention rebuilds R the way compute_kv_rotation.py does
// (eigh's ascending eigenvectors, perm[br[i]] = argsort(λ, desc)[i],
// P = I[:, perm], R = U·H·P) and checks that it equals Rotation's
// construction with eigenvector m's sign flipped by (−1)^popcount(m), up to
// the column signs (−1)^(log2 d + popcount(i)) at column br(i): the doc
// comment's argument that the two differ only in signs.
func TestReferenceConvention(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for _, d := range []int{4, 8, 32} {
		c := covariance(randOrthogonal(r, d), spectrum(r, d))
		R, _, err := Rotation(c, d)
		if err != nil {
			t.Fatal(err)
		}
		h := hadamard(d)
		m := make([]float64, d*d)
		for a := 0; a < d; a++ {
			for i := 0; i < d; i++ {
				m[a*d+i] = R[a*d+bitrev(i, d)]
			}
		}
		u := matmul(m, h, d) // descending eigenvectors
		// Reference.
		uasc := make([]float64, d*d)
		for a := 0; a < d; a++ {
			for k := 0; k < d; k++ {
				uasc[a*d+k] = u[a*d+d-1-k]
			}
		}
		sortedIdx := make([]int, d) // argsort of ascending values, descending
		for i := range sortedIdx {
			sortedIdx[i] = d - 1 - i
		}
		perm := make([]int, d)
		for i := 0; i < d; i++ {
			perm[bitrev(i, d)] = sortedIdx[i]
		}
		uh := matmul(uasc, h, d)
		ref := make([]float64, d*d)
		for a := 0; a < d; a++ {
			for col := 0; col < d; col++ {
				ref[a*d+col] = uh[a*d+perm[col]]
			}
		}
		// Rotation's construction with flipped eigenvector signs.
		n := bits.TrailingZeros(uint(d))
		for i := 0; i < d; i++ {
			sign := 1.0
			if (n+bits.OnesCount(uint(i)))%2 == 1 {
				sign = -1
			}
			col := bitrev(i, d)
			for a := 0; a < d; a++ {
				var s float64
				for mm := 0; mm < d; mm++ {
					f := 1.0
					if bits.OnesCount(uint(mm))%2 == 1 {
						f = -1
					}
					s += u[a*d+mm] * f * h[mm*d+i]
				}
				if math.Abs(ref[a*d+col]-sign*s) > 1e-12 {
					t.Fatalf("d=%d: reference R[%d][%d] = %.9g, want %.9g", d, a, col, ref[a*d+col], sign*s)
				}
			}
		}
	}
}

func TestRotationErrors(t *testing.T) {
	nan := make([]float64, 16)
	nan[6] = math.NaN()
	for _, c := range []struct {
		name string
		cov  []float64
		d    int
	}{
		{"nan", nan, 4},
		{"inf", []float64{1, 0, 0, math.Inf(1)}, 2},
		{"short", make([]float64, 15), 4},
		{"not a power of two", make([]float64, 36), 6},
		{"zero", nil, 0},
		{"all-zero covariance", make([]float64, 64), 8},
		{"negative diagonal", []float64{1, 0, 0, -1e6}, 2},
		{"asymmetric", []float64{1, 1e6, 0, 1}, 2},
	} {
		if _, _, err := Rotation(c.cov, c.d); !errors.Is(err, ErrBadCovariance) {
			t.Errorf("%s: %v, want ErrBadCovariance", c.name, err)
		}
	}
	// A rank-one covariance is valid (zero eigenvalues): R is orthogonal.
	cov := make([]float64, 64)
	cov[0] = 2
	R, ev, err := Rotation(cov, 8)
	if err != nil || Orthogonality(R, 8) > 1e-12 || ev[0] != 2 || ev[7] != 0 {
		t.Errorf("rank-one covariance: %v, eigenvalues %v", err, ev)
	}
}
