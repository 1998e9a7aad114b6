//go:build !amd64 || purego

package kernels

func gemvNT8BF16AVX2(x *float32, w *uint16, k int, y *float32, nt, ldw, rs, ys, acc int) {
	panic(unreachable)
}

func gemvNT8F16AVX2(x *float32, w *uint16, k int, y *float32, nt, ldw, rs, ys, acc int) {
	panic(unreachable)
}
