//go:build !amd64 || purego

package kernels

// hasSoftmax512 is false without the assembly; the stubs are unreachable.
var hasSoftmax512 = false

func max512(x *float32, n int) float32                              { panic(unreachable) }
func expScaleSubSum512(x *float32, n int, alpha, m float32) float32 { panic(unreachable) }
func scale512(alpha float32, x *float32, n int)                     { panic(unreachable) }
