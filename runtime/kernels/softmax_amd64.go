//go:build !purego

package kernels

import "golang.org/x/sys/cpu"

// hasSoftmax512 reports whether SoftmaxScaled's AVX-512 F kernels
// (softmax_amd64.s) run on this CPU (x/sys/cpu reports AVX-512 only when
// the OS saves the zmm and mask state).
var hasSoftmax512 = hasAsm && cpu.X86.HasAVX512F

// Kernels of softmax_amd64.s; n ≥ 1 for each (preconditions in the .s).

//go:noescape
func max512(x *float32, n int) float32

//go:noescape
func expScaleSubSum512(x *float32, n int, alpha, m float32) float32

//go:noescape
func scale512(alpha float32, x *float32, n int)
