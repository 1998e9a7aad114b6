//go:build !amd64 || purego

package kernels

func halfScoresAVX2(q *float32, k *uint16, ldk, n, hd int, s *float32) { panic(unreachable) }

func halfAccumAVX2(p *float32, v *uint16, ldv, n, hd int, out *float32) { panic(unreachable) }

func halfScores4AVX2(q *float32, ldq int, k *uint16, ldk, n, hd int, s *float32, lds int) {
	panic(unreachable)
}

func halfAccum4AVX2(p *float32, ldp int, v *uint16, ldv, n, hd int, out *float32, ldo int) {
	panic(unreachable)
}
