package kernels

// checkMat panics unless a row-major float32 matrix of rows×cols with
// leading dimension ld fits in a slice of length n.
func checkMat(fn, name string, rows, cols, ld, n int) {
	if ld < cols {
		panicf("%s: ld%s=%d < %d columns", fn, name, ld, cols)
	}
	if need := (rows-1)*ld + cols; n < need {
		panicf("%s: len(%s)=%d < (%d-1)*%d+%d=%d for a [%d,%d] matrix with leading dimension %d",
			fn, name, n, rows, ld, cols, need, rows, cols, ld)
	}
}

func checkMatMul(fn string, m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int, nt bool) {
	if m < 0 || n < 0 || k < 0 {
		panicf("%s: negative size m=%d n=%d k=%d", fn, m, n, k)
	}
	if m == 0 || n == 0 {
		return
	}
	checkMat(fn, "y", m, n, ldy, len(y))
	if k == 0 {
		return
	}
	checkMat(fn, "x", m, k, ldx, len(x))
	if nt {
		checkMat(fn, "w", n, k, ldw, len(w))
	} else {
		checkMat(fn, "w", k, n, ldw, len(w))
	}
}

// MatMulNT computes y = x·wᵀ for float32 row-major matrices:
//
//	y[i*ldy+j] = Σ_{p<k} x[i*ldx+p] · w[j*ldw+p],  i < m, j < n
//
// x is [m,k] (activations), w is [n,k] (a PyTorch Linear weight [out,in], or
// the keys K in attention scores Q·Kᵀ), y is [m,n]. The leading dimensions
// ldx ≥ k, ldw ≥ k, ldy ≥ n let callers pass sub-matrices. y is overwritten
// and must not overlap x or w. m == 1 is the decode GEMV (w streamed once,
// four rows a quarter of the matrix apart sharing each load of x); m > 1
// uses a 4×3 register-blocked micro-kernel with w blocked to stay in L2 and
// long k sliced to stay in L1 (see doc.go). Sums are accumulated in float32
// in an order that depends on the path and the sizes.
//
// Shapes are the caller's guarantee: it panics, naming the operand, if a
// size is negative, a leading dimension is too small or a slice too short.
func MatMulNT(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	checkMatMul("MatMulNT", m, n, k, x, ldx, w, ldw, y, ldy, true)
	matMulNT(m, n, k, x, ldx, w, ldw, y, ldy)
}

// matMulNT is MatMulNT without the checks.
func matMulNT(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		zeroMat(m, n, y, ldy)
		return
	}
	if useAsm {
		matMulNTAsm(m, n, k, x, ldx, w, ldw, y, ldy)
		return
	}
	matMulNTGo(m, n, k, x, ldx, w, ldw, y, ldy)
}

// MatMulNN computes y = x·w for float32 row-major matrices:
//
//	y[i*ldy+j] = Σ_{p<k} x[i*ldx+p] · w[p*ldw+j],  i < m, j < n
//
// x is [m,k], w is [k,n], y is [m,n], with leading dimensions ldx ≥ k,
// ldw ≥ n, ldy ≥ n. It is meant for attention's P·V (P [q,ctx] probabilities,
// V [ctx,head_dim]), where n is small (8..128): a 6×16 broadcast-FMA
// micro-kernel keeps a whole [6,16] output tile in registers. It does not
// block for cache, so it is not a general large-n GEMM. y is overwritten and
// must not overlap x or w. It panics on bad shapes like MatMulNT.
func MatMulNN(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	checkMatMul("MatMulNN", m, n, k, x, ldx, w, ldw, y, ldy, false)
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		zeroMat(m, n, y, ldy)
		return
	}
	if useAsm {
		matMulNNAsm(m, n, k, x, ldx, w, ldw, y, ldy)
		return
	}
	matMulNNGo(m, n, k, x, ldx, w, ldw, y, ldy)
}

func zeroMat(m, n int, y []float32, ldy int) {
	for i := 0; i < m; i++ {
		clear(y[i*ldy : i*ldy+n])
	}
}

// l2Budget is the bytes of w one block of the NT GEMM keeps resident: about
// half of a 512 KiB L2, leaving room for the x rows and y.
const l2Budget = 256 << 10

// kSlice is the longest k the NT GEMM reduces in one pass: four x rows and
// three w rows of kSlice floats (20 KiB) fit in a 32 KiB L1 together. Longer
// k is cut into near-equal slices whose partial sums accumulate in y.
const kSlice = 768

// ntBlockRows returns how many w rows (a multiple of 3, at least 3) form one
// cache block of the NT GEMM for row length k.
func ntBlockRows(k int) int {
	r := l2Budget / (4 * k) / 3 * 3
	return max(r, 3)
}

func matMulNTAsm(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	if m == 1 {
		gemvAsm(n, k, x, w, ldw, y)
		return
	}
	m4 := m &^ 3
	n3 := n - n%3
	if m4 > 0 && n3 > 0 {
		slices := (k + kSlice - 1) / kSlice
		for s := 0; s < slices; s++ {
			p0, p1 := s*k/slices, (s+1)*k/slices
			kc := p1 - p0
			nb := ntBlockRows(kc)
			for jc := 0; jc < n3; jc += nb {
				jn := min(nb, n3-jc)
				for i := 0; i < m4; i += 4 {
					gemmNT4x3AVX2(&x[i*ldx+p0], ldx, &w[jc*ldw+p0], ldw, &y[i*ldy+jc], ldy, kc, jn/3, min(s, 1))
				}
			}
		}
	}
	// Columns left over by the 3-wide tiles: one w row against four x rows
	// (the GEMV kernel with the roles of x and w swapped).
	for j := n3; j < n; j++ {
		for i := 0; i < m4; i += 4 {
			gemv4AVX2(&w[j*ldw], &x[i*ldx], 0, k, &y[i*ldy+j], 1, ldx, ldy)
		}
	}
	// Rows left over by the 4-tall tiles.
	for i := m4; i < m; i++ {
		gemvAsm(n, k, x[i*ldx:], w, ldw, y[i*ldy:])
	}
}

// gemvAsm: y[j] = x[:k]·w[j*ldw : j*ldw+k] for j < n. Rows j, j+q, j+2q
// and j+3q (q = n/4) are reduced together, so w is read as four long
// sequential streams.
func gemvAsm(n, k int, x, w []float32, ldw int, y []float32) {
	q := n / 4
	n4 := 4 * q
	if q > 0 {
		gemv4AVX2(&x[0], &w[0], ldw, k, &y[0], q, q*ldw, q)
	}
	for j := n4; j < n; j++ {
		y[j] = dotAsm(x[:k], w[j*ldw:j*ldw+k])
	}
}

func matMulNNAsm(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	m6 := m - m%6
	n16 := n &^ 15
	for i := 0; i < m6; i += 6 {
		if n16 > 0 {
			gemmNN6x16AVX2(&x[i*ldx], ldx, &w[0], ldw, &y[i*ldy], ldy, k, n16/16)
		}
		if n16 < n {
			for r := i; r < i+6; r++ {
				gemmNN1AVX2(&x[r*ldx], &w[n16], ldw, &y[r*ldy+n16], k, n-n16)
			}
		}
	}
	for i := m6; i < m; i++ {
		gemmNN1AVX2(&x[i*ldx], &w[0], ldw, &y[i*ldy], k, n)
	}
}
