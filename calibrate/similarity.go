package calibrate

import (
	"fmt"
	"math"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/prune/depth"
)

// StatLoRP is the Header.Statistics name of the block-input cosine
// similarity matrix used by depth pruning (tensor SimilarityTensor).
const StatLoRP = "lorp"

// SimilarityTensor is the name of the similarity tensor: F64, [L+1, L+1],
// row-major. States 0..L−1 are the inputs of decoder blocks 0..L−1; state L
// is the output of the last block, i.e. the final-norm input, so that
// ShortGPT can also score the last block. Entry (i, j) is the mean over
// calibration tokens of cos(h_i, h_j) (depth.SimilarityAcc); LoRP uses the
// leading L×L block.
const SimilarityTensor = "lorp.similarity"

// simObserver is a runtime.BlockObserver feeding a depth.SimilarityAcc. It
// buffers the L+1 states of the current Forward call ([n, hidden] float32
// each) and adds them when the last block's output arrives, so memory is
// O(L·ctx·hidden) float32 whatever the number of calibration tokens.
type simObserver struct {
	acc    *depth.SimilarityAcc
	layers int
	hidden int
	n      int
	states [][]float32
	err    error
}

func newSimObserver(layers, hidden int) (*simObserver, error) {
	acc, err := depth.NewSimilarity(layers+1, hidden)
	if err != nil {
		return nil, fmt.Errorf("calibrate: similarity: %w", err)
	}
	return &simObserver{acc: acc, layers: layers, hidden: hidden, states: make([][]float32, layers+1)}, nil
}

func (s *simObserver) keep(i, n int, x []float32) {
	if i == 0 {
		s.n = n
	}
	s.states[i] = append(s.states[i][:0], x[:n*s.hidden]...)
}

// BlockInput implements runtime.BlockObserver.
func (s *simObserver) BlockInput(layer, pos, n int, x []float32) { s.keep(layer, n, x) }

// BlockOutput implements runtime.BlockObserver; the last block's output is
// state L and completes the batch.
func (s *simObserver) BlockOutput(layer, pos, n int, x []float32) {
	if layer != s.layers-1 {
		return
	}
	s.keep(s.layers, n, x)
	if s.err == nil {
		if err := s.acc.AddBatch(s.states, s.n); err != nil {
			s.err = fmt.Errorf("calibrate: similarity at position %d: %w", pos, err)
		}
	}
}

// both combines the OSCAR QKV observer and the similarity block observer.
type both struct {
	*oscarAcc
	*simObserver
}

// readSimilarity reads SimilarityTensor: F64, [m, m] with m = layers+1 when
// layers > 0 (any square shape otherwise), finite.
func readSimilarity(f *safetensors.File, path string, layers int) ([]float64, error) {
	want := 0
	if layers > 0 {
		want = layers + 1
	}
	m, n, err := readSquare(f, path, SimilarityTensor, want)
	if err != nil {
		return nil, err
	}
	if n < 2 {
		return nil, fmt.Errorf("calibrate: %s: tensor %q: side %d, want L+1 >= 2: %w", path, SimilarityTensor, n, ErrBadStatistic)
	}
	// Mean cosine similarities lie in [−1, 1] (float64 sums: allow 1e-9).
	for i, v := range m {
		if math.Abs(v) > 1+1e-9 {
			return nil, fmt.Errorf("calibrate: %s: tensor %q: element (%d, %d) is %v, outside [-1, 1] (not a cosine similarity): %w", path, SimilarityTensor, i/n, i%n, v, ErrBadStatistic)
		}
	}
	return m, nil
}
