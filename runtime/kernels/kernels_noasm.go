//go:build !amd64 || purego

package kernels

// hasAsm is false: this build has no assembly kernels (non-amd64, or the
// purego build tag). The stubs below keep the dispatch code compiling; they
// are unreachable because useAsm is never true in such a build.
var hasAsm = false

func dotAVX2(a, b *float32, n int) float32                            { panic(unreachable) }
func axpyAVX2(alpha float32, x, y *float32, n int)                    { panic(unreachable) }
func scaleAVX2(alpha float32, x *float32, n int)                      { panic(unreachable) }
func scaleMulAVX2(out, x, w *float32, n int, s float32)               { panic(unreachable) }
func maxAVX2(x *float32, n int) float32                               { panic(unreachable) }
func expAVX2(x *float32, n int)                                       { panic(unreachable) }
func expScaleSubSumAVX2(x *float32, n int, alpha, m float32) float32  { panic(unreachable) }
func siluMulAVX2(gate, up *float32, n int)                            { panic(unreachable) }
func gemv4AVX2(x, w *float32, ldw, k int, y *float32, nt, rs, ys int) { panic(unreachable) }
func gemmNN1AVX2(x, w *float32, ldw int, y *float32, k, n int)        { panic(unreachable) }
func gemmNT4x3AVX2(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k, nt, acc int) {
	panic(unreachable)
}
func gemmNN6x16AVX2(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k, nt int) {
	panic(unreachable)
}

const unreachable = "kernels: assembly kernel called in a build without assembly"
