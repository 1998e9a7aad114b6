package weights

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/runtime/kernels"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
	"gonum.org/v1/gonum/mat"
)

// quantizeGPTQRef is the straightforward float64 GPTQ (the implementation
// before the float32 fast path), kept as the oracle for
// TestGPTQMatchesReference: W and every update in float64, H⁻¹'s upper
// Cholesky factor from factor → invert → factor again.
func quantizeGPTQRef(w []float32, rows, cols int, h *Hessian, opt GPTQOptions) (*Quantized, error) {
	group, err := validate(w, rows, cols, opt.Options)
	if err != nil {
		return nil, err
	}
	if h == nil || h.cols != cols {
		got := 0
		if h != nil {
			got = h.cols
		}
		return nil, fmt.Errorf("%w: Hessian width %d, want cols %d", ErrShape, got, cols)
	}
	if h.n == 0 {
		return nil, fmt.Errorf("%w: Hessian has no samples", ErrShape)
	}
	damp := opt.Damp
	if damp == 0 {
		damp = 0.01
	}
	if damp < 0 || math.IsNaN(damp) || math.IsInf(damp, 0) {
		return nil, fmt.Errorf("%w: damp %v, want ≥ 0", ErrOptions, opt.Damp)
	}
	bs := opt.BlockSize
	if bs == 0 {
		bs = 128
	}
	if bs < 0 {
		return nil, fmt.Errorf("%w: block size %d, want > 0", ErrOptions, bs)
	}
	if group < cols {
		bs = (bs + group - 1) / group * group
	}

	H := h.Matrix()
	for i, v := range H {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: Hessian [%d, %d] is %v", ErrNonFinite, i/cols, i%cols, v)
		}
	}
	W := make([]float64, rows*cols)
	for i, v := range w {
		W[i] = float64(v)
	}
	for i := 0; i < cols; i++ {
		if H[i*cols+i] == 0 {
			H[i*cols+i] = 1
			for r := 0; r < rows; r++ {
				W[r*cols+i] = 0
			}
		}
	}

	var perm []int
	if opt.ActOrder {
		perm = make([]int, cols)
		for i := range perm {
			perm[i] = i
		}
		sort.SliceStable(perm, func(a, b int) bool { return H[perm[a]*cols+perm[a]] > H[perm[b]*cols+perm[b]] })
		Hp := make([]float64, cols*cols)
		for i, pi := range perm {
			for j, pj := range perm {
				Hp[i*cols+j] = H[pi*cols+pj]
			}
		}
		H = Hp
		tmp := make([]float64, cols)
		for r := 0; r < rows; r++ {
			row := W[r*cols : (r+1)*cols]
			for j, pj := range perm {
				tmp[j] = row[pj]
			}
			copy(row, tmp)
		}
	}

	mean := 0.0
	for i := 0; i < cols; i++ {
		mean += H[i*cols+i]
	}
	mean /= float64(cols)
	for i := 0; i < cols; i++ {
		H[i*cols+i] += damp * mean
	}
	U, err := invCholUpperRef(H, cols)
	if err != nil {
		return nil, err
	}
	H = nil

	q := newQuantized(rows, cols, group, opt.Options)
	rb := RowBytes(cols, opt.Bits)
	grids := make([]grid, rows)
	errs := make([]float64, rows*bs)
	for i1 := 0; i1 < cols; i1 += bs {
		i2 := min(i1+bs, cols)
		nb := i2 - i1
		for c := i1; c < i2; c++ {
			if c%group == 0 {
				for r := 0; r < rows; r++ {
					seg := W[r*cols+c : r*cols+c+group]
					gr, err := findGrid(func(f func(float64)) {
						for _, v := range seg {
							f(v)
						}
					}, opt.Bits, opt.Symmetric, opt.MSEClip)
					if err != nil {
						return nil, fmt.Errorf("weights: row %d group %d: %w", r, c/group, err)
					}
					grids[r] = gr
					q.setGrid(r, c/group, gr)
				}
			}
			d := U[c*cols+c]
			urow := U[c*cols+c+1 : c*cols+i2]
			for r := 0; r < rows; r++ {
				wr := W[r*cols : (r+1)*cols]
				code := grids[r].code(wr[c])
				putCode(q.Codes[r*rb:(r+1)*rb], c, opt.Bits, code)
				e := (wr[c] - grids[r].value(code)) / d
				errs[r*nb+(c-i1)] = e
				rest := wr[c+1 : i2]
				for k, u := range urow {
					rest[k] -= e * u
				}
			}
		}
		if i2 < cols {
			blas64.Gemm(blas.NoTrans, blas.NoTrans, -1,
				blas64.General{Rows: rows, Cols: nb, Stride: nb, Data: errs[:rows*nb]},
				blas64.General{Rows: nb, Cols: cols - i2, Stride: cols, Data: U[i1*cols+i2:]},
				1,
				blas64.General{Rows: rows, Cols: cols - i2, Stride: cols, Data: W[i2:]})
		}
	}

	if perm != nil {
		if group == cols {
			codes := make([]uint8, cols)
			for r := 0; r < rows; r++ {
				row := q.Codes[r*rb : (r+1)*rb]
				for j, pj := range perm {
					codes[pj] = getCode(row, j, opt.Bits)
				}
				PackRow(row, codes, opt.Bits)
			}
		} else {
			q.Perm = make([]int32, cols)
			for j, pj := range perm {
				q.Perm[j] = int32(pj)
			}
		}
	}
	return q, nil
}

// invCholUpperRef returns U, [n, n] row-major upper triangular with
// H⁻¹ = UᵀU, by factorizing H, inverting it and factorizing the inverse.
func invCholUpperRef(H []float64, n int) ([]float64, error) {
	var c mat.Cholesky
	if !c.Factorize(mat.NewSymDense(n, H)) {
		return nil, fmt.Errorf("%w: Cholesky of the damped Hessian failed", ErrNotPositiveDefinite)
	}
	var inv mat.SymDense
	// A mat.Condition error only warns of ill-conditioning; the inverse is
	// still computed, and the second factorization decides.
	var cond mat.Condition
	if err := c.InverseTo(&inv); err != nil && !errors.As(err, &cond) {
		return nil, fmt.Errorf("%w: inverting the damped Hessian: %v", ErrNotPositiveDefinite, err)
	}
	var c2 mat.Cholesky
	if !c2.Factorize(&inv) {
		return nil, fmt.Errorf("%w: Cholesky of the inverse Hessian failed", ErrNotPositiveDefinite)
	}
	var u mat.TriDense
	c2.UTo(&u)
	raw := u.RawTriangular()
	U := make([]float64, n*n)
	for i := 0; i < n; i++ {
		copy(U[i*n+i:(i+1)*n], raw.Data[i*raw.Stride+i:i*raw.Stride+n])
	}
	return U, nil
}

// TestInvCholUpperTMatchesGonum compares the blocked, pooled factor with
// gonum's factor → invert → factor on SPD matrices whose sizes are not
// multiples of the block or tile, on 1 and 2 threads.
func TestInvCholUpperTMatchesGonum(t *testing.T) {
	for _, n := range []int{1, 5, 64, 203, 300} {
		rng := rand.New(rand.NewPCG(uint64(n), 3))
		X := correlatedX(rng, 2*n+8, n, 1)
		H := hessianOf(t, X, 2*n+8, n).Matrix()
		for i := 0; i < n; i++ {
			H[i*n+i] += 0.01
		}
		want, err := invCholUpperRef(append([]float64(nil), H...), n)
		if err != nil {
			t.Fatal(err)
		}
		for _, threads := range []int{1, 2} {
			pool := kernels.NewPool(threads)
			got, err := invCholUpperT(append([]float64(nil), H...), n, pool)
			pool.Close()
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for i := 0; i < n; i++ {
				scale := math.Abs(want[i*n+i])
				for j := 0; j < n; j++ {
					worst = math.Max(worst, math.Abs(got[j*n+i]-want[i*n+j])/scale)
				}
			}
			if worst > 1e-9 {
				t.Errorf("n %d threads %d: max |ΔU_ij|/U_ii = %.3g, want ≤ 1e-9", n, threads, worst)
			}
		}
	}
	pool := kernels.NewPool(2)
	defer pool.Close()
	bad := []float64{1, 2, 2, 1} // eigenvalues 3, −1
	if _, err := invCholUpperT(bad, 2, pool); !errors.Is(err, ErrNotPositiveDefinite) {
		t.Errorf("indefinite H: got %v, want ErrNotPositiveDefinite", err)
	}
}

// TestGPTQMatchesReference runs the float32 fast path and the float64
// reference on random 64×256 problems (plain, act-order, per-channel,
// 1 to 4 bits, MSE clipping, 2 threads; 1 thread must give the same), and on a 520×256 one whose
// rows split into uneven chunks over the threads. The two round the same values except where
// float32 rounding moves a weight across a decision boundary, so at most
// 0.5% of codes may differ; in rows where no code differs, scales may
// differ by one float16 step and dequantized weights by 0.02 grid steps;
// and the output errors ‖X(W − Ŵ)ᵀ‖² must agree within 0.1%.
func TestGPTQMatchesReference(t *testing.T) {
	cols, n := 256, 1024
	rng := rand.New(rand.NewPCG(21, 22))
	X := correlatedX(rng, n, cols, 1)
	h := hessianOf(t, X, n, cols)
	w64 := randMatrix(rng, 64, cols)
	w520 := randMatrix(rng, 520, cols)
	for _, tc := range []struct {
		rows int
		w    []float32
		o    GPTQOptions
	}{
		{64, w64, GPTQOptions{Options: Options{Bits: 4, GroupSize: 128}}},
		{64, w64, GPTQOptions{Options: Options{Bits: 3, GroupSize: 32}, ActOrder: true}},
		{64, w64, GPTQOptions{Options: Options{Bits: 4}, ActOrder: true}},
		{64, w64, GPTQOptions{Options: Options{Bits: 2, GroupSize: 64, MSEClip: true}, BlockSize: 64}},
		{64, w64, GPTQOptions{Options: Options{Bits: 1, GroupSize: 64}}},
		{520, w520, GPTQOptions{Options: Options{Bits: 4, GroupSize: 32, Symmetric: true}}},
	} {
		rows, w, o := tc.rows, tc.w, tc.o
		o.Threads = 2
		got, err := QuantizeGPTQ(w, rows, cols, h, o)
		if err != nil {
			t.Fatal(err)
		}
		want, err := quantizeGPTQRef(w, rows, cols, h, o)
		if err != nil {
			t.Fatal(err)
		}
		o1 := o
		o1.Threads = 1
		one, err := QuantizeGPTQ(w, rows, cols, h, o1)
		if err != nil {
			t.Fatal(err)
		}
		if string(one.Codes) != string(got.Codes) || !eq16(one.Scales, got.Scales) || !eq16(one.Zeros, got.Zeros) {
			t.Errorf("%+v: result on 1 thread differs from 2 threads", o)
		}
		if (got.Perm == nil) != (want.Perm == nil) {
			t.Fatalf("%+v: Perm nil %v, reference %v", o, got.Perm == nil, want.Perm == nil)
		}
		for i := range got.Perm {
			if got.Perm[i] != want.Perm[i] {
				t.Fatalf("%+v: Perm[%d] = %d, reference %d", o, i, got.Perm[i], want.Perm[i])
			}
		}
		dg, dw := make([]float32, rows*cols), make([]float32, rows*cols)
		got.Dequantize(dg)
		want.Dequantize(dw)
		rb := RowBytes(cols, o.Bits)
		diff, flipRows := 0, 0 // codes that differ, rows with one
		flipped := make([]bool, rows)
		for r := 0; r < rows; r++ {
			for c := 0; c < cols; c++ {
				if getCode(got.Codes[r*rb:], c, o.Bits) != getCode(want.Codes[r*rb:], c, o.Bits) {
					diff++
					flipped[r] = true
				}
			}
			if flipped[r] {
				flipRows++
			}
		}
		// In a row without a flipped code only the float16 rounding of a
		// group's scale can differ (by one float16 step, moving a value
		// by ≤ 2^-10·|q − z| steps); after a flip GPTQ feeds a different
		// error forward, so the rest of that row may differ further.
		ng := cols / got.GroupSize
		for i, sc := range got.Scales {
			a, b := f16ToFloat(sc), f16ToFloat(want.Scales[i])
			if !flipped[i/ng] && math.Abs(a-b) > b/512 {
				t.Errorf("%+v: scale %d is %g, reference %g: more than a float16 step apart in a row without flipped codes", o, i, a, b)
			}
		}
		worst := 0.0
		for r := 0; r < rows; r++ {
			if flipped[r] {
				continue
			}
			for c := 0; c < cols; c++ {
				gi := c / got.GroupSize
				if got.Perm != nil { // the group of column c in quantization order
					for j, p := range got.Perm {
						if int(p) == c {
							gi = j / got.GroupSize
						}
					}
				}
				step := f16ToFloat(want.Scales[r*ng+gi])
				worst = math.Max(worst, math.Abs(float64(dg[r*cols+c]-dw[r*cols+c]))/step)
			}
		}
		eg, ew := outErr(X, n, w, got), outErr(X, n, w, want)
		frac := float64(diff) / float64(rows*cols)
		t.Logf("%+v: %d of %d codes differ (%.3f%%, in %d of %d rows); other rows differ by ≤ %.4f steps; output error %.6g vs reference %.6g",
			o, diff, rows*cols, 100*frac, flipRows, rows, worst, eg, ew)
		if frac > 0.005 {
			t.Errorf("%+v: %.3f%% of codes differ from the reference, want ≤ 0.5%%", o, 100*frac)
		}
		if worst > 0.02 {
			t.Errorf("%+v: a dequantized weight in a row without flipped codes differs by %.4f grid steps, want ≤ 0.02", o, worst)
		}
		if math.Abs(eg-ew) > 0.001*ew {
			t.Errorf("%+v: output error %g vs reference %g, want within 0.1%%", o, eg, ew)
		}
	}
}

// TestHessianAddRejectsWhole checks that an input with a non-finite
// element leaves the accumulator unchanged, even when the bad element is
// in a later 256-row chunk than good ones.
func TestHessianAddRejectsWhole(t *testing.T) {
	cols, n := 8, 300
	x := make([]float32, n*cols)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	x[290*cols+3] = float32(math.NaN())
	h := NewHessian(cols)
	if err := h.Add(x, n); !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), "input [290, 3]") {
		t.Fatalf("got %v, want ErrNonFinite naming input [290, 3]", err)
	}
	if h.Samples() != 0 {
		t.Errorf("Samples = %d after a rejected Add, want 0", h.Samples())
	}
	for i, v := range h.Matrix() {
		if v != 0 {
			t.Fatalf("H[%d] = %g after a rejected Add, want 0", i, v)
		}
	}
}
