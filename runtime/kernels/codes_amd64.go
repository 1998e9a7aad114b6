//go:build !purego

package kernels

// Code-row kernels (codes_amd64.s); preconditions in the .s headers.

//go:noescape
func codeDots2AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)

//go:noescape
func codeDots4AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)

//go:noescape
func codeDots8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)

//go:noescape
func codeAxpy2AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)

//go:noescape
func codeAxpy4AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)

//go:noescape
func codeAxpy8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)

//go:noescape
func codeDotsS8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)

//go:noescape
func codeAxpyS8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)
