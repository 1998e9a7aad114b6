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

// Hessian accumulates the GPTQ proxy Hessian of one Linear layer from its
// calibration inputs: H = (2/N)·Σ x xᵀ over all N input rows x seen, the
// normalization of the GPTQ reference (running mean of 2XᵀX). Storage is
// float64 [cols, cols]. Memory: 8·cols² bytes. The scale of H does not
// change GPTQ's result (damping is relative to the mean diagonal).
type Hessian struct {
	cols int
	n    int64     // input rows accumulated
	sum  []float64 // Σ x xᵀ, upper triangle valid, [cols, cols]
}

// NewHessian returns an empty accumulator for inputs of width cols (the
// layer's in_features). It panics if cols ≤ 0 (a programmer error).
func NewHessian(cols int) *Hessian {
	if cols <= 0 {
		panic("weights: NewHessian: cols must be positive")
	}
	return &Hessian{cols: cols, sum: make([]float64, cols*cols)}
}

// NewHessianFromMatrix wraps an already computed Hessian h, [cols, cols]
// float64 row-major (e.g. one stored by calibration); it is copied and
// must be symmetric (only the upper triangle is read). Matrix returns h.
// Errors: ErrShape, ErrNonFinite.
func NewHessianFromMatrix(cols int, h []float64) (*Hessian, error) {
	if cols <= 0 || len(h) != cols*cols {
		return nil, fmt.Errorf("%w: Hessian has %d elements, want %d×%d", ErrShape, len(h), cols, cols)
	}
	for i, v := range h {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: Hessian [%d, %d] is %v", ErrNonFinite, i/cols, i%cols, v)
		}
	}
	// Matrix() = 2·sum/n, so n = 2 gives back h.
	return &Hessian{cols: cols, n: 2, sum: append([]float64(nil), h...)}, nil
}

// Cols returns the input width.
func (h *Hessian) Cols() int { return h.cols }

// Samples returns the number of input rows accumulated.
func (h *Hessian) Samples() int64 { return h.n }

// Add accumulates n input rows x, [n, cols] float32 row-major (the
// activations entering the layer, one token per row).
// Errors: ErrShape, ErrNonFinite naming the element [row, col].
func (h *Hessian) Add(x []float32, n int) error {
	if n < 0 || len(x) != n*h.cols {
		return fmt.Errorf("%w: input has %d elements, want n×cols = %d×%d", ErrShape, len(x), n, h.cols)
	}
	const chunk = 256
	buf := make([]float64, min(n, chunk)*h.cols)
	for r0 := 0; r0 < n; r0 += chunk {
		m := min(chunk, n-r0)
		for i, v := range x[r0*h.cols : (r0+m)*h.cols] {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("%w: input [%d, %d] is %v", ErrNonFinite, r0+i/h.cols, i%h.cols, v)
			}
			buf[i] = float64(v)
		}
		blas64.Syrk(blas.Trans, 1,
			blas64.General{Rows: m, Cols: h.cols, Stride: h.cols, Data: buf[:m*h.cols]}, 1,
			blas64.Symmetric{Uplo: blas.Upper, N: h.cols, Stride: h.cols, Data: h.sum})
	}
	h.n += int64(n)
	return nil
}

// Matrix returns a new copy of H = (2/N)·Σ x xᵀ, [cols, cols] float64
// row-major, full symmetric. With no samples it is all zeros.
func (h *Hessian) Matrix() []float64 {
	c := h.cols
	out := make([]float64, c*c)
	if h.n == 0 {
		return out
	}
	f := 2 / float64(h.n)
	for i := 0; i < c; i++ {
		for j := i; j < c; j++ {
			v := f * h.sum[i*c+j]
			out[i*c+j], out[j*c+i] = v, v
		}
	}
	return out
}

// GPTQOptions configures QuantizeGPTQ.
type GPTQOptions struct {
	Options
	// Damp is the relative damping λ: H += λ·mean(diag H)·I. 0 means the
	// default 0.01; negative is an error.
	Damp float64
	// ActOrder quantizes columns in order of decreasing H_ii.
	ActOrder bool
	// BlockSize is the lazy-batch width B (default 128 when 0). When
	// groups are narrower than a row it is rounded up to a multiple of
	// the group size, so a group never crosses a block boundary and its
	// scales are computed on weights that carry all earlier updates.
	BlockSize int
}

// QuantizeGPTQ quantizes w, [rows, cols] float32 row-major (Linear weight
// [out, in]), with GPTQ (Frantar et al., arXiv 2210.17323, Algorithm 1;
// METHODS.md §7) on the grid of opt.Options, using the input Hessian h of
// width cols. Steps:
//
//  1. Dead inputs (H_ii = 0): H_ii = 1 and w[:, i] = 0, as in the
//     reference implementation.
//  2. ActOrder: columns sorted by decreasing H_ii (stable).
//  3. H += Damp·mean(diag H)·I; U = upper Cholesky factor of H⁻¹
//     (H⁻¹ = UᵀU).
//  4. Columns in order, in blocks of BlockSize: when a group starts, its
//     scale/zero are found per row (as QuantizeRTN does) on the current,
//     error-updated weights; each column is rounded, its error
//     e = (w − q)/U_cc is fed back into the rest of the block, and after a
//     block the trailing columns get the batched update W −= E·U[block, rest].
//
// With ActOrder and several groups per row, codes and groups stay in the
// quantization (permuted) order and Perm maps them back (see Quantized);
// with per-channel groups the codes are un-permuted and Perm is nil.
// Differences from the reference: arithmetic is float64, rounding ties go
// to even, scales are float16 rounded up (see QuantizeRTN), and group
// parameters see the in-block updates (the reference reads them from the
// matrix before the current block's updates).
//
// Memory: 8·rows·cols (weights) + 3·8·cols² (Hessian, factors) bytes.
// Errors: as QuantizeRTN, plus ErrShape (Hessian width, no samples),
// ErrOptions (Damp, BlockSize), ErrNonFinite, ErrNotPositiveDefinite.
func QuantizeGPTQ(w []float32, rows, cols int, h *Hessian, opt GPTQOptions) (*Quantized, error) {
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
	U, err := invCholUpper(H, cols)
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

// invCholUpper returns U, [n, n] row-major upper triangular with
// H⁻¹ = UᵀU, for symmetric positive definite H [n, n].
func invCholUpper(H []float64, n int) ([]float64, error) {
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
