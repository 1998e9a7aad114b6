//go:build !purego

package kernels

import "golang.org/x/sys/cpu"

// hasAsm reports whether this build contains the AVX2+FMA assembly and the
// CPU (and OS, via XSAVE state) supports it. x/sys/cpu only reports AVX2 when
// the OS saves YMM state.
var hasAsm = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// Assembly kernels (kernels_amd64.s). Preconditions are in the .s headers.

//go:noescape
func dotAVX2(a, b *float32, n int) float32

//go:noescape
func axpyAVX2(alpha float32, x, y *float32, n int)

//go:noescape
func scaleAVX2(alpha float32, x *float32, n int)

//go:noescape
func scaleMulAVX2(out, x, w *float32, n int, s float32)

//go:noescape
func maxAVX2(x *float32, n int) float32

//go:noescape
func expAVX2(x *float32, n int)

//go:noescape
func expScaleSubSumAVX2(x *float32, n int, alpha, m float32) float32

//go:noescape
func siluMulAVX2(gate, up *float32, n int)

//go:noescape
func gemv4AVX2(x, w *float32, ldw, k int, y *float32, nt, rs, ys int)

//go:noescape
func gemmNT4x3AVX2(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k, nt, acc int)

//go:noescape
func gemmNN6x16AVX2(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k, nt int)

//go:noescape
func gemmNN1AVX2(x, w *float32, ldw int, y *float32, k, n int)
