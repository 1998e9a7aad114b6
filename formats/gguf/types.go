// GGUF tensor data types (the package comment is in writer.go). The types
// and their block layouts (this file and quant*.go) follow
// llama.cpp's ggml-common.h (the block_* structs) and ggml-quants.c (the
// reference quantizers quantize_row_*_ref and dequantize_row_*), which
// define the format; the enum values are ggml.h's enum ggml_type.

package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	goruntime "runtime"
	"strings"
	"sync"

	"github.com/lmpack/lmpack/formats/safetensors"
)

// Type is a ggml tensor type: the values of ggml.h's enum ggml_type, as
// stored in a GGUF tensor info.
type Type uint32

// The tensor types this package encodes and decodes. Block layouts are
// those of ggml-common.h; all multi-byte fields are little-endian and
// "fp16" is IEEE 754 binary16.
const (
	// TypeF32: one float32 per element (4 bytes).
	TypeF32 Type = 0
	// TypeF16: one fp16 per element (2 bytes).
	TypeF16 Type = 1
	// TypeQ4_0: block_q4_0, 32 elements in 18 bytes: fp16 d, then 16 bytes
	// qs; element j (j < 16) is the low nibble of qs[j], element j+16 its
	// high nibble; x = d·(nibble − 8).
	TypeQ4_0 Type = 2
	// TypeQ4_1: block_q4_1, 32 elements in 20 bytes: fp16 d, fp16 m, then
	// 16 bytes qs with the nibble order of Q4_0; x = d·nibble + m.
	TypeQ4_1 Type = 3
	// TypeQ8_0: block_q8_0, 32 elements in 34 bytes: fp16 d, then 32 int8
	// qs; x = d·qs[j].
	TypeQ8_0 Type = 8
	// TypeQ4_K: block_q4_K, 256 elements in 144 bytes: fp16 d, fp16 dmin,
	// 12 bytes of 6-bit sub-block scales and mins (see scaleMinK4), 128
	// bytes qs. Sub-block j (32 elements) has x = d·sc_j·nibble − dmin·m_j;
	// 64-element chunk c holds sub-block 2c in the low nibbles of
	// qs[32c : 32c+32] and sub-block 2c+1 in their high nibbles.
	TypeQ4_K Type = 12
	// TypeQ6_K: block_q6_K, 256 elements in 210 bytes: 128 bytes ql (low 4
	// bits), 64 bytes qh (high 2 bits), 16 int8 sub-block scales, fp16 d.
	// Sub-block j (16 elements) has x = d·scales[j]·(q − 32), q ∈ [0, 63];
	// see q6KIndex for where each element's bits live.
	TypeQ6_K Type = 14
	// TypeBF16: one bfloat16 (the high half of a float32) per element.
	TypeBF16 Type = 30
)

// QK_K is the super-block size of the k-quants (ggml-common.h QK_K).
const QK_K = 256

// Errors; returned errors wrap one of these (test with errors.Is).
var (
	// ErrType: a Type this package does not encode or decode, or a type
	// name ParseType does not know.
	ErrType = errors.New("gguf: unsupported tensor type")
	// ErrShape: a row length that is not positive or not a multiple of the
	// type's block size, or data whose length is not a whole number of rows
	// (truncated or over-long tensor data).
	ErrShape = errors.New("gguf: shape mismatch")
	// ErrValue: a non-finite input value, a value whose block scale does
	// not fit in fp16, or a code out of range.
	ErrValue = errors.New("gguf: value out of range")
)

type typeInfo struct {
	name        string
	block, size int
}

var types = map[Type]typeInfo{
	TypeF32:  {"F32", 1, 4},
	TypeF16:  {"F16", 1, 2},
	TypeBF16: {"BF16", 1, 2},
	TypeQ4_0: {"Q4_0", 32, 18},
	TypeQ4_1: {"Q4_1", 32, 20},
	TypeQ8_0: {"Q8_0", 32, 34},
	TypeQ4_K: {"Q4_K", QK_K, 144},
	TypeQ6_K: {"Q6_K", QK_K, 210},
}

// Types lists the supported types in enum order.
func Types() []Type {
	return []Type{TypeF32, TypeF16, TypeQ4_0, TypeQ4_1, TypeQ8_0, TypeQ4_K, TypeQ6_K, TypeBF16}
}

// String returns ggml's name of the type ("F32", "Q4_K", ...), or
// "Type(N)" for a value this package does not support.
func (t Type) String() string {
	if ti, ok := types[t]; ok {
		return ti.name
	}
	return fmt.Sprintf("Type(%d)", uint32(t))
}

// ParseType returns the type named s, case-insensitively ("q8_0", "Q8_0",
// "f16", "bf16", "q4_k", ...). Errors: ErrType naming s and the known names.
func ParseType(s string) (Type, error) {
	for _, t := range Types() {
		if strings.EqualFold(s, types[t].name) {
			return t, nil
		}
	}
	names := make([]string, 0, len(types))
	for _, t := range Types() {
		names = append(names, strings.ToLower(types[t].name))
	}
	return 0, fmt.Errorf("%w: %q, want one of %s", ErrType, s, strings.Join(names, ", "))
}

// BlockSize returns the elements per block: 1 for the float types, 32 for
// Q4_0, Q4_1 and Q8_0, QK_K = 256 for Q4_K and Q6_K; 0 for an unsupported
// type.
func (t Type) BlockSize() int { return types[t].block }

// BlockBytes returns the bytes per block (ggml-common.h's sizeof(block_*)):
// F32 4, F16/BF16 2, Q4_0 18, Q4_1 20, Q8_0 34, Q4_K 144, Q6_K 210; 0 for
// an unsupported type.
func (t Type) BlockBytes() int { return types[t].size }

// RowBytes returns the bytes one row of n elements takes,
// n/BlockSize·BlockBytes. Errors: ErrType for an unsupported type, ErrShape
// when n ≤ 0, n is not a multiple of BlockSize (k-quants need rows that
// are multiples of 256) or the row would exceed 2^31 bytes.
func (t Type) RowBytes(n int) (int, error) {
	ti, ok := types[t]
	if !ok {
		return 0, fmt.Errorf("%w: %v", ErrType, t)
	}
	if n <= 0 || n%ti.block != 0 {
		return 0, fmt.Errorf("%w: row of %d elements, %v needs a positive multiple of %d", ErrShape, n, t, ti.block)
	}
	if n/ti.block > math.MaxInt32/ti.size {
		return 0, fmt.Errorf("%w: row of %d elements is too long (over 2^31 bytes of %v)", ErrShape, n, t)
	}
	return n / ti.block * ti.size, nil
}

// Quantize encodes src, row-major rows of n elements (len(src) a positive
// multiple of n), into t's blocks, rows one after another (each row
// RowBytes(n) bytes). The quantized types follow llama.cpp's reference
// quantizers (quantize_row_*_ref in ggml-quants.c, what llama-quantize uses
// without an importance matrix); F16 and BF16 round to nearest even.
//
// Large inputs are encoded on up to GOMAXPROCS goroutines; the bytes do
// not depend on it. Errors: ErrType; ErrShape (n, or len(src) not a
// multiple of n); ErrValue naming the element for a NaN or ±Inf input, or for a value beyond fp16's
// range (F16) or whose block scale exceeds it (quantized types).
func Quantize(t Type, src []float32, n int) ([]byte, error) {
	rb, err := t.RowBytes(n)
	if err != nil {
		return nil, err
	}
	if len(src) == 0 || len(src)%n != 0 {
		return nil, fmt.Errorf("%w: %d values are not whole rows of %d", ErrShape, len(src), n)
	}
	for i, v := range src {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%w: element [%d, %d] is %v", ErrValue, i/n, i%n, v)
		}
	}
	rows := len(src) / n
	dst := make([]byte, rows*rb)
	var enc func(dst []byte, x []float32) error
	switch t {
	case TypeF32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
		return dst, nil
	case TypeF16:
		for i, v := range src {
			h := safetensors.F16FromFloat32(v)
			if h&0x7c00 == 0x7c00 {
				return nil, fmt.Errorf("%w: element [%d, %d] = %g is beyond fp16's range (±65504)", ErrValue, i/n, i%n, v)
			}
			binary.LittleEndian.PutUint16(dst[2*i:], h)
		}
		return dst, nil
	case TypeBF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], safetensors.BF16FromFloat32(v))
		}
		return dst, nil
	case TypeQ8_0:
		enc = quantizeQ8_0
	case TypeQ4_0:
		enc = quantizeQ4_0
	case TypeQ4_1:
		enc = quantizeQ4_1
	case TypeQ4_K:
		enc = quantizeQ4K
	case TypeQ6_K:
		enc = quantizeQ6K
	}
	bs, bb := t.BlockSize(), t.BlockBytes()
	nb := len(src) / bs
	// Blocks are independent: split them over up to GOMAXPROCS goroutines
	// (the output does not depend on the split). Each part reports its
	// first failing block; the lowest one is returned.
	parts := min(goruntime.GOMAXPROCS(0), max(1, len(src)/(1<<16)), nb)
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for k := 0; k < parts; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			for b := k * nb / parts; b < (k+1)*nb/parts; b++ {
				if err := enc(dst[b*bb:(b+1)*bb], src[b*bs:(b+1)*bs]); err != nil {
					e := b * bs
					errs[k] = fmt.Errorf("%v block at element [%d, %d]: %w", t, e/n, e%n, err)
					return
				}
			}
		}(k)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return dst, nil
}

// Dequantize decodes data of type t, rows of n elements each RowBytes(n)
// bytes, into float32 (rows·n values, row-major), computing as llama.cpp's
// dequantize_row_* does (float32 products of the fp16 scales and the
// integer codes).
//
// Errors: ErrType; ErrShape when n is not a valid row length or len(data)
// is not a positive multiple of RowBytes(n) (truncated data).
func Dequantize(t Type, data []byte, n int) ([]float32, error) {
	rb, err := t.RowBytes(n)
	if err != nil {
		return nil, err
	}
	if len(data) == 0 || len(data)%rb != 0 {
		return nil, fmt.Errorf("%w: %d bytes of %v are not whole rows of %d elements (%d bytes each)", ErrShape, len(data), t, n, rb)
	}
	rows := len(data) / rb
	dst := make([]float32, rows*n)
	var dec func(dst []float32, b []byte)
	switch t {
	case TypeF32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		return dst, nil
	case TypeF16:
		for i := range dst {
			dst[i] = safetensors.F16ToFloat32(binary.LittleEndian.Uint16(data[2*i:]))
		}
		return dst, nil
	case TypeBF16:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(data[2*i:])) << 16)
		}
		return dst, nil
	case TypeQ8_0:
		dec = dequantizeQ8_0
	case TypeQ4_0:
		dec = dequantizeQ4_0
	case TypeQ4_1:
		dec = dequantizeQ4_1
	case TypeQ4_K:
		dec = dequantizeQ4K
	case TypeQ6_K:
		dec = dequantizeQ6K
	}
	bs, bb := t.BlockSize(), t.BlockBytes()
	for b := 0; b < len(dst)/bs; b++ {
		dec(dst[b*bs:(b+1)*bs], data[b*bb:(b+1)*bb])
	}
	return dst, nil
}

// halfFinite reports whether fp16 bits h are a finite value.
func halfFinite(h uint16) bool { return h&0x7c00 != 0x7c00 }
