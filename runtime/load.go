package runtime

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// loadF32 reads tensor name from src as float32, checks its shape against
// want, and checks every value is finite. Errors wrap ErrBadWeights and
// name the file, the tensor and what was expected.
func loadF32(src TensorSource, name string, want ...int) ([]float32, error) {
	t, err := floatTensor(src, name, want...)
	if err != nil {
		return nil, err
	}
	v, err := t.Float32()
	if err != nil {
		return nil, fmt.Errorf("runtime: %s: tensor %q: %w", t.File, name, err)
	}
	if err := checkFinite(t.File, name, v); err != nil {
		return nil, err
	}
	return v, nil
}

// floatTensor returns tensor name of src after checking that it is present,
// has shape want and a float dtype (F32, F16, BF16, F64, F8_E4M3,
// F8_E5M2). Errors wrap ErrBadWeights (safetensors.ErrMissingTensor too
// for a missing tensor) and name the file, the tensor and what was
// expected.
func floatTensor(src TensorSource, name string, want ...int) (*safetensors.Tensor, error) {
	t, err := src.Tensor(name)
	if err != nil {
		if errors.Is(err, safetensors.ErrMissingTensor) {
			return nil, fmt.Errorf("runtime: %w: tensor %q named by config.json is missing: %w", ErrBadWeights, name, err)
		}
		return nil, fmt.Errorf("runtime: tensor %q: %w", name, err)
	}
	if shape := t.Shape; !slices.Equal(shape, want) {
		return nil, fmt.Errorf("runtime: %w: %s: tensor %q: shape %v, want %v", ErrBadWeights, t.File, name, shape, want)
	}
	switch t.DType {
	case safetensors.F32, safetensors.F16, safetensors.BF16, safetensors.F64, safetensors.F8E4M3, safetensors.F8E5M2:
	default:
		return nil, fmt.Errorf("runtime: %w: %s: tensor %q: dtype %s, want a float dtype (F32, F16, BF16, F64, F8_E4M3, F8_E5M2); pre-quantized integer weights are not supported",
			ErrBadWeights, t.File, name, t.DType)
	}
	return t, nil
}

// checkFinite returns an error wrapping ErrBadWeights, naming the file,
// the tensor name and the element, when v (the tensor's values) holds a NaN
// or ±Inf.
func checkFinite(file, name string, v []float32) error {
	if i := FirstNonFinite(v); i >= 0 {
		what := "NaN"
		if math.IsInf(float64(v[i]), 0) {
			what = "Inf"
		}
		return fmt.Errorf("runtime: %w: %s: tensor %q: element %d is %s (checked at load)", ErrBadWeights, file, name, i, what)
	}
	return nil
}

// FirstNonFinite returns the index of the first NaN or ±Inf in v (any
// float32 vector: weights, logits), or -1 when every element is finite.
func FirstNonFinite(v []float32) int {
	for i, x := range v {
		// x-x is NaN for NaN and ±Inf, 0 otherwise.
		if x-x != 0 {
			return i
		}
	}
	return -1
}
