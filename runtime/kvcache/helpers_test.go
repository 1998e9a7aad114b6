package kvcache

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lmpack/lmpack/quantize/kvq"
	"github.com/lmpack/lmpack/runtime"
)

// randOrthogonal returns a random [d, d] orthogonal matrix (Gram–Schmidt
// on a Gaussian matrix, float64, twice for accuracy), row-major.
func randOrthogonal(rng *rand.Rand, d int) []float64 {
	q := make([]float64, d*d)
	for i := range q {
		q[i] = rng.NormFloat64()
	}
	for pass := 0; pass < 2; pass++ {
		for i := 0; i < d; i++ {
			ri := q[i*d : (i+1)*d]
			for j := 0; j < i; j++ {
				rj := q[j*d : (j+1)*d]
				var dot float64
				for c := range ri {
					dot += ri[c] * rj[c]
				}
				for c := range ri {
					ri[c] -= dot * rj[c]
				}
			}
			var n float64
			for _, x := range ri {
				n += x * x
			}
			n = math.Sqrt(n)
			for c := range ri {
				ri[c] /= n
			}
		}
	}
	return q
}

// matMul64 returns a·b for [d, d] row-major float64 matrices.
func matMul64(a, b []float64, d int) []float64 {
	out := make([]float64, d*d)
	for i := 0; i < d; i++ {
		for k := 0; k < d; k++ {
			for j := 0; j < d; j++ {
				out[i*d+j] += a[i*d+k] * b[k*d+j]
			}
		}
	}
	return out
}

func to32(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

// oscarRotation builds OSCAR's shipped composition R = U·H·P_br (docs/METHODS.md
// §1) for a covariance whose eigenvectors are the rows of q (eigenvalues
// descending in q's row order): U has those eigenvectors as columns.
func oscarRotation(q []float64, d int) []float32 {
	u := make([]float64, d*d) // U = qᵀ
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			u[i*d+j] = q[j*d+i]
		}
	}
	uh := matMul64(u, kvq.HadamardMatrix(d), d)
	// P_br: column i of U·H goes to column perm[i].
	perm := kvq.BitReversal(d)
	r := make([]float64, d*d)
	for i := 0; i < d; i++ {
		for c := 0; c < d; c++ {
			r[i*d+perm[c]] = uh[i*d+c]
		}
	}
	return to32(r)
}

// hadamardRotations returns Rotations with the normalized Hadamard matrix
// for every layer (an identity-ish, uncalibrated choice), the given INT2
// clipping ratios (0: none) and the widths of testBits.
func hadamardRotations(layers []Layer, clipK, clipV float64) *Rotations {
	r := &Rotations{}
	for i, l := range layers {
		h := to32(kvq.HadamardMatrix(l.HeadDim))
		r.K = append(r.K, h)
		r.V = append(r.V, h)
		bk, bv := testBits(i)
		r.BitsK, r.BitsV = append(r.BitsK, bk), append(r.BitsV, bv)
		if clipK > 0 {
			r.ClipK = append(r.ClipK, clipK)
			r.ClipV = append(r.ClipV, clipV)
		}
	}
	return r
}

// tokens returns [n, kvDim] Gaussian rows for each layer; channel c of
// every head has standard deviation std(c) (nil: 1).
func tokens(rng *rand.Rand, layers []Layer, n int, std func(c int) float64) [][]float32 {
	out := make([][]float32, len(layers))
	for i, l := range layers {
		d := l.NumKVHeads * l.HeadDim
		x := make([]float32, n*d)
		for t := 0; t < n; t++ {
			for j := 0; j < d; j++ {
				s := 1.0
				if std != nil {
					s = std(j % l.HeadDim)
				}
				x[t*d+j] = float32(s * rng.NormFloat64())
			}
		}
		out[i] = x
	}
	return out
}

// writeSteps writes tokens [start, start+n) of k, v (row t of k[i] is
// position t) into c: first min(prefill, n) tokens in one Write per layer,
// then one token per Write, committing after each step.
func writeSteps(c runtime.KVCache, layers []Layer, k, v [][]float32, start, n, prefill int) {
	pos := start
	for pos < start+n {
		t := 1
		if pos == start && prefill > 0 {
			t = min(prefill, n)
		}
		for i, l := range layers {
			d := l.NumKVHeads * l.HeadDim
			c.Write(i, pos, t, k[i][pos*d:(pos+t)*d], v[i][pos*d:(pos+t)*d])
		}
		c.Commit(t)
		pos += t
	}
}

// readAll returns layer i's tokens [0, n) as [n, kvDim] (heads put back in
// place) from c.Read.
func readAll(c runtime.KVCache, l Layer, i, n int) (k, v []float32) {
	hd, d := l.HeadDim, l.NumKVHeads*l.HeadDim
	k, v = make([]float32, n*d), make([]float32, n*d)
	kh, vh := make([]float32, n*hd), make([]float32, n*hd)
	for h := 0; h < l.NumKVHeads; h++ {
		c.Read(i, h, n, kh, vh)
		for t := 0; t < n; t++ {
			copy(k[t*d+h*hd:t*d+(h+1)*hd], kh[t*hd:(t+1)*hd])
			copy(v[t*d+h*hd:t*d+(h+1)*hd], vh[t*hd:(t+1)*hd])
		}
	}
	return k, v
}

// relErr returns ‖a−b‖/‖b‖ over the first n elements.
func relErr(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		e := float64(a[i]) - float64(b[i])
		num += e * e
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / den)
}

func mustNew(t testing.TB, name string, layers []Layer, capacity int, opt Options) runtime.KVCache {
	t.Helper()
	c, err := New(name, layers, capacity, opt)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return c
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, seed+1)) }
