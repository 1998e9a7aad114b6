//go:build !purego

package kernels

// dotU4RowAVX2: Σ over ng groups of group 4-bit codes (a multiple of 16)
// of s_g·Σ(c_j − z_g)·x[j]; scales and zeros (nil: zsym) as float16 bits
// (qdot_amd64.s).
//
//go:noescape
func dotU4RowAVX2(x *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32) float32

// dotBitsRowAVX2: dotU4RowAVX2 for ng groups of group codes (a multiple of
// 8) of bits bits; shifts points at shiftTable[bits]; reads up to 3 bytes
// past the last group's codes (qdot_amd64.s).
//
//go:noescape
func dotBitsRowAVX2(x *float32, src *byte, scales, zeros *uint16, ng, group, bits int, shifts *int32, zsym float32, mask uint32) float32

// dotU4RowILAVX2: dotU4RowAVX2 with x interleaved by InterleaveU4
// (qdot_amd64.s).
//
//go:noescape
func dotU4RowILAVX2(xi *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32) float32
