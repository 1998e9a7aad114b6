//go:build !purego

package kernels

// streamReadAVX2 reads n bytes at p (n a multiple of 256, n ≥ 256) with
// 32-byte loads and no other work (readbw_amd64.s); it returns the low 64
// bits of their OR. Benchmarks only: the single-core read ceiling.
//
//go:noescape
func streamReadAVX2(p *byte, n int) uint64
