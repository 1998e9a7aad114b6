package kernels

// Attention over binary16 rows (a KV cache's fp16 keys and values), read
// in place: no widened copy of the rows is written.

// halfAttnRows is the rows of k or v one pass of HalfScores/HalfAccum
// runs every query row over: 64 rows of head_dim 128 are 16 KiB of
// binary16, so the nq query rows after the first find them in L1.
const halfAttnRows = 64

// HalfScores computes attention scores against binary16 keys:
//
//	s[i·lds + j] = Σ_{d<hd} q[i·ldq + d] · k_j[d]   (i < nq, j < n)
//
// with q [nq, hd] float32 (row stride ldq ≥ hd), k [n, hd] IEEE binary16
// bits (kernels.F16, row stride ldk ≥ hd; k_j is row j widened exactly)
// and s [nq, n] float32 (row stride lds ≥ n), overwritten. Each output is
// summed in float32 in an order that depends only on hd. On the AVX2 path
// (F16C, hd a multiple of 8) four key rows are widened in registers by
// VCVTPH2PS and multiplied into four 8-lane accumulators per load of q
// (four query rows at a time: two key rows, each widened once for the
// four; the same bits, so a row's scores do not depend on nq); the
// portable path sums each output sequentially in d. It panics on bad
// shapes; it allocates nothing.
func HalfScores(nq, n, hd int, q []float32, ldq int, k []uint16, ldk int, s []float32, lds int) {
	if nq < 0 || n < 0 || hd < 0 {
		panicf("HalfScores: negative size nq=%d n=%d hd=%d", nq, n, hd)
	}
	if nq == 0 || n == 0 {
		return
	}
	checkMat("HalfScores", "s", nq, n, lds, len(s))
	if hd == 0 {
		zeroMat(nq, n, s, lds)
		return
	}
	checkMat("HalfScores", "q", nq, hd, ldq, len(q))
	checkMat("HalfScores", "k", n, hd, ldk, len(k))
	if !halfAttnAsm(hd) {
		halfScoresGo(nq, n, hd, q, ldq, k, ldk, s, lds)
		return
	}
	for j0 := 0; j0 < n; j0 += halfAttnRows {
		jn := min(halfAttnRows, n-j0)
		i := 0
		if j2 := jn &^ 1; j2 > 0 {
			for ; i+4 <= nq; i += 4 {
				halfScores4AVX2(&q[i*ldq], ldq, &k[j0*ldk], ldk, j2, hd, &s[i*lds+j0], lds)
				if j2 < jn {
					for r := i; r < i+4; r++ {
						halfScoresAVX2(&q[r*ldq], &k[(j0+j2)*ldk], ldk, 1, hd, &s[r*lds+j0+j2])
					}
				}
			}
		}
		for ; i < nq; i++ {
			halfScoresAVX2(&q[i*ldq], &k[j0*ldk], ldk, jn, hd, &s[i*lds+j0])
		}
	}
}

// HalfAccum accumulates attention outputs over binary16 values:
//
//	out[i·ldo + d] += Σ_{j<n} p[i·ldp + j] · v_j[d]   (i < nq, d < hd)
//
// with p [nq, n] float32 weights (row stride ldp ≥ n), v [n, hd] IEEE
// binary16 bits (kernels.F16, row stride ldv ≥ hd; v_j is row j widened
// exactly) and out [nq, hd] float32 (row stride ldo ≥ hd), accumulated
// into. Each output adds the n terms in float32 in order of j (fused
// multiply-adds on the AVX2 path: F16C, hd a multiple of 8, where a row of
// out is held in registers over 64 rows of v at a time and v is widened
// there by VCVTPH2PS; four rows of p at a time, 16 columns, when hd is a
// multiple of 16: each chunk of v widened once for the four, the same
// bits). It panics on bad shapes; it allocates nothing.
func HalfAccum(nq, n, hd int, p []float32, ldp int, v []uint16, ldv int, out []float32, ldo int) {
	if nq < 0 || n < 0 || hd < 0 {
		panicf("HalfAccum: negative size nq=%d n=%d hd=%d", nq, n, hd)
	}
	if nq == 0 || n == 0 || hd == 0 {
		return
	}
	checkMat("HalfAccum", "p", nq, n, ldp, len(p))
	checkMat("HalfAccum", "out", nq, hd, ldo, len(out))
	checkMat("HalfAccum", "v", n, hd, ldv, len(v))
	if !halfAttnAsm(hd) {
		halfAccumGo(nq, n, hd, p, ldp, v, ldv, out, ldo)
		return
	}
	for j0 := 0; j0 < n; j0 += halfAttnRows {
		jn := min(halfAttnRows, n-j0)
		i := 0
		if hd%16 == 0 {
			for ; i+4 <= nq; i += 4 {
				halfAccum4AVX2(&p[i*ldp+j0], ldp, &v[j0*ldv], ldv, jn, hd, &out[i*ldo], ldo)
			}
		}
		for ; i < nq; i++ {
			halfAccumAVX2(&p[i*ldp+j0], &v[j0*ldv], ldv, jn, hd, &out[i*ldo])
		}
	}
}

// halfAttnAsm reports whether HalfScores and HalfAccum run their AVX2
// kernels for head_dim hd.
func halfAttnAsm(hd int) bool { return useAsm && hasF16C && hd%8 == 0 }

func halfScoresGo(nq, n, hd int, q []float32, ldq int, k []uint16, ldk int, s []float32, lds int) {
	for i := 0; i < nq; i++ {
		qi := q[i*ldq : i*ldq+hd]
		for j := 0; j < n; j++ {
			kj := k[j*ldk : j*ldk+hd]
			var a float32
			for d, x := range qi {
				a += x * f16ToF32(kj[d])
			}
			s[i*lds+j] = a
		}
	}
}

func halfAccumGo(nq, n, hd int, p []float32, ldp int, v []uint16, ldv int, out []float32, ldo int) {
	for i := 0; i < nq; i++ {
		oi := out[i*ldo : i*ldo+hd]
		for j := 0; j < n; j++ {
			w := p[i*ldp+j]
			vj := v[j*ldv : j*ldv+hd]
			for d := range oi {
				oi[d] += w * f16ToF32(vj[d])
			}
		}
	}
}
