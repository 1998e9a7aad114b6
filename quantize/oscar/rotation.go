package oscar

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/quantize/kvq"
	"gonum.org/v1/gonum/mat"
)

// Published default clipping ratios (docs/METHODS.md §1), for INT2 only:
// per rotated (token, head) row, τ = sorted(|x|)[⌊ratio·d⌋] and x is
// clamped to [−τ, τ] before INT2 quantisation. 4- and 8-bit sides do not
// clip unless ratios are given for them (RotationHeader.ClipK4 …) or
// searched (KVOptions.ClipSearch).
const (
	DefaultClipK = 0.96
	DefaultClipV = 0.92
)

// ErrBadCovariance is wrapped by Rotation when the covariance cannot be
// decomposed: wrong length, head_dim not a power of two, NaN/Inf, or an
// eigendecomposition that does not converge.
var ErrBadCovariance = errors.New("bad covariance")

// Rotation returns the OSCAR rotation of the symmetric covariance cov
// ([d, d] row-major float64; only (cov + covᵀ)/2 is used) and its
// eigenvalues in descending order (λ_0 ≥ λ_1 ≥ … ≥ λ_{d−1}).
//
// R is [d, d] row-major float64, orthogonal, applied to row vectors:
// x_rot = x·R, x_rot[j] = Σ_a x[a]·R[a*d+j]. It is R = U·H·P_br with
//
//   - U the eigenvectors as columns, column i the eigenvector of λ_i
//     (descending), each with its largest-magnitude component positive
//     (the first such component on ties), so the result is deterministic;
//   - H the normalised Walsh–Hadamard matrix in Sylvester order
//     (kvq.HadamardMatrix), H[i][j] = (−1)^popcount(i AND j)/√d;
//   - P_br the bit-reversal permutation matrix with P_br[i][br(i)] = 1,
//     br = kvq.BitReversal(d).
//
// So column br(i) of R is U·h_i (h_i the i-th column of H), i.e.
// R[a*d+br(i)] = Σ_m U[a][m]·H[m][i]: the i-th largest eigen-direction's
// Hadamard pattern lands at coordinate bitreverse(i), as docs/METHODS.md §1
// states ("P_br places the i-th largest eigen-direction at position
// bitreverse(i)"). Rᵀ·cov·R then has the equal diagonal trace(cov)/d.
//
// Against the reference (compute_kv_rotation.py, make_br_perm_matrix and
// compose_rotation "r_h_pbr"): there U comes from torch.linalg.eigh
// (ascending), perm[br[i]] = argsort(λ, descending)[i] and P = I[:, perm],
// so column br(i) of its R is U_asc·h_{d−1−i} = U_desc·J·h_{d−1−i}. Since
// H[d−1−m][d−1−i] = ±H[m][i] with a sign that factors into a sign per m and
// a sign per i, that column equals ±(U_desc·D)·h_i with D a fixed diagonal
// of ±1: the same construction with other eigenvector signs (which no
// eigensolver fixes) and column signs. TestReferenceConvention checks this.
//
// Errors (ErrBadCovariance): len(cov) != d·d; d not a power of two (the
// Hadamard transform needs one); NaN/Inf in cov; no convergence.
func Rotation(cov []float64, d int) (R []float64, eigenvalues []float64, err error) {
	if d <= 0 || len(cov) != d*d {
		return nil, nil, fmt.Errorf("oscar: covariance has %d values, want head_dim² = %d×%d: %w", len(cov), d, d, ErrBadCovariance)
	}
	if d&(d-1) != 0 {
		return nil, nil, fmt.Errorf("oscar: head_dim %d is not a power of two (the Walsh–Hadamard factor needs one): %w", d, ErrBadCovariance)
	}
	sym := make([]float64, d*d)
	var trace float64
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			a, b := cov[i*d+j], cov[j*d+i]
			if math.IsNaN(a) || math.IsInf(a, 0) {
				return nil, nil, fmt.Errorf("oscar: covariance element (%d, %d) is %v: %w", i, j, a, ErrBadCovariance)
			}
			// A covariance is symmetric: allow float64 rounding only.
			if math.Abs(a-b) > 1e-9*(math.Abs(a)+math.Abs(b))+1e-300 {
				return nil, nil, fmt.Errorf("oscar: covariance is not symmetric: (%d, %d) = %g but (%d, %d) = %g: %w", i, j, a, j, i, b, ErrBadCovariance)
			}
			sym[i*d+j] = (a + b) / 2
		}
		if c := cov[i*d+i]; c < 0 {
			return nil, nil, fmt.Errorf("oscar: covariance diagonal (%d, %d) is %g < 0: %w", i, i, c, ErrBadCovariance)
		}
		trace += cov[i*d+i]
	}
	if trace <= 0 {
		return nil, nil, fmt.Errorf("oscar: covariance is all zero (no calibration data reached this layer): %w", ErrBadCovariance)
	}
	var es mat.EigenSym
	if !es.Factorize(mat.NewSymDense(d, sym), true) {
		return nil, nil, fmt.Errorf("oscar: symmetric eigendecomposition of a %d×%d covariance did not converge: %w", d, d, ErrBadCovariance)
	}
	asc := es.Values(nil)
	var vecs mat.Dense
	es.VectorsTo(&vecs)
	// order[i]: the column of vecs holding the i-th largest eigenvalue;
	// ties keep the higher column first (the reverse of eigh's order).
	order := make([]int, d)
	for i := range order {
		order[i] = d - 1 - i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(asc[b], asc[a]) })
	u := make([]float64, d*d) // U: column i = eigenvector of λ_i
	eigenvalues = make([]float64, d)
	for i, c := range order {
		eigenvalues[i] = asc[c]
		big, sign := 0.0, 1.0
		for a := 0; a < d; a++ {
			if x := vecs.At(a, c); math.Abs(x) > big {
				big, sign = math.Abs(x), math.Copysign(1, x)
			}
		}
		for a := 0; a < d; a++ {
			u[a*d+i] = sign * vecs.At(a, c)
		}
	}
	h := kvq.HadamardMatrix(d)
	br := kvq.BitReversal(d)
	R = make([]float64, d*d)
	for a := 0; a < d; a++ {
		for i := 0; i < d; i++ {
			var s float64
			for m := 0; m < d; m++ {
				s += u[a*d+m] * h[m*d+i]
			}
			R[a*d+br[i]] = s
		}
	}
	return R, eigenvalues, nil
}

// Rotations are the per-layer KV rotations and clipping ratios a quantized
// KV cache applies: keys and queries are multiplied by K[l] after RoPE,
// values by V[l] (x_rot = x·R). K[l] and V[l] are [head_dim*head_dim]
// row-major float32; ClipK[l], ClipV[l] are the 2-bit sides' ratios in
// (0, 1], ClipK4 … ClipV8 those of the 4- and 8-bit sides (nil: no
// clipping); BitsK[l], BitsV[l] the widths of a mixed-width cache (nil:
// none chosen). Its fields match runtime/kvcache's Rotations, so one
// converts to the other.
type Rotations struct {
	K, V                           [][]float32
	ClipK, ClipV                   []float64
	ClipK4, ClipV4, ClipK8, ClipV8 []float64
	BitsK, BitsV                   []int
}

// Layer is one layer's rotations in float64, with the eigenvalues of C_Q
// (EigK) and C_S (EigV), descending.
type Layer struct {
	HeadDim    int
	RK, RV     []float64 // [d, d] row-major
	EigK, EigV []float64 // [d]
}

// Compute returns the OSCAR rotations of every layer of a calibration's
// "oscar" statistics: RK from C_Q and RV from C_S (Rotation). Errors: a
// layer's Rotation error, naming the layer and the statistic.
func Compute(layers []calibrate.OSCARLayer) ([]Layer, error) {
	out := make([]Layer, len(layers))
	for l, c := range layers {
		rk, ek, err := Rotation(c.CQ, c.HeadDim)
		if err != nil {
			return nil, fmt.Errorf("oscar: layer %d: C_Q: %w", l, err)
		}
		rv, ev, err := Rotation(c.CS, c.HeadDim)
		if err != nil {
			return nil, fmt.Errorf("oscar: layer %d: C_S: %w", l, err)
		}
		out[l] = Layer{HeadDim: c.HeadDim, RK: rk, RV: rv, EigK: ek, EigV: ev}
	}
	return out, nil
}

// Orthogonality returns max|R·Rᵀ − I| over all elements, for R [d, d]
// row-major (float32 or float64 values).
func Orthogonality[F float32 | float64](r []F, d int) float64 {
	var worst float64
	for i := 0; i < d; i++ {
		for j := 0; j < d; j++ {
			var s float64
			for k := 0; k < d; k++ {
				s += float64(r[i*d+k]) * float64(r[j*d+k])
			}
			if i == j {
				s--
			}
			worst = max(worst, math.Abs(s))
		}
	}
	return worst
}

// CheckClip returns an error unless ratio is in (0, 1]; name is the field
// for the message ("clip_k").
func CheckClip(name string, ratio float64) error {
	if !(ratio > 0 && ratio <= 1) {
		return fmt.Errorf("oscar: %s %v: want a ratio in (0, 1]", name, ratio)
	}
	return nil
}
