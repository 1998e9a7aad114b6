package depth

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/floats"
)

// SimilarityAcc accumulates, over calibration tokens, the L×L matrix of mean
// cosine similarities between the input hidden states of the L decoder blocks
// (LoRP eq. 3–4, docs/METHODS.md §5):
//
//	S_ij = (1/T) Σ_t cos(h_i(t), h_j(t)),   h_i(t) ∈ R^hidden, float32
//
// Each token vector is ℓ2-normalised in float64 and the per-token dot products
// and the running sums are float64. A zero vector has no direction; its
// cosine with anything is taken as 0.
//
// To also score the last block for ShortGPT, create the accumulator with L+1
// states and pass the final-norm input as state L.
//
// A SimilarityAcc is not safe for concurrent use; give each worker its own
// and combine them with [SimilarityAcc.Merge].
type SimilarityAcc struct {
	layers, hidden int
	tokens         int64
	sum            []float64 // [layers*layers], upper triangle (i <= j) used
	buf            []float64 // [layers*hidden] normalised vectors of one token
}

// simBlock is the hidden-dimension block of the pairwise dot products.
const simBlock = 512

// NewSimilarity returns an empty accumulator for `layers` hidden states of
// width `hidden` per token. Errors (ErrShape) when either is < 1.
func NewSimilarity(layers, hidden int) (*SimilarityAcc, error) {
	if layers < 1 || hidden < 1 {
		return nil, fmt.Errorf("%w: similarity accumulator needs layers >= 1 and hidden >= 1, got %d and %d",
			ErrShape, layers, hidden)
	}
	return &SimilarityAcc{
		layers: layers,
		hidden: hidden,
		sum:    make([]float64, layers*layers),
		buf:    make([]float64, layers*hidden),
	}, nil
}

// Layers returns the number of states per token (the matrix side).
func (a *SimilarityAcc) Layers() int { return a.layers }

// Hidden returns the width of each state.
func (a *SimilarityAcc) Hidden() int { return a.hidden }

// Tokens returns the number of tokens accumulated so far.
func (a *SimilarityAcc) Tokens() int64 { return a.tokens }

// Add accumulates one token: h is [layers][hidden] float32, h[i] the input of
// block i for that token. Errors (ErrShape, ErrNonFinite) leave the
// accumulator unchanged.
func (a *SimilarityAcc) Add(h [][]float32) error {
	return a.AddBatch(h, 1)
}

// AddBatch accumulates n tokens at once: h is [layers][n*hidden] float32, with
// h[i][t*hidden:(t+1)*hidden] the input of block i for token t (the row-major
// [n, hidden] activation of one block). Errors (ErrShape, ErrNonFinite) leave
// the accumulator unchanged; the whole batch is checked before any of it is
// added.
func (a *SimilarityAcc) AddBatch(h [][]float32, n int) error {
	L, d := a.layers, a.hidden
	if n < 0 || len(h) != L {
		return fmt.Errorf("%w: similarity: got %d states of a batch of %d tokens, want %d", ErrShape, len(h), n, L)
	}
	for i, row := range h {
		if len(row) != n*d {
			return fmt.Errorf("%w: similarity: state %d has %d values, want %d tokens × %d hidden",
				ErrShape, i, len(row), n, d)
		}
		for k, v := range row {
			if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
				return fmt.Errorf("%w: similarity: state %d token %d element %d = %v", ErrNonFinite, i, k/d, k%d, v)
			}
		}
	}
	for t := 0; t < n; t++ {
		for i := 0; i < L; i++ {
			src := h[i][t*d : (t+1)*d]
			dst := a.buf[i*d : (i+1)*d]
			var ss float64
			for k, v := range src {
				f := float64(v)
				dst[k] = f
				ss += f * f
			}
			if ss > 0 {
				floats.Scale(1/math.Sqrt(ss), dst)
			}
		}
		// Column blocks keep the L slices of one block in L2 across the
		// L(L−1)/2 dot products.
		for c0 := 0; c0 < d; c0 += simBlock {
			c1 := min(c0+simBlock, d)
			for i := 0; i < L; i++ {
				hi := a.buf[i*d+c0 : i*d+c1]
				row := a.sum[i*L:]
				for j := i + 1; j < L; j++ {
					row[j] += floats.Dot(hi, a.buf[j*d+c0:j*d+c1])
				}
			}
		}
	}
	a.tokens += int64(n)
	return nil
}

// Merge adds the sums of b (same layers and hidden, else ErrShape) into a.
func (a *SimilarityAcc) Merge(b *SimilarityAcc) error {
	if b.layers != a.layers || b.hidden != a.hidden {
		return fmt.Errorf("%w: similarity: merging %d×%d into %d×%d", ErrShape, b.layers, b.hidden, a.layers, a.hidden)
	}
	floats.Add(a.sum, b.sum)
	a.tokens += b.tokens
	return nil
}

// Matrix returns S as a new row-major [layers*layers] float64 slice:
// symmetric, diagonal exactly 1, off-diagonal the mean cosine over all
// tokens. Errors with ErrNoTokens before any token was added.
func (a *SimilarityAcc) Matrix() ([]float64, error) {
	if a.tokens == 0 {
		return nil, fmt.Errorf("%w: similarity matrix of %d states", ErrNoTokens, a.layers)
	}
	L := a.layers
	S := make([]float64, L*L)
	inv := 1 / float64(a.tokens)
	for i := 0; i < L; i++ {
		S[i*L+i] = 1
		for j := i + 1; j < L; j++ {
			v := a.sum[i*L+j] * inv
			S[i*L+j], S[j*L+i] = v, v
		}
	}
	return S, nil
}
