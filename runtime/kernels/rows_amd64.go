//go:build !purego

package kernels

//go:noescape
func gemvNT8AVX2(x, w *float32, k int, y *float32, nt, ldw, rs, ys, acc int)
