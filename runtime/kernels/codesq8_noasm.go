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
