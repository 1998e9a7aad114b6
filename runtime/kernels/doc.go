// Package kernels holds the hot float32 kernels of lmpack's pure-Go CPU
// runtime: dot products, GEMV and GEMM in the two layouts a transformer
// needs (MatMulNT for Linear layers and Q·Kᵀ, MatMulNN for P·V), RMSNorm,
// SiLU gating, softmax and exp, and a Pool of persistent worker goroutines
// that runs them in parallel without allocating.
//
// It is not a general BLAS: there are no transpose flags, no alpha/beta
// (outputs are overwritten), no float64, no quantized types, and MatMulNN is
// tuned only for the small n of attention heads. It does not know about
// models or tensors; callers pass plain row-major slices with leading
// dimensions.
//
// # Layout and contracts
//
// Every matrix is float32, row-major, addressed as a[i*ld + j] with a
// leading dimension ld ≥ the row length, so callers can pass sub-matrices
// (one head's slice of a fused QKV buffer, say). Shapes are the caller's
// guarantee: each entry point checks its slice lengths once and panics with
// a "kernels: ..." message naming the operand on a violation. That is a
// programmer error, not bad input — the kernels sit below the layer that
// validates checkpoints — and a check per element would cost more than the
// kernels themselves.
//
// # Implementation
//
// On amd64 with AVX2 and FMA (detected with golang.org/x/sys/cpu, which
// also checks that the OS saves YMM state) the kernels run hand-written Go
// assembly (kernels_amd64.s); elsewhere, or when built with the purego tag,
// they run portable Go (generic.go). Impl reports which. The tests run
// every kernel on both paths and compare each with a float64 reference.
//
// Go assembly was chosen over the GOEXPERIMENT=simd intrinsics because it
// builds with the standard toolchain and a plain `go build`/`go test`, with
// no experiment flag that every downstream user would also need, and
// because the micro-kernels need exact control of the 16 YMM registers.
// No cgo is used.
//
// The kernels, and why they are shaped as they are:
//
//   - MatMulNT, m == 1 (decode GEMV): memory-bound, each weight is used
//     once. Four rows of w are reduced at once so every load of x feeds four
//     FMAs, with two accumulators per row and FMAs taking w straight from
//     memory. The four rows are not adjacent but a quarter of the matrix
//     apart (j, j+n/4, j+n/2, j+3n/4), so the weights are read as four long
//     sequential streams; on the development machine (Zen 3, 1 thread) that
//     streamed 28–33 GB/s from DRAM against 17 GB/s for four adjacent rows
//     and 22 GB/s for one row at a time, while software prefetching only
//     slowed it down. k tails use masked loads.
//   - MatMulNT, m > 1 (prefill GEMM): a 4×3 micro-kernel in dot-product form
//     with twelve 8-lane accumulators reducing along k. In the NT layout
//     both operands are contiguous in k, so no packing is needed: per 8 k it
//     issues 7 loads (3 w rows held in registers, each x row loaded once)
//     for 12 FMAs, and reduces horizontally only at the end of the tile. The
//     driver walks w in blocks of about 256 KiB (half an L2) and sweeps all
//     x rows over each block, so the four current x rows stay in L1 and the
//     w block in L2; k longer than 768 is cut into slices whose partial sums
//     accumulate in y. Edge columns reuse the GEMV kernel with x and w
//     swapped, edge rows run as GEMVs. BenchmarkMatMulNT reports its
//     GFLOP/s.
//   - MatMulNTRows (batched decode): MatMulNT with every output summed
//     in the 4×3 micro-kernel's order whatever m, n and the thread split
//     (rows.go), so a row's result does not depend on the other rows; a
//     single row runs gemvNT8AVX2 (eight w rows per load of x, one
//     accumulator each) at the decode GEMV's speed.
//   - MatMulNTHalf (BF16/F16 weights in place, half.go): MatMulNTRows with
//     w 16-bit floats, the same bits as MatMulNTRows on the widened w. A
//     row of x runs gemvNT8BF16AVX2/gemvNT8F16AVX2, gemvNT8AVX2 with each
//     w load widened in registers (VPMOVZXWD+VPSLLD for bfloat16,
//     VCVTPH2PS for binary16), so decode reads 2 bytes per weight; 4-row
//     groups widen 12 rows of w at a time into a stack tile for the 4×3
//     micro-kernel. BenchmarkMatMulNTHalf reports GB/s.
//   - MatMulNN (P·V): a 6×16 broadcast-FMA micro-kernel (twelve
//     accumulators; per k one row of w is two loads, each x element one
//     broadcast), plus a one-row kernel with masked column tails.
//   - Exp, SiLUMul, Softmax: a vector exp with Cody–Waite range reduction
//     and a degree-7 polynomial (max relative error below 1e-6, see exp.go),
//     two vectors in flight per iteration.
//   - SoftmaxScaled (attention's softmax(q·kᵀ/√head_dim) over the raw
//     dot products, softmax.go): three passes (max; exp of alpha·x − m,
//     one FMA, and sum; normalise) instead of Scale then Softmax's four.
//     Where the CPU has AVX-512 F the passes run on 16 lanes with masked
//     tails and 2^n applied by VSCALEFPS (softmax_amd64.s; exp bits equal
//     to the AVX2 path's). BenchmarkSoftmaxScaled on one decode row of
//     8,193 scores: 0.37 ns per element against 0.60 for Scale+Softmax on
//     AVX2 (copy of the row included, 0.07).
//   - RMSNorm, Dot, Axpy, Scale: streaming loops with four accumulators or
//     four vectors per iteration.
//
// Floating-point sums are accumulated in float32 in an order that depends
// on the path and on the sizes; results agree with a float64 reference to
// about 1e-5 of the sum of term magnitudes.
//
// # Parallelism
//
// Pool splits work across threads with no allocation per call. Workers
// spin briefly between jobs (BenchmarkPoolRun measures a handoff), then
// park; the submitter parks too if the workers are slow, so the pool
// degrades gracefully when other processes hold the cores. Its MatMulNT splits decode GEMVs over the rows of w (each
// thread streams its own part of the weights) and prefill GEMMs over column
// tiles or, for narrow products, over rows. Prefill scales almost linearly
// with threads; decode stops scaling once DRAM bandwidth is saturated.
//
// # Not done
//
// MatMulNT's products with 2 or 3 rows run as separate GEMVs, each
// streaming w again (MatMulNTRows runs them as one-row kernels too).
// The float32 GEMM/GEMV kernels have no AVX-512 path (the integer-dot,
// KV-code and softmax kernels have), and there is no arm64 NEON path: those
// machines use the portable Go code.
//
// The bfloat16 decode GEMV streams 19–21 GB/s from DRAM on one core where
// float32 streams 24–27 and a bare read 29–34 (BenchmarkGEMVDRAM), so a
// bf16 token takes 1/1.5–1/2.2 of a widened one's time (median 1.76× over
// 13 runs of BenchmarkHalfDecode), not half. Measured without a fix: with
// the widening removed (wrong results, same loads) it reaches only 22 GB/s,
// so the eight 16-byte row streams, more than the VPMOVZXWD and VPSLLD,
// hold it back; PREFETCHT0 1–2 KB ahead, two steps (32 bytes of each row)
// per iteration, or the eight rows adjacent instead of an eighth of the
// matrix apart changed nothing; and an AVX-512 BW loop that pairs two rows
// per zmm with VPERMT2W (same bits) fell to 15–16 GB/s; widening by
// VBROADCASTI128 and one VPSHUFB instead of VPMOVZXWD and VPSLLD (same
// bits, one ALU op fewer per 8 weights) left BenchmarkHalfDecode's in-place
// bf16 decode where it was (medians 386 and 388 tokens/s over 6
// interleaved pairs, 2026-12-03). Keeping
// MatMulNTRows' bits rules out layouts that split a row across more than 8
// accumulator lanes.
package kernels
