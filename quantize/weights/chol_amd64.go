//go:build !purego

package weights

import "golang.org/x/sys/cpu"

// hasAVX2 reports whether this build has the float64 AVX2+FMA tile kernel
// (chol_amd64.s) and the CPU and OS support it.
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// dotNT2x4AVX2 writes out[r·4+c] = Σ_{p<4·n4} a_r[p]·b[c·ldb+p] for the
// two rows a_0 = a0, a_1 = a1 and the four rows of b (leading dimension
// ldb elements). n4 ≥ 1.
//
//go:noescape
func dotNT2x4AVX2(a0, a1, b *float64, ldb, n4 int, out *[8]float64)
