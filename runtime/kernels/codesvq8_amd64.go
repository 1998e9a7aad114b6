//go:build !purego

package kernels

import "golang.org/x/sys/cpu"

// hasVBMI reports whether CodeAccumQ8's kernel (codesvq8_amd64.s:
// AVX-512 VBMI VPERMB and VNNI VPDPBUSD) runs on this CPU.
var hasVBMI = hasVNNI512 && hasF16C && cpu.X86.HasAVX512VBMI

// codeAccumQ8b2C1 is CodeAccumQ8's kernel for n16 blocks of 16 rows of
// 64 2-bit codes 16 bytes apart: tmp [64] receives the plane-ordered
// sums (as codeAccumF16b2AVX512's) and *cz Σ_j w̃_j·z_j.
//
//go:noescape
func codeAccumQ8b2C1(tmp, p *float32, params *uint16, codes *byte, n16 int, consts *q8vConstTab, cz *float32)

// codeAccumQ8b2C2 is codeAccumQ8b2C1 for head_dim 128 (rows 32 bytes
// apart; tmp [128], the two 64-channel chunks in turn).
//
//go:noescape
func codeAccumQ8b2C2(tmp, p *float32, params *uint16, codes *byte, n16 int, consts *q8vConstTab, cz *float32)

// codeAccumQ8b2AVX2 is the AVX2 form of codeAccumQ8b2C1 and
// codeAccumQ8b2C2 (codesvq8avx2_amd64.s): n16 blocks of 16 rows of nc·64
// 2-bit codes rb bytes apart; tmp [64·nc] receives each 64-channel
// chunk's plane-ordered sums and *cz Σ_j w̃_j·z_j, with the bits of the
// AVX-512 kernels.
//
//go:noescape
func codeAccumQ8b2AVX2(tmp, p *float32, params *uint16, codes *byte, n16, nc, rb int, consts *q8vConstTab, cz *float32)
