//go:build !purego

package kernels

// gemvNT8BF16AVX2 and gemvNT8F16AVX2 are gemvNT8AVX2 with w bfloat16 or
// IEEE binary16 bits (half_amd64.s; preconditions there). The F16 one
// needs hasF16C.
//
//go:noescape
func gemvNT8BF16AVX2(x *float32, w *uint16, k int, y *float32, nt, ldw, rs, ys, acc int)

//go:noescape
func gemvNT8F16AVX2(x *float32, w *uint16, k int, y *float32, nt, ldw, rs, ys, acc int)

// widenBF16AVX2 and widenF16AVX2 widen n 16-bit floats (n a multiple of
// 8, n ≥ 8) into dst (half_amd64.s); the F16 one needs hasF16C.
//
//go:noescape
func widenBF16AVX2(dst *float32, src *uint16, n int)

//go:noescape
func widenF16AVX2(dst *float32, src *uint16, n int)
