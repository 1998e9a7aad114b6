package weights

import (
	"errors"
	"fmt"
	"math"
	"sort"

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
