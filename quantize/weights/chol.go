package weights

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/lmpack/lmpack/runtime/kernels"
)

// This file holds the float64 linear algebra of GPTQ's step 3: a blocked
// Cholesky factorization and a blocked lower-triangular inverse, split
// over a kernels.Pool. gonum's versions run their O(n³) parts mostly on
// one thread (the triangular inverse entirely), which made them most of
// GPTQ's time for a 4096-wide layer.

const (
	cholBlock = 64 // panel width of the blocked factorization
	invBlock  = 32 // row block of the inverse (its substitution is scalar)
	cholTile  = 32 // rows (Cholesky) or columns (inverse) per parallel unit
)

// invCholUpperT returns Uᵀ, [n, n] row-major lower triangular (zeros
// above the diagonal), where U is upper triangular with H⁻¹ = UᵀU, for
// symmetric positive definite H [n, n] (overwritten), in float64. With J
// the reversal permutation, the lower Cholesky factor L of JHJ gives
// H = ŨŨᵀ with Ũ = JLJ upper triangular, so H⁻¹ = Ũ⁻ᵀŨ⁻¹ and
// U = Ũ⁻¹ = J·L⁻¹·J: one factorization and one triangular inverse (about
// 2n³/3 flops, against 4n³/3 for factor → invert → factor again). The
// transpose is what GPTQ's float32 update wants, and it is (L⁻¹)ᵀ stored
// in reverse, so no strided copy is needed.
// Errors: ErrNotPositiveDefinite when a pivot is not positive.
func invCholUpperT(H []float64, n int, pool *kernels.Pool) ([]float64, error) {
	// JHJ is H's row-major storage reversed.
	slices.Reverse(H)
	if err := cholLower(H, n, pool); err != nil {
		return nil, err
	}
	// Uᵀ[i][j] = U[j][i] = M[n-1-j][n-1-i] = Mᵀ[n-1-i][n-1-j].
	Mt := invLowerT(H, n, pool)
	slices.Reverse(Mt)
	return Mt, nil
}

// cholLower overwrites the lower triangle of A, [n, n] row-major
// symmetric (lower triangle read), with its Cholesky factor L (A = LLᵀ),
// right-looking in panels of cholBlock; the upper triangle is left as
// scratch. Errors: ErrNotPositiveDefinite naming the failing pivot.
func cholLower(A []float64, n int, pool *kernels.Pool) error {
	t := &cholTask{a: A, n: n}
	for k0 := 0; k0 < n; k0 += cholBlock {
		k1 := min(k0+cholBlock, n)
		// Diagonal block, unblocked.
		for j := k0; j < k1; j++ {
			rj := A[j*n+k0 : j*n+j]
			d := A[j*n+j] - dot64(rj, rj)
			if !(d > 0) || math.IsInf(d, 0) {
				return fmt.Errorf("%w: Cholesky of the damped Hessian failed (pivot %d is %g)", ErrNotPositiveDefinite, j, d)
			}
			d = math.Sqrt(d)
			A[j*n+j] = d
			for i := j + 1; i < k1; i++ {
				A[i*n+j] = (A[i*n+j] - dot64(A[i*n+k0:i*n+j], rj)) / d
			}
		}
		if k1 == n {
			break
		}
		t.k0, t.k1 = k0, k1
		t.tiles = (n - k1 + cholTile - 1) / cholTile
		t.trailing = false
		pool.Run((t.tiles+1)/2, t)
		// Pack the solved panel rows contiguously: the trailing update
		// reads them all for every row tile, and rows n apart would each
		// cost their own cache lines and TLB entries.
		t.panel = t.panel[:0]
		for i := k1; i < n; i++ {
			t.panel = append(t.panel, A[i*n+k0:i*n+k1]...)
		}
		t.trailing = true
		pool.Run((t.tiles+1)/2, t)
	}
	return nil
}

// cholTask solves the panel rows, or (trailing) updates the trailing
// matrix, of one step of cholLower for row tiles of cholTile rows below
// k1. Unit u does tiles u and tiles−1−u, so the units' shares of the
// triangle are even.
type cholTask struct {
	a         []float64
	n, k0, k1 int
	tiles     int
	trailing  bool
	panel     []float64 // L21 rows [n−k1, k1−k0], packed
}

func (t *cholTask) Run(lo, hi int) {
	for u := lo; u < hi; u++ {
		t.tile(u)
		if v := t.tiles - 1 - u; v != u {
			t.tile(v)
		}
	}
}

func (t *cholTask) tile(v int) {
	A, n, k0, k1 := t.a, t.n, t.k0, t.k1
	r0 := k1 + v*cholTile
	r1 := min(n, r0+cholTile)
	if t.trailing {
		// A[i][j] −= L21[i]·L21[j] for k1 ≤ j < r1 (j > i lands in the
		// unused upper triangle).
		kb := k1 - k0
		subMulNT(r1-r0, r1-k1, kb, t.panel[(r0-k1)*kb:], kb, t.panel, kb, A[r0*n+k1:], n)
		return
	}
	// Panel: L21 = A21·L11⁻ᵀ, row by row.
	for i := r0; i < r1; i++ {
		for j := k0; j < k1; j++ {
			A[i*n+j] = (A[i*n+j] - dot64(A[i*n+k0:i*n+j], A[j*n+k0:j*n+j])) / A[j*n+j]
		}
	}
}

// invLowerT returns Mᵀ, [n, n] row-major (upper triangular), for
// M = L⁻¹, L the lower triangle of the [n, n] row-major argument. Row block I
// of M is L[I,I]⁻¹·(E_I − L[I, :i0]·M[:i0, :]), computed in column tiles
// in parallel; storing Mᵀ keeps the products in dot form.
func invLowerT(L []float64, n int, pool *kernels.Pool) []float64 {
	Mt := make([]float64, n*n)
	t := &invTask{l: L, mt: Mt, n: n}
	for i0 := 0; i0 < n; i0 += invBlock {
		i1 := min(i0+invBlock, n)
		// Diagonal block: M[I,I] = L[I,I]⁻¹ by forward substitution.
		for j := i0; j < i1; j++ {
			Mt[j*n+j] = 1 / L[j*n+j]
			for r := j + 1; r < i1; r++ {
				s := 0.0
				for q := j; q < r; q++ {
					s += L[r*n+q] * Mt[j*n+q]
				}
				Mt[j*n+r] = -s / L[r*n+r]
			}
		}
		if i0 == 0 {
			continue
		}
		t.i0, t.i1 = i0, i1
		t.tiles = (i0 + cholTile - 1) / cholTile
		pool.Run((t.tiles+1)/2, t)
	}
	return Mt
}

// invTask computes M[I, J] for the current row block I = [i0, i1) and
// column tiles J of cholTile columns left of i0, pairing tiles u and
// tiles−1−u per unit.
type invTask struct {
	l, mt     []float64
	n, i0, i1 int
	tiles     int
}

func (t *invTask) Run(lo, hi int) {
	tmp := make([]float64, invBlock*cholTile)
	for u := lo; u < hi; u++ {
		t.tile(u, tmp)
		if v := t.tiles - 1 - u; v != u {
			t.tile(v, tmp)
		}
	}
}

func (t *invTask) tile(v int, tmp []float64) {
	L, Mt, n, i0, i1 := t.l, t.mt, t.n, t.i0, t.i1
	j0 := v * cholTile
	j1 := min(i0, j0+cholTile)
	nb, nj := i1-i0, j1-j0
	// tmp[r][j] = Σ_{p in [j0, i0)} L[i0+r][p]·M[p][j0+j] (M[p][j] = 0 for p < j).
	clear(tmp[:nb*nj])
	subMulNT(nb, nj, i0-j0, L[i0*n+j0:], n, Mt[j0*n+j0:], n, tmp, nj)
	// M[r][j] = (−tmp[r][j] − Σ_{q in [i0, r)} L[r][q]·M[q][j]) / L[r][r]; tmp holds −(first sum).
	for r := i0; r < i1; r++ {
		lr := L[r*n+i0 : r*n+r]
		d := L[r*n+r]
		for j := j0; j < j1; j++ {
			s := tmp[(r-i0)*nj+j-j0]
			mj := Mt[j*n+i0 : j*n+r]
			for q, l := range lr {
				s -= l * mj[q]
			}
			Mt[j*n+r] = s / d
		}
	}
}

// dot64 returns Σ a[i]·b[i] over len(a) (b at least as long).
func dot64(a, b []float64) float64 {
	b = b[:len(a)]
	var s0, s1 float64
	i := 0
	for ; i+2 <= len(a); i += 2 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
	}
	if i < len(a) {
		s0 += a[i] * b[i]
	}
	return s0 + s1
}

// subMulNT computes c[i·ldc+j] −= Σ_{p<k} a[i·lda+p]·b[j·ldb+p] for i < m,
// j < n (float64, row-major, both operands contiguous in p), in 2×4
// register tiles (AVX2 when available) over slices of subMulK along p and
// subMulN along j. Strided operands are first packed into contiguous
// scratch: rows a whole matrix row apart each start a new page and
// prefetch stream, which halved the kernel's speed.
func subMulNT(m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
	const subMulK, subMulN = 256, 64
	if m == 0 || n == 0 || k == 0 {
		return
	}
	sp := packPool.Get().(*[]float64)
	defer packPool.Put(sp)
	need := (m + subMulN) * min(k, subMulK)
	if cap(*sp) < need {
		*sp = make([]float64, need)
	}
	scratch := (*sp)[:need]
	for p0 := 0; p0 < k; p0 += subMulK {
		kk := min(subMulK, k-p0)
		pa, lpa := a[p0:], lda
		if lda != kk {
			pa, lpa = scratch[:m*kk], kk
			for i := 0; i < m; i++ {
				copy(pa[i*kk:(i+1)*kk], a[i*lda+p0:i*lda+p0+kk])
			}
		}
		for j0 := 0; j0 < n; j0 += subMulN {
			nn := min(subMulN, n-j0)
			pb, lpb := b[j0*ldb+p0:], ldb
			if ldb != kk {
				pb, lpb = scratch[m*kk:m*kk+nn*kk], kk
				for j := 0; j < nn; j++ {
					copy(pb[j*kk:(j+1)*kk], b[(j0+j)*ldb+p0:(j0+j)*ldb+p0+kk])
				}
			}
			subMulNTSlice(m, nn, kk, pa, lpa, pb, lpb, c[j0:], ldc)
		}
	}
}

// packPool holds subMulNT's packing scratch, one buffer per concurrent call.
var packPool = sync.Pool{New: func() any { return new([]float64) }}

func subMulNTSlice(m, n, k int, a []float64, lda int, b []float64, ldb int, c []float64, ldc int) {
	i := 0
	for ; i+2 <= m; i += 2 {
		a0 := a[i*lda : i*lda+k]
		a1 := a[(i+1)*lda : (i+1)*lda+k]
		j := 0
		for ; j+4 <= n; j += 4 {
			b0 := b[j*ldb : j*ldb+k]
			b1 := b[(j+1)*ldb : (j+1)*ldb+k]
			b2 := b[(j+2)*ldb : (j+2)*ldb+k]
			b3 := b[(j+3)*ldb : (j+3)*ldb+k]
			var c00, c01, c02, c03, c10, c11, c12, c13 float64
			p0 := 0
			if hasAVX2 && k >= 4 {
				var out [8]float64
				dotNT2x4AVX2(&a0[0], &a1[0], &b0[0], ldb, k/4, &out)
				c00, c01, c02, c03, c10, c11, c12, c13 = out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]
				p0 = k &^ 3
			}
			a0, a1, b0, b1, b2, b3 := a0[p0:], a1[p0:len(a0)], b0[p0:len(a0)], b1[p0:len(a0)], b2[p0:len(a0)], b3[p0:len(a0)]
			for p, x0 := range a0 {
				x1 := a1[p]
				y0, y1, y2, y3 := b0[p], b1[p], b2[p], b3[p]
				c00 += x0 * y0
				c01 += x0 * y1
				c02 += x0 * y2
				c03 += x0 * y3
				c10 += x1 * y0
				c11 += x1 * y1
				c12 += x1 * y2
				c13 += x1 * y3
			}
			r0 := c[i*ldc+j : i*ldc+j+4]
			r0[0] -= c00
			r0[1] -= c01
			r0[2] -= c02
			r0[3] -= c03
			r1 := c[(i+1)*ldc+j : (i+1)*ldc+j+4]
			r1[0] -= c10
			r1[1] -= c11
			r1[2] -= c12
			r1[3] -= c13
		}
		for ; j < n; j++ {
			bj := b[j*ldb : j*ldb+k]
			c[i*ldc+j] -= dot64(a0, bj)
			c[(i+1)*ldc+j] -= dot64(a1, bj)
		}
	}
	for ; i < m; i++ {
		ai := a[i*lda : i*lda+k]
		for j := 0; j < n; j++ {
			c[i*ldc+j] -= dot64(ai, b[j*ldb:j*ldb+k])
		}
	}
}
