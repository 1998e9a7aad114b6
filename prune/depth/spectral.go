package depth

import (
	"fmt"
	"math"
	"math/rand/v2"

	"gonum.org/v1/gonum/mat"
)

// SpectralOptions tunes [SpectralClusters]. The zero value uses the defaults.
type SpectralOptions struct {
	// Seed for the k-means++ initialisation; 0 is a valid seed.
	Seed uint64
	// Restarts is the number of k-means runs; the lowest-inertia run wins.
	// <= 0 means 10.
	Restarts int
	// MaxIter caps the Lloyd iterations of each run; <= 0 means 300.
	MaxIter int
}

// SpectralClusters partitions the m items of an affinity matrix into k
// clusters and returns [m] labels 0..k−1 numbered by first appearance
// (item 0 gets label 0; a new label is the next unused number).
//
// A is row-major [m*m], symmetric, non-negative; its diagonal is ignored
// (self-loops do not count towards the degree). The embedding follows the
// normalised-Laplacian spectral embedding of Shi–Malik / Ng–Jordan–Weiss as
// used by the LoRP reference (scikit-learn SpectralClustering with a
// precomputed affinity and k-means label assignment):
//
//	d_i = Σ_{j≠i} A_ij,  L_sym = I − D^{−1/2} A₀ D^{−1/2}
//	U = eigenvectors of L_sym for the k smallest eigenvalues
//	embedding row i = U_i / sqrt(d_i)   (no row normalisation)
//
// each eigenvector's sign fixed so that its largest-magnitude entry is
// positive; then k-means (k-means++ seeding with opt.Seed, opt.Restarts runs,
// Lloyd iterations, lowest inertia kept) on the m×k embedding. Deterministic
// for fixed inputs and options. k is clamped to m; fewer than k labels come
// back when the embedding has fewer than k distinct points.
//
// Errors: ErrShape (len(A) != m*m, k < 1), ErrNonFinite, ErrNotSimilarity
// (a negative entry, or an item with zero degree).
func SpectralClusters(A []float64, m, k int, opt SpectralOptions) ([]int, error) {
	if m < 1 || len(A) != m*m || k < 1 {
		return nil, fmt.Errorf("%w: spectral clustering of %d entries as %d×%d into %d clusters", ErrShape, len(A), m, m, k)
	}
	k = min(k, m)
	if m == 1 || k == 1 {
		return make([]int, m), nil
	}
	dd := make([]float64, m)
	for i := 0; i < m; i++ {
		var d float64
		for j := 0; j < m; j++ {
			v := A[i*m+j]
			if math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("%w: affinity[%d][%d] = %v", ErrNonFinite, i, j, v)
			}
			if v < 0 {
				return nil, fmt.Errorf("%w: affinity[%d][%d] = %g is negative", ErrNotSimilarity, i, j, v)
			}
			if i != j {
				d += v
			}
		}
		if d <= 0 {
			return nil, fmt.Errorf("%w: layer %d has zero affinity to every other layer", ErrNotSimilarity, i)
		}
		dd[i] = math.Sqrt(d)
	}
	// The k smallest eigenvalues of L_sym are the k largest of
	// N = D^{-1/2} A₀ D^{-1/2}; EigenSym returns ascending eigenvalues.
	N := mat.NewSymDense(m, nil)
	for i := 0; i < m; i++ {
		for j := i + 1; j < m; j++ {
			v := (A[i*m+j] + A[j*m+i]) / 2 / (dd[i] * dd[j])
			N.SetSym(i, j, v)
		}
	}
	var eig mat.EigenSym
	if !eig.Factorize(N, true) {
		return nil, fmt.Errorf("depth: spectral clustering: eigendecomposition of the %d×%d normalised affinity did not converge", m, m)
	}
	var vecs mat.Dense
	eig.VectorsTo(&vecs)
	emb := make([]float64, m*k) // [m][k]
	for c := 0; c < k; c++ {
		col := m - 1 - c
		// Sign convention: the largest-magnitude entry is positive.
		best, sign := 0.0, 1.0
		for i := 0; i < m; i++ {
			if v := vecs.At(i, col); math.Abs(v) > best {
				best = math.Abs(v)
				sign = math.Copysign(1, v)
			}
		}
		for i := 0; i < m; i++ {
			emb[i*k+c] = sign * vecs.At(i, col) / dd[i]
		}
	}
	labels := kmeans(emb, m, k, opt)
	return relabelByFirstAppearance(labels), nil
}

// relabelByFirstAppearance renumbers labels so that they appear as 0, 1, 2, …
// in index order.
func relabelByFirstAppearance(labels []int) []int {
	remap := map[int]int{}
	out := make([]int, len(labels))
	for i, c := range labels {
		r, ok := remap[c]
		if !ok {
			r = len(remap)
			remap[c] = r
		}
		out[i] = r
	}
	return out
}

// kmeans clusters the m points of x ([m][dim] row-major, dim = k) into k
// clusters: opt.Restarts runs of k-means++ seeding followed by Lloyd
// iterations; returns the labels of the run with the lowest inertia (the
// first such run on ties).
func kmeans(x []float64, m, k int, opt SpectralOptions) []int {
	restarts := opt.Restarts
	if restarts <= 0 {
		restarts = 10
	}
	maxIter := opt.MaxIter
	if maxIter <= 0 {
		maxIter = 300
	}
	dim := k
	rng := rand.New(rand.NewPCG(opt.Seed, 0x4c6f5250)) // second word: "LoRP"
	dist2 := func(p []float64, q []float64) float64 {
		var s float64
		for i := range p {
			d := p[i] - q[i]
			s += d * d
		}
		return s
	}
	point := func(i int) []float64 { return x[i*dim : (i+1)*dim] }

	var bestLabels []int
	bestInertia := math.Inf(1)
	centers := make([]float64, k*dim)
	counts := make([]int, k)
	d2 := make([]float64, m)
	for r := 0; r < restarts; r++ {
		// k-means++ seeding.
		copy(centers[:dim], point(rng.IntN(m)))
		for i := 0; i < m; i++ {
			d2[i] = dist2(point(i), centers[:dim])
		}
		for c := 1; c < k; c++ {
			var total float64
			for _, v := range d2 {
				total += v
			}
			pick := m - 1
			if total > 0 {
				u := rng.Float64() * total
				for i, v := range d2 {
					u -= v
					if u < 0 {
						pick = i
						break
					}
				}
			} else {
				pick = rng.IntN(m)
			}
			copy(centers[c*dim:(c+1)*dim], point(pick))
			for i := 0; i < m; i++ {
				d2[i] = min(d2[i], dist2(point(i), centers[c*dim:(c+1)*dim]))
			}
		}
		// Lloyd iterations.
		labels := make([]int, m)
		for i := range labels {
			labels[i] = -1
		}
		var inertia float64
		for it := 0; it < maxIter; it++ {
			changed := false
			inertia = 0
			for i := 0; i < m; i++ {
				bc, bd := 0, math.Inf(1)
				for c := 0; c < k; c++ {
					if d := dist2(point(i), centers[c*dim:(c+1)*dim]); d < bd {
						bc, bd = c, d
					}
				}
				if labels[i] != bc {
					labels[i] = bc
					changed = true
				}
				inertia += bd
			}
			if !changed {
				break
			}
			clear(centers)
			clear(counts)
			for i := 0; i < m; i++ {
				c := labels[i]
				counts[c]++
				for j, v := range point(i) {
					centers[c*dim+j] += v
				}
			}
			for c := 0; c < k; c++ {
				if counts[c] > 0 {
					for j := 0; j < dim; j++ {
						centers[c*dim+j] /= float64(counts[c])
					}
				}
			}
			// An empty cluster takes the point farthest from its centre,
			// which then leaves its old cluster.
			for c := 0; c < k; c++ {
				if counts[c] != 0 {
					continue
				}
				far, fd := -1, -1.0
				for i := 0; i < m; i++ {
					lc := labels[i]
					if counts[lc] < 2 {
						continue
					}
					if d := dist2(point(i), centers[lc*dim:(lc+1)*dim]); d > fd {
						far, fd = i, d
					}
				}
				if far < 0 {
					continue
				}
				counts[labels[far]]--
				labels[far] = c
				counts[c] = 1
				copy(centers[c*dim:(c+1)*dim], point(far))
			}
		}
		if inertia < bestInertia {
			bestInertia = inertia
			bestLabels = labels
		}
	}
	return bestLabels
}
