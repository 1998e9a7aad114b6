package weights

import (
	"fmt"
	"math"
	goruntime "runtime"
	"sort"

	"github.com/lmpack/lmpack/runtime/kernels"
)

// Hessian accumulates the GPTQ proxy Hessian of one Linear layer from its
// calibration inputs: H = (2/N)·Σ x xᵀ over all N input rows x seen, the
// normalization of the GPTQ reference (running mean of 2XᵀX). Storage is
// float64 [cols, cols]. Memory: 8·cols² bytes. The scale of H does not
// change GPTQ's result (damping is relative to the mean diagonal).
type Hessian struct {
	cols int
	n    int64     // input rows accumulated
	sum  []float64 // Σ x xᵀ, [cols, cols]; only the upper triangle is valid
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
// activations entering the layer, one token per row), in float64 on
// GOMAXPROCS threads (an AVX2 float64 kernel where available). x is
// checked before anything is accumulated, so on error h is unchanged.
// Errors: ErrShape, ErrNonFinite naming the element [row, col].
func (h *Hessian) Add(x []float32, n int) error {
	if n < 0 || len(x) != n*h.cols {
		return fmt.Errorf("%w: input has %d elements, want n×cols = %d×%d", ErrShape, len(x), n, h.cols)
	}
	for i, v := range x {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: input [%d, %d] is %v", ErrNonFinite, i/h.cols, i%h.cols, v)
		}
	}
	if n == 0 {
		return nil
	}
	const chunk = 256
	cols := h.cols
	t := &syrkTask{sum: h.sum, cols: cols, tiles: (cols + cholTile - 1) / cholTile}
	t.xt = make([]float64, min(n, chunk)*cols)
	t.nxt = make([]float64, len(t.xt))
	pool := kernels.NewPool(goruntime.GOMAXPROCS(0))
	defer pool.Close()
	for r0 := 0; r0 < n; r0 += chunk {
		m := min(chunk, n-r0)
		t.m = m
		// xt = chunkᵀ, [cols, m], so the products below are dot products.
		const tile = 32
		for c0 := 0; c0 < cols; c0 += tile {
			for q0 := 0; q0 < m; q0 += tile {
				for c := c0; c < min(c0+tile, cols); c++ {
					for q := q0; q < min(q0+tile, m); q++ {
						v := float64(x[(r0+q)*cols+c])
						t.xt[c*m+q] = v
						t.nxt[c*m+q] = -v
					}
				}
			}
		}
		pool.Run((t.tiles+1)/2, t)
	}
	h.n += int64(n)
	return nil
}

// syrkTask adds xtᵀ·xt's upper triangle to sum ([cols, cols]) for row
// tiles of cholTile rows, pairing tiles u and tiles−1−u per unit so the
// shares of the triangle are even. nxt = −xt, since subMulNT subtracts.
type syrkTask struct {
	xt, nxt, sum   []float64
	cols, m, tiles int
}

func (t *syrkTask) Run(lo, hi int) {
	for u := lo; u < hi; u++ {
		t.tile(u)
		if v := t.tiles - 1 - u; v != u {
			t.tile(v)
		}
	}
}

func (t *syrkTask) tile(v int) {
	c, m := t.cols, t.m
	i0 := v * cholTile
	i1 := min(c, i0+cholTile)
	// Columns from i0: the diagonal tile's few j < i land in the unused
	// lower triangle.
	subMulNT(i1-i0, c-i0, m, t.nxt[i0*m:], m, t.xt[i0*m:], m, t.sum[i0*c+i0:], c)
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
	const tile = 32 // mirror in tiles so the transposed writes stay in cache
	for i0 := 0; i0 < c; i0 += tile {
		for j0 := i0; j0 < c; j0 += tile {
			for i := i0; i < min(i0+tile, c); i++ {
				for j := max(i, j0); j < min(j0+tile, c); j++ {
					v := f * h.sum[i*c+j]
					out[i*c+j], out[j*c+i] = v, v
				}
			}
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
	// Threads is the number of threads the quantization runs on
	// (0 means GOMAXPROCS; negative is an error). The result does not
	// depend on it.
	Threads int
}

// QuantizeGPTQ quantizes w, [rows, cols] float32 row-major (Linear weight
// [out, in]), with GPTQ (Frantar et al., arXiv 2210.17323, Algorithm 1;
// docs/METHODS.md §7) on the grid of opt.Options, using the input Hessian h of
// width cols. Steps:
//
//  1. Dead inputs (H_ii = 0): H_ii = 1 and w[:, i] = 0, as in the
//     reference implementation.
//  2. ActOrder: columns sorted by decreasing H_ii (stable).
//  3. H += Damp·mean(diag H)·I; U = upper Cholesky factor of H⁻¹
//     (H⁻¹ = UᵀU), in float64.
//  4. Columns in order, in blocks of BlockSize: when a group starts, its
//     scale/zero are found per row (as QuantizeRTN does) on the current,
//     error-updated weights; each column is rounded, its error
//     e = (w − q)/U_cc is fed back into the rest of the block, and after a
//     block the trailing columns get the batched update W −= E·U[block, rest].
//
// As in the GPTQ reference, the weights, errors and U used in the updates
// of step 4 are float32 (the batched update runs on the runtime/kernels
// AVX2 GEMM); codes, scales and errors are computed in float64 from them.
// Rows are split over opt.Threads threads within a block, and the batched
// update over the trailing columns.
//
// With ActOrder and several groups per row, codes and groups stay in the
// quantization (permuted) order and Perm maps them back (see Quantized);
// with per-channel groups the codes are un-permuted and Perm is nil.
// Other differences from the reference: rounding ties go to even, scales
// are float16 rounded up (see QuantizeRTN), and group parameters see the
// in-block updates (the reference reads them from the matrix before the
// current block's updates).
//
// Memory: 4·rows·cols (float32 weights, transposed) plus at most
// 16·cols² bytes for the factors (the float64 Hessian copy and the
// inverse while it is formed; then Uᵀ in float64 and float32, 12·cols²).
// Errors: as QuantizeRTN, plus ErrShape (Hessian width, no samples),
// ErrOptions (Damp, BlockSize, Threads), ErrNonFinite,
// ErrNotPositiveDefinite.
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
	bs = min(bs, cols)
	threads := opt.Threads
	if threads < 0 {
		return nil, fmt.Errorf("%w: threads %d, want ≥ 0", ErrOptions, threads)
	}
	if threads == 0 {
		threads = goruntime.GOMAXPROCS(0)
	}

	H := h.Matrix()
	for i, v := range H {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: Hessian [%d, %d] is %v", ErrNonFinite, i/cols, i%cols, v)
		}
	}
	dead := make([]bool, cols)
	for i := 0; i < cols; i++ {
		if H[i*cols+i] == 0 {
			H[i*cols+i] = 1
			dead[i] = true
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
	}

	mean := 0.0
	for i := 0; i < cols; i++ {
		mean += H[i*cols+i]
	}
	mean /= float64(cols)
	for i := 0; i < cols; i++ {
		H[i*cols+i] += damp * mean
	}
	pool := kernels.NewPool(threads)
	defer pool.Close()
	Ut, err := invCholUpperT(H, cols, pool)
	if err != nil {
		return nil, err
	}
	H = nil
	g := &gptqRun{rows: rows, cols: cols, group: group, bs: bs, opt: opt.Options, ut: Ut,
		q: newQuantized(rows, cols, group, opt.Options), rb: RowBytes(cols, opt.Bits)}
	g.prepare(w, perm, dead)
	for g.i1 = 0; g.i1 < cols; g.i1 += bs {
		g.i2 = min(g.i1+bs, cols)
		g.nb = g.i2 - g.i1
		for a := 0; a < g.nb; a++ {
			for b := a; b < g.nb; b++ {
				g.ub[a*g.nb+b] = float32(Ut[(g.i1+b)*cols+g.i1+a])
			}
		}
		pool.Run(len(g.errs), (*gptqBlock)(g))
		for _, err := range g.errs {
			if err != nil {
				return nil, err
			}
		}
		if g.i2 < cols {
			pool.Run((cols-g.i2+updateRows-1)/updateRows, (*gptqUpdate)(g))
		}
	}

	q := g.q
	if perm != nil {
		rb := g.rb
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

// Tiles of the batched update: updateRows trailing columns (rows of the
// transposed weights) by updateCols weight rows per MatMulNT call, so the
// error tile (updateCols·B float32) and the product stay in L2.
const (
	updateRows = 64
	updateCols = 256
	// blockRows is how many weight rows a thread carries through one
	// block at a time, so its B columns (blockRows·B float32) stay in L2.
	blockRows = 256
)

// gptqRun is the state of one QuantizeGPTQ call. Weights are held
// transposed, wt [cols, rows] float32 in quantization order, so a column
// is contiguous and the in-block updates are axpys over rows.
type gptqRun struct {
	rows, cols, group, bs int
	opt                   Options
	q                     *Quantized
	rb                    int
	ut                    []float64 // Uᵀ, [cols, cols] (lower); H⁻¹ = UᵀU
	lt                    []float32 // Uᵀ, [cols, cols] float32 (lower)
	wt                    []float32 // [cols, rows]
	e                     []float32 // the block's errors, [B, rows]
	et                    []float32 // the same transposed, [rows, B]
	ub                    []float32 // U[block, block], [B, B]
	grids                 []grid    // current group of each row
	errs                  []error   // per row chunk of the current block
	i1, i2, nb            int       // current block
}

// prepare fills wt (permuted, dead columns zeroed), lt and the buffers.
func (g *gptqRun) prepare(w []float32, perm []int, dead []bool) {
	rows, cols := g.rows, g.cols
	g.wt = make([]float32, cols*rows)
	const tile = 32 // transpose in tiles so reads and writes stay in cache
	for c0 := 0; c0 < cols; c0 += tile {
		for r0 := 0; r0 < rows; r0 += tile {
			for c := c0; c < min(c0+tile, cols); c++ {
				src := c
				if perm != nil {
					src = perm[c]
				}
				if dead[src] {
					continue
				}
				dst := g.wt[c*rows : (c+1)*rows]
				for r := r0; r < min(r0+tile, rows); r++ {
					dst[r] = w[r*cols+src]
				}
			}
		}
	}
	g.lt = make([]float32, cols*cols)
	for i, v := range g.ut {
		g.lt[i] = float32(v)
	}
	g.e = make([]float32, g.bs*rows)
	g.et = make([]float32, rows*g.bs)
	g.ub = make([]float32, g.bs*g.bs)
	g.grids = make([]grid, rows)
	g.errs = make([]error, (rows+blockRows-1)/blockRows)
}

// gptqBlock quantizes the current block's columns for weight rows
// [lo·blockRows, hi·blockRows): group grids, codes, errors and the
// in-block updates.
type gptqBlock gptqRun

func (t *gptqBlock) Run(lo, hi int) {
	g := (*gptqRun)(t)
	rows, nb, i1 := g.rows, g.nb, g.i1
	var seg []float64
	for ci := lo; ci < hi; ci++ {
		r0, r1 := ci*blockRows, min(rows, (ci+1)*blockRows)
		g.errs[ci] = nil
		for c := i1; c < g.i2; c++ {
			if c%g.group == 0 {
				if seg == nil {
					seg = make([]float64, g.group)
				}
				for r := r0; r < r1; r++ {
					for k := range seg {
						seg[k] = float64(g.wt[(c+k)*rows+r])
					}
					gr, err := findGrid(func(f func(float64)) {
						for _, v := range seg {
							f(v)
						}
					}, g.opt.Bits, g.opt.Symmetric, g.opt.MSEClip)
					if err != nil {
						g.errs[ci] = fmt.Errorf("weights: row %d group %d: %w", r, c/g.group, err)
						return
					}
					g.grids[r] = gr
					g.q.setGrid(r, c/g.group, gr)
				}
			}
			d := g.ut[c*g.cols+c]
			col := g.wt[c*rows+r0 : c*rows+r1]
			ec := g.e[(c-i1)*rows+r0 : (c-i1)*rows+r1]
			for i, v := range col {
				r := r0 + i
				gr := &g.grids[r]
				code := gr.code(float64(v))
				putCode(g.q.Codes[r*g.rb:(r+1)*g.rb], c, g.opt.Bits, code)
				e := float32((float64(v) - gr.value(code)) / d)
				ec[i] = e
				g.et[r*nb+c-i1] = e
			}
			urow := g.ub[(c-i1)*nb : (c-i1+1)*nb]
			for k := c + 1; k < g.i2; k++ {
				kernels.Axpy(-urow[k-i1], ec, g.wt[k*rows+r0:k*rows+r1])
			}
		}
	}
}

// gptqUpdate applies the batched update to trailing columns
// [i2 + lo·updateRows, i2 + hi·updateRows): wt[j, :] −= Σ_p U[i1+p, j]·E[p, :].
type gptqUpdate gptqRun

func (t *gptqUpdate) Run(lo, hi int) {
	g := (*gptqRun)(t)
	rows, cols, nb := g.rows, g.cols, g.nb
	tmp := make([]float32, updateRows*updateCols)
	for u := lo; u < hi; u++ {
		j0 := g.i2 + u*updateRows
		j1 := min(cols, j0+updateRows)
		for n0 := 0; n0 < rows; n0 += updateCols {
			nn := min(updateCols, rows-n0)
			kernels.MatMulNT(j1-j0, nn, nb, g.lt[j0*cols+g.i1:], cols, g.et[n0*nb:], nb, tmp, nn)
			for j := j0; j < j1; j++ {
				kernels.Axpy(-1, tmp[(j-j0)*nn:(j-j0+1)*nn], g.wt[j*rows+n0:j*rows+n0+nn])
			}
		}
	}
}
