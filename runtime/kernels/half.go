package kernels

import "math"

// HalfKind is the 16-bit float format of a weight matrix for MatMulNTHalf.
type HalfKind uint8

const (
	// BF16 is bfloat16: the high 16 bits of an IEEE float32 (widening is
	// a 16-bit shift, exact).
	BF16 HalfKind = 1
	// F16 is IEEE 754 binary16 (widening is exact).
	F16 HalfKind = 2
)

// String returns "bf16" or "f16".
func (h HalfKind) String() string {
	switch h {
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	}
	return "HalfKind(?)"
}

// Widen returns the float32 value of the 16-bit float bits v of kind h
// (exact); it panics for a kind other than BF16 and F16.
func (h HalfKind) Widen(v uint16) float32 {
	switch h {
	case BF16:
		return math.Float32frombits(uint32(v) << 16)
	case F16:
		return f16ToF32(v)
	}
	panicf("kernels: unknown HalfKind %d", h)
	return 0
}

// halfTileRows is the rows of w MatMulNTHalf widens into its stack buffer
// at a time for the 4×3 micro-kernel (a multiple of 3): halfTileRows·kSlice
// float32 (36 KiB) stay in L1/L2 while every 4-row group of x runs over
// them.
const halfTileRows = 12

// MatMulNTHalf computes y = x·wᵀ with w 16-bit floats: x [m,k] float32, w
// [n,k] uint16 bits of kind (BF16 or F16), y [m,n] float32, row-major with
// leading dimensions ldx ≥ k, ldw ≥ k, ldy ≥ n; y is overwritten. Every
// output is the same bits MatMulNTRows gives on the float32 widening of w
// (widening is exact): summed in an order that depends only on k, so a row
// of y does not depend on m, the other rows of x or the columns a caller
// computes separately.
//
// On the AVX2 path (F16 also needs F16C) a row of x runs
// gemvNT8BF16AVX2/gemvNT8F16AVX2, eight rows of w per load of x, widening
// w in registers (bfloat16 by VPMOVZXWD and VPSLLD; binary16 by
// VCVTPH2PS): w is read once per row of x at 2 bytes per weight. The
// 4-row groups of x (m ≥ 4) run MatMulNTRows' micro-kernel on
// halfTileRows rows of w widened at a time into a stack buffer. k < 8
// widens w in small blocks for MatMulNTRows. The portable path sums every
// output sequentially in p, as MatMulNTRows' portable path does. It panics
// on bad shapes or an unknown kind; it allocates nothing.
func MatMulNTHalf(kind HalfKind, m, n, k int, x []float32, ldx int, w []uint16, ldw int, y []float32, ldy int) {
	checkHalf("MatMulNTHalf", kind, m, n, k, x, ldx, w, ldw, y, ldy)
	matMulNTHalf(kind, m, n, k, x, ldx, w, ldw, y, ldy)
}

// checkHalf panics on an unknown kind or bad shapes (checkMatMul's rules).
func checkHalf(fn string, kind HalfKind, m, n, k int, x []float32, ldx int, w []uint16, ldw int, y []float32, ldy int) {
	if kind != BF16 && kind != F16 {
		panicf("%s: unknown HalfKind %d", fn, kind)
	}
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
	checkMat(fn, "w", n, k, ldw, len(w))
}

func halfAsm(kind HalfKind) bool { return useAsm && (kind == BF16 || hasF16C) }

func matMulNTHalf(kind HalfKind, m, n, k int, x []float32, ldx int, w []uint16, ldw int, y []float32, ldy int) {
	if m == 0 || n == 0 {
		return
	}
	if k == 0 {
		zeroMat(m, n, y, ldy)
		return
	}
	if !halfAsm(kind) {
		matMulNTHalfGo(kind, m, n, k, x, ldx, w, ldw, y, ldy)
		return
	}
	if k < 8 {
		// The gemv kernel's tail load needs k ≥ 8: widen eight rows at a
		// time and run the float32 kernel on them.
		var buf [8 * 7]float32
		for j := 0; j < n; j += 8 {
			jn := min(8, n-j)
			for r := 0; r < jn; r++ {
				widenRow(kind, buf[r*k:(r+1)*k], w[(j+r)*ldw:(j+r)*ldw+k])
			}
			matMulNTRows(m, jn, k, x, ldx, buf[:], k, y[j:], ldy)
		}
		return
	}
	matMulNTHalfAsm(kind, m, n, k, x, ldx, w, ldw, y, ldy)
}

// WidenHalf writes the float32 values (exact) of the 16-bit floats src of
// kind into dst[:len(src)]. It panics for an unknown kind or a short dst.
func WidenHalf(kind HalfKind, dst []float32, src []uint16) {
	if kind != BF16 && kind != F16 {
		panicf("WidenHalf: unknown HalfKind %d", kind)
	}
	if len(dst) < len(src) {
		panicf("WidenHalf: len(dst)=%d < len(src)=%d", len(dst), len(src))
	}
	widenRow(kind, dst, src)
}

// widenRow writes the float32 values of the 16-bit floats src into dst.
func widenRow(kind HalfKind, dst []float32, src []uint16) {
	dst = dst[:len(src)]
	if n8 := len(src) &^ 7; n8 > 0 && halfAsm(kind) {
		if kind == BF16 {
			widenBF16AVX2(&dst[0], &src[0], n8)
		} else {
			widenF16AVX2(&dst[0], &src[0], n8)
		}
		dst, src = dst[n8:], src[n8:]
	}
	if kind == BF16 {
		for i, v := range src {
			dst[i] = math.Float32frombits(uint32(v) << 16)
		}
		return
	}
	for i, v := range src {
		dst[i] = f16ToF32(v)
	}
}

// matMulNTHalfAsm mirrors matMulNTRowsAsm: the same slices of k, the same
// kernels' per-output arithmetic (see MatMulNTHalf). k ≥ 8.
func matMulNTHalfAsm(kind HalfKind, m, n, k int, x []float32, ldx int, w []uint16, ldw int, y []float32, ldy int) {
	slices := (k + kSlice - 1) / kSlice
	m4 := m &^ 3
	for i := m4; i < m; i++ {
		rowHalfAsm(kind, n, k, slices, x[i*ldx:], w, ldw, y[i*ldy:])
	}
	if m4 == 0 {
		return
	}
	var buf [halfTileRows * kSlice]float32
	var tmp [12]float32
	for s := 0; s < slices; s++ {
		p0, p1 := s*k/slices, (s+1)*k/slices
		kc := p1 - p0
		acc := min(s, 1)
		for j0 := 0; j0 < n; j0 += halfTileRows {
			jn := min(halfTileRows, n-j0)
			for r := 0; r < jn; r++ {
				o := (j0+r)*ldw + p0
				widenRow(kind, buf[r*kc:(r+1)*kc], w[o:o+kc])
			}
			j3 := jn - jn%3
			if j3 > 0 {
				for i := 0; i < m4; i += 4 {
					gemmNT4x3AVX2(&x[i*ldx+p0], ldx, &buf[0], kc, &y[i*ldy+j0], ldy, kc, j3/3, acc)
				}
			}
			// Columns left over: the tile's three w rows aliased to the
			// column's row, as matMulNTRowsAsm does.
			for r := j3; r < jn; r++ {
				for i := 0; i < m4; i += 4 {
					if acc == 1 {
						for q := 0; q < 4; q++ {
							tmp[3*q] = y[(i+q)*ldy+j0+r]
						}
					}
					gemmNT4x3AVX2(&x[i*ldx+p0], ldx, &buf[r*kc], 0, &tmp[0], 3, kc, 1, acc)
					for q := 0; q < 4; q++ {
						y[(i+q)*ldy+j0+r] = tmp[3*q]
					}
				}
			}
		}
	}
}

// rowHalfAsm is rowNTAsm for 16-bit w: y[j] = x·w[j] for j < n, eight rows
// of w a eighth of the matrix apart per kernel call, the n%8 rows left
// one at a time (aliased). k ≥ 8.
//
// Tried and not kept (2026-12-03): widening bfloat16 without a shuffle,
// the even elements of a 32-byte load by VPSLLD $16 and the odd ones by
// VPAND 0xFFFF0000, against x permuted once per call into the same pair
// order (5 µops per 16 weights against 6–8). BenchmarkMatMulNTHalf m=1
// (W in the last-level cache) went from 35–38 to 41–44 GB/s, but
// BenchmarkGEMVDRAM bf16 only from 19.5–19.8 to 20.2–20.3 GB/s and
// BenchmarkHalfDecode 22M bf16 not at all (1.76–1.92 against 1.81–1.84
// ms/token over 3 alternations): decode from DRAM is bound by the read
// stream (0.7 of streamReadAVX2's rate), not by the widening, and the
// pair order would have cost the bit-equality with the widened path.
func rowHalfAsm(kind HalfKind, n, k, slices int, x []float32, w []uint16, ldw int, y []float32) {
	gemv := gemvNT8BF16AVX2
	if kind == F16 {
		gemv = gemvNT8F16AVX2
	}
	// Tiles outside, slices inside, as rowNTAsm (same bits, each row read
	// from start to end).
	q := n / 8
	for t := 0; t < q; t++ {
		for s := 0; s < slices; s++ {
			p0, p1 := s*k/slices, (s+1)*k/slices
			gemv(&x[p0], &w[t*ldw+p0], p1-p0, &y[t], 1, ldw, q*ldw, q, min(s, 1))
		}
	}
	for j := 8 * q; j < n; j++ {
		for s := 0; s < slices; s++ {
			p0, p1 := s*k/slices, (s+1)*k/slices
			gemv(&x[p0], &w[j*ldw+p0], p1-p0, &y[j], 1, 0, 0, 0, min(s, 1))
		}
	}
}

// matMulNTHalfGo: every output is Σ_p x[i,p]·w[j,p] summed sequentially in
// p, as matMulNTRowsGo sums it, w widened element by element.
func matMulNTHalfGo(kind HalfKind, m, n, k int, x []float32, ldx int, w []uint16, ldw int, y []float32, ldy int) {
	for i := 0; i < m; i++ {
		xr := x[i*ldx : i*ldx+k]
		yr := y[i*ldy : i*ldy+n]
		j := 0
		for ; j+4 <= n; j += 4 {
			o := j * ldw
			yr[j], yr[j+1], yr[j+2], yr[j+3] = dot4Half(kind, xr, w[o:], w[o+ldw:], w[o+2*ldw:], w[o+3*ldw:])
		}
		for ; j < n; j++ {
			wr := w[j*ldw : j*ldw+k]
			yr[j], _, _, _ = dot4Half(kind, xr, wr, wr, wr, wr)
		}
	}
}

// dot4Half is dot4Go with 16-bit rows.
func dot4Half(kind HalfKind, x []float32, w0, w1, w2, w3 []uint16) (s0, s1, s2, s3 float32) {
	w0 = w0[:len(x)]
	w1 = w1[:len(x)]
	w2 = w2[:len(x)]
	w3 = w3[:len(x)]
	if kind == BF16 {
		for p, v := range x {
			s0 += v * math.Float32frombits(uint32(w0[p])<<16)
			s1 += v * math.Float32frombits(uint32(w1[p])<<16)
			s2 += v * math.Float32frombits(uint32(w2[p])<<16)
			s3 += v * math.Float32frombits(uint32(w3[p])<<16)
		}
		return
	}
	for p, v := range x {
		s0 += v * f16ToF32(w0[p])
		s1 += v * f16ToF32(w1[p])
		s2 += v * f16ToF32(w2[p])
		s3 += v * f16ToF32(w3[p])
	}
	return
}

// halfTask is the pool task of Pool.MatMulNTHalf (matMulTask's split).
type halfTask struct {
	kind          HalfKind
	m, n, k       int
	x, y          []float32
	w             []uint16
	ldx, ldw, ldy int
	unit          int
	overM         bool
}

func (t *halfTask) Run(lo, hi int) {
	if t.overM {
		i0, i1 := lo*t.unit, min(hi*t.unit, t.m)
		matMulNTHalf(t.kind, i1-i0, t.n, t.k, t.x[i0*t.ldx:], t.ldx, t.w, t.ldw, t.y[i0*t.ldy:], t.ldy)
		return
	}
	j0, j1 := lo*t.unit, min(hi*t.unit, t.n)
	matMulNTHalf(t.kind, t.m, j1-j0, t.k, t.x, t.ldx, t.w[j0*t.ldw:], t.ldw, t.y[j0:], t.ldy)
}

// MatMulNTHalf is MatMulNTHalf (same operands, shapes, result bits and
// panics) split across the pool's threads as Pool.MatMulNTRows splits:
// over column tiles of halfTileRows rows of w (over rows of x when n is
// too narrow to give every thread a tile). The result does not depend on
// the thread count. It allocates nothing and panics if the pool is closed.
func (p *Pool) MatMulNTHalf(kind HalfKind, m, n, k int, x []float32, ldx int, w []uint16, ldw int, y []float32, ldy int) {
	if p.closed.Load() {
		panicf("Pool.MatMulNTHalf: pool is closed")
	}
	checkHalf("Pool.MatMulNTHalf", kind, m, n, k, x, ldx, w, ldw, y, ldy)
	if p.threads == 1 || m == 0 || n == 0 || k == 0 || m*n*k < parallelMinMACs {
		matMulNTHalf(kind, m, n, k, x, ldx, w, ldw, y, ldy)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		panicf("Pool.MatMulNTHalf: pool is closed")
	}
	t := &p.hm
	*t = halfTask{kind: kind, m: m, n: n, k: k, x: x, w: w, y: y, ldx: ldx, ldw: ldw, ldy: ldy}
	var units int
	if n >= 2*halfTileRows*p.threads || n >= m {
		// Units of 8 rows of w keep the decode GEMV's 8-row tiles whole.
		t.unit = 8
		units = (n + 7) / 8
	} else {
		t.unit, t.overM = 1, true
		units = m
	}
	if units < 2 {
		matMulNTHalf(kind, m, n, k, x, ldx, w, ldw, y, ldy)
	} else {
		p.run(units, t)
	}
	*t = halfTask{}
}
