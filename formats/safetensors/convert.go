package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Tensor is a view of one tensor's bytes. Tensors returned by File.Tensor and
// Checkpoint.Tensor alias the file's read-only memory map (zero copy): Data
// must not be written and must not be used after the File is closed.
//
// Data holds NumElements() elements of DType, little endian, row-major
// (C order) over Shape. A 0-d tensor has an empty Shape and one element.
type Tensor struct {
	Name  string // tensor name as in the header
	File  string // path of the file it came from (for messages)
	DType DType
	Shape []int
	Data  []byte
}

// NumElements returns the product of Shape (1 for a 0-d tensor).
func (t *Tensor) NumElements() int { return numElements(t.Shape) }

// Float32 returns the tensor's values converted to a new []float32 of
// NumElements() values (row-major over Shape). See Float32Into for the
// conversion rules and errors.
func (t *Tensor) Float32() ([]float32, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	dst := make([]float32, t.NumElements())
	decodeFloat32(dst, t.Data, t.DType)
	return dst, nil
}

// Float32Into converts the tensor's values into dst, which must have exactly
// NumElements() elements.
//
// Conversion: F32 is copied; F16, BF16, F8_E4M3 and F8_E5M2 are widened
// exactly (every value of these formats is representable in float32,
// including subnormals, ±Inf and NaN; FP8 follows the OCP 8-bit floating
// point specification v1.0: E4M3 has bias 7, no infinities, NaN only for
// S.1111.111, max 448; E5M2 has bias 15 with IEEE-style Inf/NaN); F64 and
// integers are converted by value with round-to-nearest-even (exact for
// integers of magnitude ≤ 2^24); BOOL gives 0 or 1.
//
// Errors (naming the file and tensor): an unknown dtype; len(Data) not equal
// to NumElements()×DType.Size() (or a shape whose size overflows); len(dst)
// not equal to NumElements().
func (t *Tensor) Float32Into(dst []float32) error {
	if err := t.check(); err != nil {
		return err
	}
	if n := t.NumElements(); len(dst) != n {
		return fmt.Errorf("safetensors: %s: tensor %q: destination has %d elements, want %d", t.File, t.Name, len(dst), n)
	}
	decodeFloat32(dst, t.Data, t.DType)
	return nil
}

// check validates that Data matches DType and Shape.
func (t *Tensor) check() error {
	size := t.DType.Size()
	if size == 0 {
		return fmt.Errorf("safetensors: %s: tensor %q: unknown dtype %q: %w", t.File, t.Name, string(t.DType), ErrFormat)
	}
	nb, ok := byteLen(t.Shape, size)
	if !ok {
		return fmt.Errorf("safetensors: %s: tensor %q: shape %v of %s overflows or has a negative dim: %w", t.File, t.Name, t.Shape, t.DType, ErrFormat)
	}
	if nb != int64(len(t.Data)) {
		return fmt.Errorf("safetensors: %s: tensor %q: %d data bytes, want %d for %s %v: %w", t.File, t.Name, len(t.Data), nb, t.DType, t.Shape, ErrFormat)
	}
	return nil
}

// nativeLittleEndian reports whether the host stores integers little endian,
// which lets F32 data be copied byte for byte.
var nativeLittleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// decodeFloat32 converts len(dst) elements of dtype dt from src into dst.
// src must hold len(dst)*dt.Size() bytes.
func decodeFloat32(dst []float32, src []byte, dt DType) {
	n := len(dst)
	if n == 0 {
		return
	}
	switch dt {
	case F32:
		src = src[:4*n]
		if nativeLittleEndian {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*n), src)
			return
		}
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		tab := f16Table()
		src = src[:2*n]
		i := 0
		for ; i+4 <= n; i += 4 { // four values per 8-byte load
			v := binary.LittleEndian.Uint64(src[2*i:])
			d := dst[i : i+4 : i+4]
			d[0] = tab[uint16(v)]
			d[1] = tab[uint16(v>>16)]
			d[2] = tab[uint16(v>>32)]
			d[3] = tab[uint16(v>>48)]
		}
		for ; i < n; i++ {
			dst[i] = tab[binary.LittleEndian.Uint16(src[2*i:])]
		}
	case BF16:
		src = src[:2*n]
		i := 0
		for ; i+4 <= n; i += 4 { // four values per 8-byte load
			v := binary.LittleEndian.Uint64(src[2*i:])
			d := dst[i : i+4 : i+4]
			d[0] = math.Float32frombits(uint32(v) << 16)
			d[1] = math.Float32frombits(uint32(v>>16) << 16)
			d[2] = math.Float32frombits(uint32(v>>32) << 16)
			d[3] = math.Float32frombits(uint32(v>>48) << 16)
		}
		for ; i < n; i++ {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case F8E4M3:
		src = src[:n]
		for i, b := range src {
			dst[i] = e4m3Table[b]
		}
	case F8E5M2:
		src = src[:n]
		for i, b := range src {
			dst[i] = e5m2Table[b]
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	case I64:
		for i := range dst {
			dst[i] = float32(int64(binary.LittleEndian.Uint64(src[8*i:])))
		}
	case U64:
		for i := range dst {
			dst[i] = float32(binary.LittleEndian.Uint64(src[8*i:]))
		}
	case I32:
		for i := range dst {
			dst[i] = float32(int32(binary.LittleEndian.Uint32(src[4*i:])))
		}
	case U32:
		for i := range dst {
			dst[i] = float32(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case I16:
		for i := range dst {
			dst[i] = float32(int16(binary.LittleEndian.Uint16(src[2*i:])))
		}
	case U16:
		for i := range dst {
			dst[i] = float32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case I8:
		for i, b := range src[:n] {
			dst[i] = float32(int8(b))
		}
	case U8:
		for i, b := range src[:n] {
			dst[i] = float32(b)
		}
	case Bool:
		for i, b := range src[:n] {
			if b != 0 {
				dst[i] = 1
			} else {
				dst[i] = 0
			}
		}
	}
}

// f16Table maps every binary16 bit pattern to its float32 value (256 KiB,
// built on first use).
var f16Table = sync.OnceValue(func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = math.Float32frombits(f16Bits(uint16(i)))
	}
	return &t
})

// e4m3Table and e5m2Table map every FP8 bit pattern to its float32 value.
var e4m3Table, e5m2Table = func() (a, b [256]float32) {
	for i := range 256 {
		a[i] = math.Float32frombits(e4m3Bits(uint8(i)))
		// E5M2 is binary16 with the low 8 mantissa bits dropped.
		b[i] = math.Float32frombits(f16Bits(uint16(i) << 8))
	}
	return
}()

// f16Bits widens a binary16 to binary32 bits by re-biasing the exponent
// (15 → 127) and shifting the mantissa; subnormals are normalised. NaN
// payloads are kept (shifted left by 13).
func f16Bits(h uint16) uint32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return sign | 0x7f800000 | mant<<13
	case exp != 0: // normal
		return sign | (exp+127-15)<<23 | mant<<13
	case mant == 0: // ±0
		return sign
	}
	// Subnormal: value = mant × 2^-24. Shift the leading 1 into bit 10.
	e := uint32(127 - 15 + 1)
	for mant&0x400 == 0 {
		mant <<= 1
		e--
	}
	return sign | e<<23 | (mant&0x3ff)<<13
}

// e4m3Bits widens an OCP E4M3 byte (1 sign, 4 exponent bits with bias 7, 3
// mantissa bits; S.1111.111 is NaN; no infinities) to binary32 bits.
func e4m3Bits(b uint8) uint32 {
	sign := uint32(b&0x80) << 24
	exp := uint32(b>>3) & 0xf
	mant := uint32(b) & 0x7
	switch {
	case exp == 0xf && mant == 0x7:
		return sign | 0x7fc00000 // quiet NaN
	case exp != 0:
		return sign | (exp+127-7)<<23 | mant<<20
	case mant == 0:
		return sign
	}
	// Subnormal: value = mant × 2^-9.
	e := uint32(127 - 7 + 1)
	for mant&0x8 == 0 {
		mant <<= 1
		e--
	}
	return sign | e<<23 | (mant&0x7)<<20
}

// F16ToFloat32 returns the float32 value of the binary16 bit pattern h
// (exact; NaN payloads are preserved).
func F16ToFloat32(h uint16) float32 { return math.Float32frombits(f16Bits(h)) }

// BF16ToFloat32 returns the float32 value of the bfloat16 bit pattern h
// (exact: h becomes the upper 16 bits).
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F8E4M3ToFloat32 returns the float32 value of an OCP FP8 E4M3 byte (exact;
// 0x7f and 0xff are NaN).
func F8E4M3ToFloat32(b uint8) float32 { return e4m3Table[b] }

// F8E5M2ToFloat32 returns the float32 value of an OCP FP8 E5M2 byte (exact;
// 0x7c/0xfc are ±Inf, 0x7d-0x7f and 0xfd-0xff NaN).
func F8E5M2ToFloat32(b uint8) float32 { return e5m2Table[b] }

// BF16FromFloat32 rounds f to bfloat16 with round-to-nearest-even, returning
// the bit pattern. Values beyond the bfloat16 range round to ±Inf; NaN stays
// a quiet NaN with the same sign.
func BF16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 { // NaN
		return uint16(b>>16) | 0x0040
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// F16FromFloat32 rounds f to IEEE binary16 with round-to-nearest-even,
// returning the bit pattern. Magnitudes ≥ 65520 round to ±Inf, results below
// 2^-14 become subnormal (or ±0), NaN stays a quiet NaN with the same sign.
func F16FromFloat32(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	he := exp - 127 + 15 // binary16 biased exponent
	if he >= 0x1f {
		return sign | 0x7c00
	}
	if he <= 0 {
		// Subnormal (or zero) result in units of 2^-24.
		if he < -10 {
			return sign // below half the smallest subnormal: rounds to 0
		}
		m := mant | 0x800000
		shift := uint(14 - he) // 14..24
		r := m >> shift
		rem := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && r&1 == 1) {
			r++ // may carry into the smallest normal, which is the right encoding
		}
		return sign | uint16(r)
	}
	r := uint32(he)<<10 | mant>>13
	rem := mant & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, up to Inf
	}
	return sign | uint16(r)
}

// F32Bytes encodes v as little-endian binary32 bytes (4 per value), the F32
// data layout.
func F32Bytes(v []float32) []byte {
	out := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

// F16Bytes rounds v to binary16 (F16FromFloat32, round-to-nearest-even) and
// encodes it little endian (2 bytes per value), the F16 data layout.
func F16Bytes(v []float32) []byte {
	out := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(out[2*i:], F16FromFloat32(x))
	}
	return out
}

// BF16Bytes rounds v to bfloat16 (BF16FromFloat32, round-to-nearest-even)
// and encodes it little endian (2 bytes per value), the BF16 data layout.
func BF16Bytes(v []float32) []byte {
	out := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(out[2*i:], BF16FromFloat32(x))
	}
	return out
}
