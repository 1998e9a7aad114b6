//go:build !amd64 || purego

package kernels

func halfScoresAVX2(q *float32, k *uint16, ldk, n, hd int, s *float32) { panic(unreachable) }

func halfAccumAVX2(p *float32, v *uint16, ldv, n, hd int, out *float32) { panic(unreachable) }
