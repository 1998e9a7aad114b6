//go:build !amd64 || purego

package kernels

func streamReadAVX2(p *byte, n int) uint64 { panic(unreachable) }
