//go:build !unix

package kernels

// threadCPUSeconds is unavailable here: -1.
func threadCPUSeconds() float64 { return -1 }
