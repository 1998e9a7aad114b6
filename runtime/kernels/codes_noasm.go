//go:build !amd64 || purego

package kernels

func codeDots2AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)  { panic(unreachable) }
func codeDots4AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)  { panic(unreachable) }
func codeDots8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)  { panic(unreachable) }
func codeAxpy2AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)  { panic(unreachable) }
func codeAxpy4AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)  { panic(unreachable) }
func codeAxpy8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32)  { panic(unreachable) }
func codeDotsS8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32) { panic(unreachable) }
func codeAxpyS8AVX2(dst, x *float32, codes *byte, n, hd, rb int, shifts *int32) { panic(unreachable) }
