package kernels

import "math"

// Portable pure-Go kernels. They are the reference-speed fallback on every
// architecture without assembly, and on amd64 when the CPU lacks AVX2/FMA or
// the purego build tag is set. They take already-checked arguments.

func dotGo(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func axpyGo(alpha float32, x, y []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += alpha * v
	}
}

func scaleGo(alpha float32, x []float32) {
	for i := range x {
		x[i] *= alpha
	}
}

// dot4Go returns the dot products of x with four rows w0..w3 (each at least
// len(x) long), sharing every load of x.
func dot4Go(x, w0, w1, w2, w3 []float32) (s0, s1, s2, s3 float32) {
	w0 = w0[:len(x)]
	w1 = w1[:len(x)]
	w2 = w2[:len(x)]
	w3 = w3[:len(x)]
	for p, v := range x {
		s0 += v * w0[p]
		s1 += v * w1[p]
		s2 += v * w2[p]
		s3 += v * w3[p]
	}
	return
}

// gemvGo: y[j] = x[:k]·w[j*ldw : j*ldw+k] for j < n.
func gemvGo(n, k int, x, w []float32, ldw int, y []float32) {
	x = x[:k]
	j := 0
	for ; j+4 <= n; j += 4 {
		o := j * ldw
		y[j], y[j+1], y[j+2], y[j+3] = dot4Go(x, w[o:], w[o+ldw:], w[o+2*ldw:], w[o+3*ldw:])
	}
	for ; j < n; j++ {
		y[j] = dotGo(x, w[j*ldw:j*ldw+k])
	}
}

func matMulNTGo(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	if m == 1 {
		gemvGo(n, k, x, w, ldw, y)
		return
	}
	// Four x rows against one w row: each w element loaded feeds four
	// outputs.
	i := 0
	for ; i+4 <= m; i += 4 {
		x0 := x[i*ldx : i*ldx+k]
		x1 := x[(i+1)*ldx : (i+1)*ldx+k]
		x2 := x[(i+2)*ldx : (i+2)*ldx+k]
		x3 := x[(i+3)*ldx : (i+3)*ldx+k]
		for j := 0; j < n; j++ {
			wr := w[j*ldw : j*ldw+k]
			a, b, c, d := dot4Go(wr, x0, x1, x2, x3)
			y[i*ldy+j] = a
			y[(i+1)*ldy+j] = b
			y[(i+2)*ldy+j] = c
			y[(i+3)*ldy+j] = d
		}
	}
	for ; i < m; i++ {
		gemvGo(n, k, x[i*ldx:], w, ldw, y[i*ldy:])
	}
}

func matMulNNGo(m, n, k int, x []float32, ldx int, w []float32, ldw int, y []float32, ldy int) {
	for i := 0; i < m; i++ {
		yr := y[i*ldy : i*ldy+n]
		clear(yr)
		xr := x[i*ldx : i*ldx+k]
		// Four rows of w per pass over yr: a quarter of the y loads/stores.
		p := 0
		for ; p+4 <= k; p += 4 {
			v0, v1, v2, v3 := xr[p], xr[p+1], xr[p+2], xr[p+3]
			w0 := w[p*ldw : p*ldw+n]
			w1 := w[(p+1)*ldw : (p+1)*ldw+n]
			w2 := w[(p+2)*ldw : (p+2)*ldw+n]
			w3 := w[(p+3)*ldw : (p+3)*ldw+n]
			for j := range yr {
				yr[j] += v0*w0[j] + v1*w1[j] + v2*w2[j] + v3*w3[j]
			}
		}
		for ; p < k; p++ {
			axpyGo(xr[p], w[p*ldw:p*ldw+n], yr)
		}
	}
}

func sumSquaresGo(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return s
}

func scaleMulGo(out, x, w []float32, s float32) {
	x = x[:len(out)]
	w = w[:len(out)]
	for i := range out {
		out[i] = s * x[i] * w[i]
	}
}

func maxGo(x []float32) float32 {
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	return m
}

// expScaleSubSumGo sets x[i] = exp(alpha·x[i] − m) and returns the
// float32 sum. The product is exact in float64 and the argument is rounded
// to float32 once more (for alpha = 1 it is the float32 difference).
func expScaleSubSumGo(x []float32, alpha, m float32) float32 {
	var s float32
	for i, v := range x {
		e := expGo(float32(float64(alpha)*float64(v) - float64(m)))
		x[i] = e
		s += e
	}
	return s
}

func expSliceGo(x []float32) {
	for i, v := range x {
		x[i] = expGo(v)
	}
}

func siluMulGo(gate, up []float32) {
	up = up[:len(gate)]
	for i, g := range gate {
		gate[i] = g / (1 + expGo(-g)) * up[i]
	}
}

// rsqrtMean returns 1/sqrt(ss/n + eps) in float64 arithmetic.
func rsqrtMean(ss float64, n int, eps float32) float32 {
	return float32(1 / math.Sqrt(ss/float64(n)+float64(eps)))
}
