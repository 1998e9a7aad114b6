package safetensors

// DType is the element type of a tensor, spelled as in the safetensors
// header's "dtype" field (for example "F32", "BF16", "F8_E4M3").
// All multi-byte types are stored little endian.
type DType string

// The element types this package reads and writes. Size gives the bytes per
// element; Tensor.Float32 converts each of them to float32 (see there for the
// exact rules).
const (
	F64    DType = "F64"     // IEEE 754 binary64.
	F32    DType = "F32"     // IEEE 754 binary32.
	F16    DType = "F16"     // IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
	BF16   DType = "BF16"    // bfloat16: the upper 16 bits of a binary32.
	F8E4M3 DType = "F8_E4M3" // OCP FP8 E4M3 ("E4M3FN"): bias 7, no infinities, NaN 0x7f/0xff, max 448.
	F8E5M2 DType = "F8_E5M2" // OCP FP8 E5M2: bias 15, IEEE-style infinities and NaNs, max 57344.
	I64    DType = "I64"     // Two's-complement signed 64-bit integer.
	I32    DType = "I32"     // Two's-complement signed 32-bit integer.
	I16    DType = "I16"     // Two's-complement signed 16-bit integer.
	I8     DType = "I8"      // Two's-complement signed 8-bit integer.
	U64    DType = "U64"     // Unsigned 64-bit integer.
	U32    DType = "U32"     // Unsigned 32-bit integer.
	U16    DType = "U16"     // Unsigned 16-bit integer.
	U8     DType = "U8"      // Unsigned 8-bit integer.
	Bool   DType = "BOOL"    // One byte per element; 0 is false, anything else true.
)

// dtypeSizes maps every supported DType to its element size in bytes.
var dtypeSizes = map[DType]int{
	F64: 8, F32: 4, F16: 2, BF16: 2, F8E4M3: 1, F8E5M2: 1,
	I64: 8, I32: 4, I16: 2, I8: 1,
	U64: 8, U32: 4, U16: 2, U8: 1,
	Bool: 1,
}

// Size returns the number of bytes one element of d occupies, or 0 when d is
// not a dtype this package supports (see Valid).
func (d DType) Size() int { return dtypeSizes[d] }

// Valid reports whether d is one of the dtypes this package supports.
func (d DType) Valid() bool { return dtypeSizes[d] != 0 }

// IsFloat reports whether d is a floating-point dtype (F64, F32, F16,
// BF16, F8_E4M3, F8_E5M2): the dtypes the runtime loads as weights
// (integer tensors only serve as quantized weights' storage).
func (d DType) IsFloat() bool {
	switch d {
	case F64, F32, F16, BF16, F8E4M3, F8E5M2:
		return true
	}
	return false
}

// String returns the header spelling of d.
func (d DType) String() string { return string(d) }
