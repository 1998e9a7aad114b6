package gguf

// Temporary stand-in for h-ggufq's types.go (deleted when it merges).

import (
	"fmt"
	"strings"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

// Type is a ggml tensor type.
type Type uint32

// ggml tensor types.
const (
	TypeF32  Type = 0
	TypeF16  Type = 1
	TypeQ4_0 Type = 2
	TypeQ4_1 Type = 3
	TypeQ8_0 Type = 8
	TypeQ4_K Type = 12
	TypeQ6_K Type = 14
	TypeBF16 Type = 30
)

var tmpInfo = map[Type]struct {
	name          string
	block, nbytes int
}{
	TypeF32: {"F32", 1, 4}, TypeF16: {"F16", 1, 2}, TypeBF16: {"BF16", 1, 2},
	TypeQ4_0: {"Q4_0", 32, 18}, TypeQ4_1: {"Q4_1", 32, 20}, TypeQ8_0: {"Q8_0", 32, 34},
	TypeQ4_K: {"Q4_K", 256, 144}, TypeQ6_K: {"Q6_K", 256, 210},
}

func (t Type) String() string {
	if i, ok := tmpInfo[t]; ok {
		return i.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize is the number of values per block.
func (t Type) BlockSize() int { return tmpInfo[t].block }

// BlockBytes is the bytes per block.
func (t Type) BlockBytes() int { return tmpInfo[t].nbytes }

// RowBytes is the bytes of a row of n values.
func (t Type) RowBytes(n int) (int, error) {
	i, ok := tmpInfo[t]
	if !ok {
		return 0, fmt.Errorf("gguf: unknown type %d", uint32(t))
	}
	if n%i.block != 0 {
		return 0, fmt.Errorf("gguf: %s row of %d values: want a multiple of %d", i.name, n, i.block)
	}
	return n / i.block * i.nbytes, nil
}

// ErrNotExact stand-in.
var ErrNotExact = fmt.Errorf("gguf: no exact GGUF block type")

// Conversion stand-in.
type Conversion struct {
	Type      Type
	Exact     bool
	MaxAbsErr float64
	Reason    string
}

// FromQuantized stand-in: nothing is exact until h-ggufq lands.
func FromQuantized(q *weights.Quantized) ([]byte, Conversion, error) {
	return nil, Conversion{}, fmt.Errorf("%w: quantizers not merged yet", ErrNotExact)
}

// FromQuantizedAs stand-in.
func FromQuantizedAs(q *weights.Quantized, t Type) ([]byte, Conversion, error) {
	return nil, Conversion{}, fmt.Errorf("%w: quantizers not merged yet", ErrNotExact)
}

// Quantize stand-in: float types only.
func Quantize(t Type, src []float32, n int) ([]byte, error) {
	switch t {
	case TypeF32:
		return safetensors.F32Bytes(src), nil
	case TypeF16:
		return safetensors.F16Bytes(src), nil
	case TypeBF16:
		return safetensors.BF16Bytes(src), nil
	}
	return nil, fmt.Errorf("gguf: %v quantizer not merged yet", t)
}

// ParseType stand-in.
func ParseType(s string) (Type, error) {
	for t, i := range tmpInfo {
		if strings.EqualFold(i.name, s) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("gguf: unknown type %q", s)
}
