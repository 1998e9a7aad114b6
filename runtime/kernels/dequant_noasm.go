//go:build !amd64 || purego

package kernels

func dequantU4AVX2(dst *float32, src *byte, n int, scale, zero float32) { panic(unreachable) }

var hasF16C = false

func dequantU4RowAVX2(dst *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32) {
	panic(unreachable)
}

func dequantBitsRowAVX2(dst *float32, src *byte, scales, zeros *uint16, ng, group, bits int, shifts *int32, zsym float32, mask uint32) {
	panic(unreachable)
}
