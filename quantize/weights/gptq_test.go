package weights

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// correlatedX returns n×cols inputs X = Z·A with per-column scales
// exp(skew·u), u ∈ [−1, 1], so inputs are correlated and (skew > 0)
// unevenly sized.
func correlatedX(rng *rand.Rand, n, cols int, skew float64) []float32 {
	A := make([]float64, cols*cols)
	for i := range A {
		A[i] = rng.NormFloat64() / math.Sqrt(float64(cols))
	}
	for i := 0; i < cols; i++ {
		A[i*cols+i] += 1
	}
	sc := make([]float64, cols)
	for j := range sc {
		sc[j] = math.Exp(skew * (2*rng.Float64() - 1))
	}
	X := make([]float32, n*cols)
	z := make([]float64, cols)
	for r := 0; r < n; r++ {
		for k := range z {
			z[k] = rng.NormFloat64()
		}
		for j := 0; j < cols; j++ {
			s := 0.0
			for k := 0; k < cols; k++ {
				s += z[k] * A[k*cols+j]
			}
			X[r*cols+j] = float32(s * sc[j])
		}
	}
	return X
}

// outErr returns ‖X Wᵀ − X Ŵᵀ‖² computed directly in float64.
func outErr(X []float32, n int, w []float32, q *Quantized) float64 {
	rows, cols := q.Rows, q.Cols
	deq := make([]float32, rows*cols)
	q.Dequantize(deq)
	tot := 0.0
	for i := 0; i < n; i++ {
		x := X[i*cols : (i+1)*cols]
		for r := 0; r < rows; r++ {
			s := 0.0
			for c := 0; c < cols; c++ {
				s += float64(x[c]) * (float64(w[r*cols+c]) - float64(deq[r*cols+c]))
			}
			tot += s * s
		}
	}
	return tot
}

func hessianOf(t testing.TB, X []float32, n, cols int) *Hessian {
	h := NewHessian(cols)
	// Two batches, to exercise accumulation.
	if err := h.Add(X[:n/3*cols], n/3); err != nil {
		t.Fatal(err)
	}
	if err := h.Add(X[n/3*cols:], n-n/3); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestHessianMatchesDirect(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	n, cols := 700, 24
	X := correlatedX(rng, n, cols, 0.5)
	H := hessianOf(t, X, n, cols).Matrix()
	for i := 0; i < cols; i++ {
		for j := 0; j < cols; j++ {
			s := 0.0
			for r := 0; r < n; r++ {
				s += float64(X[r*cols+i]) * float64(X[r*cols+j])
			}
			want := 2 * s / float64(n)
			if math.Abs(H[i*cols+j]-want) > 1e-9*math.Max(1, math.Abs(want)) {
				t.Fatalf("H[%d,%d] = %g, want 2XᵀX/n = %g", i, j, H[i*cols+j], want)
			}
		}
	}
}

func TestGPTQBeatsRTN(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	rows, cols, n := 64, 128, 1024
	X := correlatedX(rng, n, cols, 0.5)
	w := randMatrix(rng, rows, cols)
	h := hessianOf(t, X, n, cols)
	for _, g := range []int{0, 32} {
		for _, bits := range []int{4, 3, 2} {
			opt := Options{Bits: bits, GroupSize: g}
			qr, err := QuantizeRTN(w, rows, cols, opt)
			if err != nil {
				t.Fatal(err)
			}
			qg, err := QuantizeGPTQ(w, rows, cols, h, GPTQOptions{Options: opt})
			if err != nil {
				t.Fatal(err)
			}
			er, eg := outErr(X, n, w, qr), outErr(X, n, w, qg)
			t.Logf("bits %d group %3d: output error RTN %.4g GPTQ %.4g (ratio %.3f)", bits, g, er, eg, eg/er)
			if !(eg < er) {
				t.Errorf("bits %d group %d: GPTQ error %g not below RTN %g", bits, g, eg, er)
			}
		}
	}
}

func TestGPTQIdentityIsRTN(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	rows, cols := 32, 128
	w := randMatrix(rng, rows, cols)
	I := make([]float64, cols*cols)
	for i := 0; i < cols; i++ {
		I[i*cols+i] = 1
	}
	h, err := NewHessianFromMatrix(cols, I)
	if err != nil {
		t.Fatal(err)
	}
	for _, bits := range []int{2, 3, 4, 8} {
		for _, g := range []int{0, 32, 128} {
			for _, sym := range []bool{false, true} {
				opt := Options{Bits: bits, GroupSize: g, Symmetric: sym}
				qr, _ := QuantizeRTN(w, rows, cols, opt)
				qg, err := QuantizeGPTQ(w, rows, cols, h, GPTQOptions{Options: opt, BlockSize: 32})
				if err != nil {
					t.Fatal(err)
				}
				if string(qr.Codes) != string(qg.Codes) || !eq16(qr.Scales, qg.Scales) || !eq16(qr.Zeros, qg.Zeros) {
					t.Errorf("bits %d group %d sym %v: GPTQ with H = I differs from RTN", bits, g, sym)
				}
			}
		}
	}
}

func eq16(a, b []uint16) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestGPTQActOrder(t *testing.T) {
	rows, cols, n := 48, 128, 768
	var sumPlain, sumAct float64
	for seed := uint64(0); seed < 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		X := correlatedX(rng, n, cols, 2.0) // input scales spread over e^±2
		w := randMatrix(rng, rows, cols)
		h := hessianOf(t, X, n, cols)
		for _, g := range []int{0, 32} {
			opt := Options{Bits: 3, GroupSize: g}
			qp, err := QuantizeGPTQ(w, rows, cols, h, GPTQOptions{Options: opt})
			if err != nil {
				t.Fatal(err)
			}
			qa, err := QuantizeGPTQ(w, rows, cols, h, GPTQOptions{Options: opt, ActOrder: true})
			if err != nil {
				t.Fatal(err)
			}
			if (g == 0) != (qa.Perm == nil) {
				t.Fatalf("group %d: Perm nil = %v", g, qa.Perm == nil)
			}
			if g != 0 { // groups in permuted order: Perm must be a permutation
				seen := make([]bool, cols)
				for _, p := range qa.Perm {
					seen[p] = true
				}
				for c, s := range seen {
					if !s {
						t.Fatalf("Perm misses column %d", c)
					}
				}
			}
			ep, ea := outErr(X, n, w, qp), outErr(X, n, w, qa)
			t.Logf("seed %d group %3d: 3-bit output error plain %.4g act-order %.4g", seed, g, ep, ea)
			sumPlain += ep
			sumAct += ea
		}
	}
	t.Logf("mean ratio act-order/plain: %.3f", sumAct/sumPlain)
	if sumAct > sumPlain {
		t.Errorf("act-order total error %g above plain %g", sumAct, sumPlain)
	}
}

func TestGPTQDeadColumn(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	rows, cols, n := 8, 64, 200
	X := correlatedX(rng, n, cols, 0)
	for r := 0; r < n; r++ {
		X[r*cols+5] = 0 // input 5 never active
	}
	w := randMatrix(rng, rows, cols)
	q, err := QuantizeGPTQ(w, rows, cols, hessianOf(t, X, n, cols), GPTQOptions{Options: Options{Bits: 4, GroupSize: 32}, ActOrder: true})
	if err != nil {
		t.Fatal(err)
	}
	deq := make([]float32, rows*cols)
	q.Dequantize(deq)
	for r := 0; r < rows; r++ {
		if deq[r*cols+5] != 0 {
			t.Errorf("dead column row %d dequantizes to %g, want 0", r, deq[r*cols+5])
		}
	}
}

func TestGPTQErrors(t *testing.T) {
	cols := 32
	w := make([]float32, 2*cols)
	neg := make([]float64, cols*cols)
	for i := 0; i < cols; i++ {
		neg[i*cols+i] = -1
	}
	hneg, _ := NewHessianFromMatrix(cols, neg)
	_, err := QuantizeGPTQ(w, 2, cols, hneg, GPTQOptions{Options: Options{Bits: 4}})
	if !errors.Is(err, ErrNotPositiveDefinite) {
		t.Errorf("negative definite H: got %v", err)
	}
	_, err = QuantizeGPTQ(w, 2, cols, NewHessian(16), GPTQOptions{Options: Options{Bits: 4}})
	if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "width 16, want cols 32") {
		t.Errorf("width mismatch: got %v", err)
	}
	_, err = QuantizeGPTQ(w, 2, cols, NewHessian(cols), GPTQOptions{Options: Options{Bits: 4}})
	if !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "no samples") {
		t.Errorf("empty H: got %v", err)
	}
	_, err = QuantizeGPTQ(w, 2, cols, hneg, GPTQOptions{Options: Options{Bits: 4}, Damp: -1})
	if !errors.Is(err, ErrOptions) {
		t.Errorf("negative damp: got %v", err)
	}
	x := make([]float32, 3*cols)
	x[2*cols+4] = float32(math.Inf(1))
	if err := NewHessian(cols).Add(x, 3); !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), "input [2, 4] is +Inf") {
		t.Errorf("Inf input: got %v", err)
	}
	if _, err := NewHessianFromMatrix(cols, neg[:5]); !errors.Is(err, ErrShape) {
		t.Errorf("short matrix: got %v", err)
	}
}
