package kernels

// Row-independent GEMM for batched decode (ragged batches of sequences):
// every output is summed in one order fixed by k alone, so a row of the
// result is the same, bit for bit, whatever the other rows of x are, how
// many there are, which columns a call covers and how the work is split
// over threads.

// MatMulNTRows computes y = x·wᵀ like MatMulNT (x [m,k], w [n,k], y [m,n],
// float32 row-major with leading dimensions ldx ≥ k, ldw ≥ k, ldy ≥ n; y
// overwritten; panics on bad shapes), but each y[i,j] is accumulated in an
// order that depends only on k: y[i*ldy+j] is the same bits for any m, n,
// any choice of the other rows of x and of w, and any sub-range of rows or
// columns a caller computes separately. MatMulNT does not promise that: its
// m == 1 GEMV, its 4×3 tiles and its edge rows and columns each sum in
// their own order.
//
// On the AVX2 path every output runs the order of the 4×3 micro-kernel of
// MatMulNT's m > 1 path: k cut into the same near-equal slices of at most
// 768 (summed into y left to right), one 8-lane accumulator per slice
// reduced pairwise. Rows outside the 4-row tiles, and a single-row product
// (decode), run a one-row kernel with that same per-output arithmetic,
// eight rows of w per load of x (gemvNT8AVX2); columns outside the
// 3-column tiles run the micro-kernel with its three w rows aliased to the
// one column, into a small stack buffer. On
// the portable path every output is a sequential float32 sum over p.
func MatMulNTRows(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	checkMatMul("MatMulNTRows", m, n, k, x, ldx, w, ldw, y, ldy, true)
	matMulNTRows(m, n, k, x, ldx, w, ldw, y, ldy)
}

func matMulNTRows(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		zeroMat(m, n, y, ldy)
		return
	}
	if useAsm {
		matMulNTRowsAsm(m, n, k, x, ldx, w, ldw, y, ldy)
		return
	}
	matMulNTRowsGo(m, n, k, x, ldx, w, ldw, y, ldy)
}

// matMulNTRowsGo: every output is Σ_p x[i,p]·w[j,p] summed sequentially in
// p, four columns sharing each load of x (dot4Go); a column left over runs
// dot4Go with its row repeated, so it is summed by the same code.
func matMulNTRowsGo(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	for i := 0; i < m; i++ {
		xr := x[i*ldx : i*ldx+k]
		yr := y[i*ldy : i*ldy+n]
		j := 0
		for ; j+4 <= n; j += 4 {
			o := j * ldw
			yr[j], yr[j+1], yr[j+2], yr[j+3] = dot4Go(xr, w[o:], w[o+ldw:], w[o+2*ldw:], w[o+3*ldw:])
		}
		for ; j < n; j++ {
			wr := w[j*ldw : j*ldw+k]
			yr[j], _, _, _ = dot4Go(xr, wr, wr, wr, wr)
		}
	}
}

// matMulNTRowsAsm drives gemmNT4x3AVX2 (4-row groups) and gemvNT8AVX2
// (rows left over, or a single row) so that every output sees the same
// arithmetic (see MatMulNTRows).
func matMulNTRowsAsm(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	slices := (k + kSlice - 1) / kSlice
	m4 := m &^ 3
	for i := m4; i < m; i++ {
		rowNTAsm(n, k, slices, x[i*ldx:], w, ldw, y[i*ldy:])
	}
	if m4 == 0 {
		return
	}
	n3 := n - n%3
	if n3 > 0 {
		for s := 0; s < slices; s++ {
			p0, p1 := s*k/slices, (s+1)*k/slices
			kc := p1 - p0
			nb := ntBlockRows(kc)
			acc := min(s, 1)
			for jc := 0; jc < n3; jc += nb {
				jn := min(nb, n3-jc)
				for i := 0; i < m4; i += 4 {
					gemmNT4x3AVX2(&x[i*ldx+p0], ldx, &w[jc*ldw+p0], ldw, &y[i*ldy+jc], ldy, kc, jn/3, acc)
				}
			}
		}
	}
	// Columns [n3, n) of the 4-row groups, one at a time: the tile's three
	// w rows aliased to the column's row (leading dimension 0), into tmp.
	var tmp [12]float32
	for j := n3; j < n; j++ {
		for i := 0; i < m4; i += 4 {
			for s := 0; s < slices; s++ {
				p0, p1 := s*k/slices, (s+1)*k/slices
				gemmNT4x3AVX2(&x[i*ldx+p0], ldx, &w[j*ldw+p0], 0, &tmp[0], 3, p1-p0, 1, min(s, 1))
			}
			for r := 0; r < 4; r++ {
				y[(i+r)*ldy+j] = tmp[3*r]
			}
		}
	}
}

// rowNTAsm computes y[j] = x·w[j] for j < n, one row of x, with k cut
// into slices as MatMulNTRows does: eight rows of w a eighth of the
// matrix apart per gemvNT8AVX2 tile (eight sequential streams, as the
// decode GEMV reads four), the n%8 rows left one at a time (aliased).
//
// The slices of k run inside the loop over tiles of eight rows (each
// output still sums slice 0, then adds slice 1, …: the same bits), so each
// row of w is read from start to end before the next: one pass over the
// slices per tile would jump between rows every kSlice elements, which
// measured 0.68× of the copy bandwidth for decode on a model larger than
// the last-level cache (BenchmarkDecodeBandwidthBig, F32).
func rowNTAsm(n, k, slices int, x, w []float32, ldw int, y []float32) {
	q := n / 8
	for t := 0; t < q; t++ {
		for s := 0; s < slices; s++ {
			p0, p1 := s*k/slices, (s+1)*k/slices
			gemvNT8AVX2(&x[p0], &w[t*ldw+p0], p1-p0, &y[t], 1, ldw, q*ldw, q, min(s, 1))
		}
	}
	for j := 8 * q; j < n; j++ {
		for s := 0; s < slices; s++ {
			p0, p1 := s*k/slices, (s+1)*k/slices
			gemvNT8AVX2(&x[p0], &w[j*ldw+p0], p1-p0, &y[j], 1, 0, 0, 0, min(s, 1))
		}
	}
}

// MatMulNTRows is MatMulNTRows (same operands, shapes, result bits and
// panics) split across the pool's threads: over column tiles of 3 (the
// micro-kernel's), or over rows of x when n is too narrow to give every
// thread a tile. Since every output's arithmetic is fixed by k, the result
// does not depend on the thread count. It allocates nothing and panics if
// the pool is closed.
func (p *Pool) MatMulNTRows(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	if p.closed.Load() {
		panicf("Pool.MatMulNTRows: pool is closed")
	}
	checkMatMul("Pool.MatMulNTRows", m, n, k, x, ldx, w, ldw, y, ldy, true)
	if p.threads == 1 || m == 0 || n == 0 || k == 0 || m*n*k < parallelMinMACs {
		matMulNTRows(m, n, k, x, ldx, w, ldw, y, ldy)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		panicf("Pool.MatMulNTRows: pool is closed")
	}
	t := &p.mm
	*t = matMulTask{m: m, n: n, k: k, x: x, w: w, y: y, ldx: ldx, ldw: ldw, ldy: ldy, rows: true}
	var units int
	if n >= 6*p.threads || n >= m {
		t.unit = 3
		units = (n + 2) / 3
	} else {
		t.unit, t.overM = 1, true
		units = m
	}
	if units < 2 {
		matMulNTRows(m, n, k, x, ldx, w, ldw, y, ldy)
	} else {
		p.run(units, t)
	}
	*t = matMulTask{}
}
