package width

import (
	"errors"
	"fmt"
	"math"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// Sentinel errors; every returned error wraps one of them with %w.
var (
	// ErrShape: a slice length or dimension that does not match the
	// documented shape.
	ErrShape = errors.New("width: shape mismatch")
	// ErrNonFinite: a NaN or ±Inf in an input.
	ErrNonFinite = errors.New("width: non-finite value")
	// ErrKeep: a keep count outside [1, F], or a kept-index list that is
	// empty, unsorted, repeated or out of range.
	ErrKeep = errors.New("width: invalid keep")
	// ErrNoData: statistics with no tokens, or whose H is all zero.
	ErrNoData = errors.New("width: no calibration data")
	// ErrNotPositiveDefinite: the damped H (or its kept block) has no
	// Cholesky factor; raise the damping.
	ErrNotPositiveDefinite = errors.New("width: damped H not positive definite")
	// ErrBudget: budget parameters outside their domain.
	ErrBudget = errors.New("width: invalid budget")
)

// FFNStats accumulates, in float64, the statistics of one FFN's down_proj
// that Putri's FFN stage needs (docs/METHODS.md §6):
//
//	H   = XᵀX           [F, F]  (sum over tokens, not divided by n)
//	XᵀY                 [F, D]  (sum over tokens)
//	e_r = mean_t Y[t,r]² [D]     (per-output-channel energy)
//
// where X [n, F] are the down_proj inputs (act(gate)·up) and Y [n, D] the
// down_proj outputs. Memory: 8·(F² + F·D + D) bytes (about 1.3 GiB for
// F=11008, D=4096). Not safe for concurrent use.
type FFNStats struct {
	f, d int
	n    int64
	h    []float64 // [F, F]; upper triangle filled by Add, lower ignored
	xty  []float64 // [F, D]
	ysq  []float64 // [D] Σ_t Y[t,r]²
}

// NewFFNStats returns empty statistics for an FFN with F intermediate
// channels (down_proj input width) and D hidden channels (output width).
// Errors: ErrShape when F or D is not positive.
func NewFFNStats(F, D int) (*FFNStats, error) {
	if F <= 0 || D <= 0 {
		return nil, fmt.Errorf("%w: FFN stats dims F=%d, D=%d, want both positive", ErrShape, F, D)
	}
	return &FFNStats{f: F, d: D, h: make([]float64, F*F), xty: make([]float64, F*D), ysq: make([]float64, D)}, nil
}

// NewFFNStatsFromMoments rebuilds statistics from stored moments (for
// example read back from a calibration file): h = XᵀX [F, F] row-major
// float64 (only the upper triangle is read), xty = XᵀY [F, D], energy = e
// [D] (means over tokens), tokens = n > 0. The slices are copied.
// Errors: ErrShape for wrong lengths or tokens ≤ 0, ErrNonFinite.
func NewFFNStatsFromMoments(F, D int, tokens int64, h, xty, energy []float64) (*FFNStats, error) {
	s, err := NewFFNStats(F, D)
	if err != nil {
		return nil, err
	}
	if tokens <= 0 {
		return nil, fmt.Errorf("%w: FFN stats token count %d, want positive", ErrShape, tokens)
	}
	if len(h) != F*F || len(xty) != F*D || len(energy) != D {
		return nil, fmt.Errorf("%w: FFN moments lengths H=%d XᵀY=%d energy=%d, want %d, %d, %d",
			ErrShape, len(h), len(xty), len(energy), F*F, F*D, D)
	}
	for name, v := range map[string][]float64{"H": h, "XᵀY": xty, "energy": energy} {
		if i := firstNonFinite64(v); i >= 0 {
			return nil, fmt.Errorf("%w: FFN moments %s element %d is %v", ErrNonFinite, name, i, v[i])
		}
	}
	copy(s.h, h)
	copy(s.xty, xty)
	for r, e := range energy {
		s.ysq[r] = e * float64(tokens)
	}
	s.n = tokens
	return s, nil
}

// F returns the intermediate width (down_proj input channels).
func (s *FFNStats) F() int { return s.f }

// D returns the hidden width (down_proj output channels).
func (s *FFNStats) D() int { return s.d }

// Tokens returns the number of token rows accumulated.
func (s *FFNStats) Tokens() int64 { return s.n }

// Add accumulates n tokens: x [n, F] float32 row-major, the down_proj
// inputs, and y [n, D] float32 row-major, the matching down_proj outputs.
// n = 0 is a no-op. On error nothing is accumulated.
// Errors: ErrShape (lengths), ErrNonFinite naming the tensor and [row, col].
func (s *FFNStats) Add(x, y []float32, n int) error {
	if n < 0 || len(x) != n*s.f || len(y) != n*s.d {
		return fmt.Errorf("%w: FFN stats Add: x has %d elements, y has %d, want n×F = %d×%d and n×D = %d×%d",
			ErrShape, len(x), len(y), n, s.f, n, s.d)
	}
	if i := firstNonFinite32(x); i >= 0 {
		return fmt.Errorf("%w: FFN stats Add: down_proj input x[%d, %d] is %v", ErrNonFinite, i/s.f, i%s.f, x[i])
	}
	if i := firstNonFinite32(y); i >= 0 {
		return fmt.Errorf("%w: FFN stats Add: down_proj output y[%d, %d] is %v", ErrNonFinite, i/s.d, i%s.d, y[i])
	}
	const chunk = 256
	m0 := min(n, chunk)
	xb := make([]float64, m0*s.f)
	yb := make([]float64, m0*s.d)
	for r0 := 0; r0 < n; r0 += chunk {
		m := min(chunk, n-r0)
		for i, v := range x[r0*s.f : (r0+m)*s.f] {
			xb[i] = float64(v)
		}
		for i, v := range y[r0*s.d : (r0+m)*s.d] {
			f := float64(v)
			yb[i] = f
			s.ysq[i%s.d] += f * f
		}
		X := blas64.General{Rows: m, Cols: s.f, Stride: s.f, Data: xb[:m*s.f]}
		Y := blas64.General{Rows: m, Cols: s.d, Stride: s.d, Data: yb[:m*s.d]}
		blas64.Syrk(blas.Trans, 1, X, 1, blas64.Symmetric{Uplo: blas.Upper, N: s.f, Stride: s.f, Data: s.h})
		blas64.Gemm(blas.Trans, blas.NoTrans, 1, X, Y, 1, blas64.General{Rows: s.f, Cols: s.d, Stride: s.d, Data: s.xty})
	}
	s.n += int64(n)
	return nil
}

// H returns a new copy of H = XᵀX, [F, F] float64 row-major, full symmetric.
func (s *FFNStats) H() []float64 {
	f := s.f
	out := make([]float64, f*f)
	for i := 0; i < f; i++ {
		for j := i; j < f; j++ {
			v := s.h[i*f+j]
			out[i*f+j], out[j*f+i] = v, v
		}
	}
	return out
}

// XTY returns a new copy of XᵀY, [F, D] float64 row-major.
func (s *FFNStats) XTY() []float64 { return append([]float64(nil), s.xty...) }

// Energy returns e_r = mean over tokens of Y[:, r]², [D] float64 (squared
// output units). With no tokens it is all zeros.
func (s *FFNStats) Energy() []float64 {
	out := make([]float64, s.d)
	if s.n == 0 {
		return out
	}
	for r, v := range s.ysq {
		out[r] = v / float64(s.n)
	}
	return out
}

func firstNonFinite32(v []float32) int {
	for i, x := range v {
		if x != x || x > math.MaxFloat32 || x < -math.MaxFloat32 {
			return i
		}
	}
	return -1
}

func firstNonFinite64(v []float64) int {
	for i, x := range v {
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return i
		}
	}
	return -1
}
