//go:build !amd64 || purego

package kernels

func gemvNT8BF16AVX2(x *float32, w *uint16, k int, y *float32, nt, ldw, rs, ys, acc int) {
	panic(unreachable)
}

func gemvNT8F16AVX2(x *float32, w *uint16, k int, y *float32, nt, ldw, rs, ys, acc int) {
	panic(unreachable)
}

func widenBF16AVX2(dst *float32, src *uint16, n int) { panic(unreachable) }

func widenF16AVX2(dst *float32, src *uint16, n int) { panic(unreachable) }
