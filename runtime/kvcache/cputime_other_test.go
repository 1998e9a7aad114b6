//go:build !unix

package kvcache

// threadCPU is unavailable here: -1.
func threadCPU() float64 { return -1 }
