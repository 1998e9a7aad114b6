//go:build !amd64 || purego

package kernels

var hasVNNI512 = false

func codeDotsQ8b2VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8b4VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8b8VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b4VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b8VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16x4b2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16x4b4VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16x4b8VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b2C1VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b2C2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b4C2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16x4b2C1VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16x4b2C2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16x4b4C2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}

var hasQ8AVX2 = false

func codeDotsQ8b2AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8b4AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8b8AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b2AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b4AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b8AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b2C1AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8b8WAVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
func codeDotsQ8F16b8WAVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab) {
	panic(unreachable)
}
