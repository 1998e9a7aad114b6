package pack

import (
	"fmt"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// checkFinite refuses a tensor holding NaN or ±Inf: the runtime refuses to
// load one (runtime.ErrBadWeights), so an artifact holding it would not be
// loadable. Errors wrap ErrFormat and name the tensor and the flat index.
func checkFinite(name string, dtype safetensors.DType, data []byte) error {
	if i, what := safetensors.FirstNonFinite(dtype, data); i >= 0 {
		return fmt.Errorf("tensor %q (%s): element %d (row-major) is %s; the runtime refuses non-finite weights, so the artifact would not load: %w", name, dtype, i, what, ErrFormat)
	}
	return nil
}
