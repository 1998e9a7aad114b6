//go:build !amd64 || purego

package kernels

func dotU4RowAVX2(x *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32) float32 {
	panic(unreachable)
}

func dotBitsRowAVX2(x *float32, src *byte, scales, zeros *uint16, ng, group, bits int, shifts *int32, zsym float32, mask uint32) float32 {
	panic(unreachable)
}

func dotU4RowILAVX2(xi *float32, src *byte, scales, zeros *uint16, ng, group int, zsym float32) float32 {
	panic(unreachable)
}
