//go:build !purego

package kernels

import "golang.org/x/sys/cpu"

// hasAVX512 reports whether CodeAccumF16's kernels (codesv_amd64.s:
// AVX-512 F and BW on zmm registers, F16C) run on this CPU.
var hasAVX512 = hasAsm && hasF16C && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW

// Value kernels of CodeAccumF16 (codesv_amd64.s): for chunks of 64
// channels (nc of them; the chunk's bytes 16, 32, 64 apart for 2, 4, 8
// bits), tmp[64·chunk + i] = Σ_j w_j·code_j[ch(i)] over n rows (rb bytes
// apart), w_j = p_j·s_j, in the plane order CodeAccumF16 undoes, and
// *cz = Σ_j w_j·z_j; table is the VPERMPS code table.

//go:noescape
func codeAccumF16b2AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)

//go:noescape
func codeAccumF16b4AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)

//go:noescape
func codeAccumF16b8AVX512(tmp, p *float32, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)

// The same for four query rows (CodeAccumF16x4): p's rows ldp floats
// apart, tmp [nc][4][64] (query-major per chunk, each in the plane order
// above), cz [4].

//go:noescape
func codeAccumF16x4b2AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)

//go:noescape
func codeAccumF16x4b4AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)

//go:noescape
func codeAccumF16x4b8AVX512(tmp, p *float32, ldp int, params *uint16, codes *byte, n, nc, rb int, table *[16]float32, cz *float32)
