//go:build !purego

package kernels

import "golang.org/x/sys/cpu"

// hasVNNI512 reports whether the 512-bit VNNI code kernels of CodeDotsQ8
// (codesq8_amd64.s: AVX-512 F, BW, VL and VNNI) run on this CPU.
var hasVNNI512 = hasVNNI && cpu.X86.HasAVX512F

// Four-row integer code kernels (codesq8_amd64.s): for n4 groups of four
// rows (rb bytes apart, 16·u bytes of codes each) out[j] =
// sz[2j]·(coef[0]·t_j − sz[2j+1]·coef[1]), t_j the int32 product of the
// row's code planes with the query planes at qb (CodeQ8Query's layout);
// consts is &q8Consts.

//go:noescape
func codeDotsQ8b2VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8b4VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8b8VNNI(out *float32, qb, codes *byte, n4, u, rb int, sz, coef *float32, consts *q8ConstTab)

// The same with fp16 params ([4·n4, 2] scale, zero) read in the kernel.

//go:noescape
func codeDotsQ8F16b2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b4VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b8VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

// Four queries at once (CodeQ8Query4's layout at qb, coef [4, 2] their
// scales and sums): query r's scores go to out[r·ldo + j].

//go:noescape
func codeDotsQ8F16x4b2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16x4b4VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16x4b8VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

// Contiguous rows (rb = 16·u): the four rows' units loaded whole
// (u 1: one load; u 2: two loads and a lane shuffle per unit).

//go:noescape
func codeDotsQ8F16b2C1VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b2C2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b4C2VNNI(out *float32, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16x4b2C1VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16x4b2C2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16x4b4C2VNNI(out *float32, ldo int, qb, codes *byte, n4, u, rb int, params *uint16, coef *float32, consts *q8ConstTab)

// hasQ8AVX2 reports whether the AVX2 forms of the four-row code kernels
// (codesq8avx2_amd64.s: AVX2, FMA and F16C) and of CodeAccumQ8's kernel
// run on this CPU; CodeDotsQ8 and CodeAccumQ8 take them where hasVNNI512
// (hasVBMI) is false and useAsm is true.
var hasQ8AVX2 = hasAsm && hasF16C

// AVX2 four-row kernels (codesq8avx2_amd64.s): as the VNNI ones, with qs
// the bytes between two of the query's units (64 in CodeQ8Query's layout,
// 256 for one row of CodeQ8Query4's, whose row r starts 64·r bytes on).

//go:noescape
func codeDotsQ8b2AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8b4AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8b8AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b2AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b4AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b8AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b2C1AVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)

// 8-bit codes by VPMADDWD (the query widened to int16 in the frame;
// u ≤ 16).

//go:noescape
func codeDotsQ8b8WAVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, sz, coef *float32, consts *q8ConstTab)

//go:noescape
func codeDotsQ8F16b8WAVX2(out *float32, qb, codes *byte, n4, u, rb, qs int, params *uint16, coef *float32, consts *q8ConstTab)
