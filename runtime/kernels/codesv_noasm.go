//go:build !amd64 || purego

package kernels

var hasAVX512 = false

func codeAccumF16b2AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32) {
	panic(unreachable)
}
func codeAccumF16b4AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32) {
	panic(unreachable)
}
func codeAccumF16b8AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32) {
	panic(unreachable)
}
func codeAccumF16x4b2AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32) {
	panic(unreachable)
}
func codeAccumF16x4b4AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32) {
	panic(unreachable)
}
func codeAccumF16x4b8AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32) {
	panic(unreachable)
}

var hasVBMI = false

func codeAccumQ8b2C1(tmp, p *float32, params *uint16, codes *byte, n16 int, consts *q8vConstTab, cz *float32) {
	panic(unreachable)
}

func codeAccumQ8b2C2(tmp, p *float32, params *uint16, codes *byte, n16 int, consts *q8vConstTab, cz *float32) {
	panic(unreachable)
}

func codeAccumQ8b2AVX2(tmp, p *float32, params *uint16, codes *byte, n16, nc, rb int, consts *q8vConstTab, cz *float32) {
	panic(unreachable)
}
