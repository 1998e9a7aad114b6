package weights

import (
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/runtime/kernels"
)

// BenchmarkRTN quantizes a 4096×4096 layer (4-bit, group 128, asymmetric);
// SetBytes counts float32 input weights, so MB/s is input throughput.
func BenchmarkRTN(b *testing.B) {
	rows, cols := 4096, 4096
	w := randMatrix(rand.New(rand.NewPCG(1, 1)), rows, cols)
	b.SetBytes(int64(4 * rows * cols))
	b.ResetTimer()
	for b.Loop() {
		if _, err := QuantizeRTN(w, rows, cols, Options{Bits: 4, GroupSize: 128}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*cols)*float64(b.N)/b.Elapsed().Seconds(), "weights/s")
}

// BenchmarkGPTQ quantizes a 4096×4096 layer (4-bit, group 128, block 128)
// with a Hessian from 1024 correlated input rows; the Hessian is built
// outside the timer. Reports seconds per layer and weights/s.
func BenchmarkGPTQ(b *testing.B) {
	rows, cols, n := 4096, 4096, 1024
	rng := rand.New(rand.NewPCG(2, 2))
	w := randMatrix(rng, rows, cols)
	X := make([]float32, n*cols)
	for i := range X {
		X[i] = float32(rng.NormFloat64())
	}
	for r := 0; r < n; r++ { // neighbouring inputs correlated
		for c := 1; c < cols; c++ {
			X[r*cols+c] = 0.7*X[r*cols+c-1] + 0.3*X[r*cols+c]
		}
	}
	h := NewHessian(cols)
	if err := h.Add(X, n); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(4 * rows * cols))
	b.ResetTimer()
	for b.Loop() {
		if _, err := QuantizeGPTQ(w, rows, cols, h, GPTQOptions{Options: Options{Bits: 4, GroupSize: 128}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/layer")
	b.ReportMetric(float64(rows*cols)*float64(b.N)/b.Elapsed().Seconds(), "weights/s")
}

// BenchmarkInvCholUpperT factors the damped inverse of a 2048-wide
// Hessian (float64, blocked Cholesky + triangular inverse on GOMAXPROCS
// threads). Reports GFLOP/s counting 2n³/3 flops.
func BenchmarkInvCholUpperT(b *testing.B) {
	n := 2048
	rng := rand.New(rand.NewPCG(3, 3))
	A := make([]float64, n*n)
	for i := range A {
		A[i] = rng.NormFloat64()
	}
	H := make([]float64, n*n) // AAᵀ/n + I
	subMulNT(n, n, n, A, n, A, n, H, n)
	for i := range H {
		H[i] /= -float64(n)
	}
	for i := 0; i < n; i++ {
		H[i*n+i]++
	}
	pool := kernels.NewPool(0)
	defer pool.Close()
	work := make([]float64, n*n)
	b.ResetTimer()
	for b.Loop() {
		copy(work, H)
		if _, err := invCholUpperT(work, n, pool); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(2*float64(n)*float64(n)*float64(n)/3*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkHessianAdd accumulates 1024 input rows of width 4096 into a
// Hessian (float64, upper triangle, GOMAXPROCS threads); SetBytes counts
// the float32 inputs.
func BenchmarkHessianAdd(b *testing.B) {
	n, cols := 1024, 4096
	x := randMatrix(rand.New(rand.NewPCG(4, 4)), n, cols)
	h := NewHessian(cols)
	b.SetBytes(int64(4 * n * cols))
	for b.Loop() {
		if err := h.Add(x, n); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n)*float64(cols)*float64(cols)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
