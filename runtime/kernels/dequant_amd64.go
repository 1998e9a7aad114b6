//go:build !purego

package kernels

import "golang.org/x/sys/cpu"

// dequantU4AVX2: dst[j] = (code_j − zero)·scale for j < n, n a multiple
// of 16, reading n/2 bytes of src (dequant_amd64.s).
//
//go:noescape
func dequantU4AVX2(dst *float32, src *byte, n int, scale, zero float32)

// hasF16C reports whether the CPU has the float16 conversions
// (VCVTPH2PS) that dequantU4RowAVX2 uses.
var hasF16C = cpu.X86.HasF16C

// dequantU4RowAVX2: ng groups of group codes (a multiple of 16), scales
// and zeros (nil: zsym) as float16 bits (dequant_amd64.s).
//
//go:noescape
func dequantU4RowAVX2(dst *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32)

// dequantBitsRowAVX2: ng groups of group codes (a multiple of 8) of bits
// bits; shifts points at shiftTable[bits]; reads up to 3 bytes past the
// last group's codes (dequant_amd64.s).
//
//go:noescape
func dequantBitsRowAVX2(dst *float32, src *byte, scales, zeros *uint16, ng, group, bits int, shifts *int32, zsym float32, mask uint32)
