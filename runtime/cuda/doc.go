// Package cuda is lmpack's NVIDIA GPU backend. It needs no cgo: the CUDA
// driver API (libcuda.so.1) and NVRTC are opened at run time through
// github.com/ebitengine/purego, so the package builds, and its tests run,
// on any machine; calls that need a GPU return ErrNoDevice (or an error
// naming the missing library and every path searched). The libraries are
// loaded on Linux only: elsewhere (macOS, Windows) the package builds and
// every load fails with ErrNoDriver or ErrNoNVRTC wrapping
// ErrUnsupportedOS, so --device auto runs on the CPU.
//
// All driver calls run on one goroutine locked to its OS thread (the CUDA
// context is per thread), using the device's primary context
// (cuDevicePrimaryCtxRetain; cuCtxCreate changed its signature in CUDA 13).
//
// The kernels are embedded CUDA C++ sources (kernels/*.cu) that include no
// CUDA header: NVRTC 11.8 ships without cuda_fp16.h, so binary16 and
// bfloat16 conversions are written out in the sources. At load they are
// compiled by NVRTC to CUBIN machine code for the device's architecture
// when the NVRTC can (≥ 11.1, knows an sm_XX of the device's major) and
// its CUDA major is not newer than the driver's, else to PTX for the
// newest architecture it knows ≤ the device's (JIT-compiled by the
// driver, which rejects PTX from an NVRTC newer than itself, so such an
// NVRTC makes no PTX). When the driver rejects an image the next choice,
// then the next NVRTC found, is tried (LoadKernels); Probe does the same
// with one source, so --device auto falls back to the CPU when no kernel
// loads. Images are cached on disk under os.UserCacheDir()/lmpack/cuda,
// keyed by the SHA-256 of the sources and options, the target (sm_XX
// CUBIN or compute_XX PTX) and the NVRTC version.
//
// Quantized checkpoints (docs/QUANT.md): the attention, MLP and lm_head
// weights stay packed on the device at 1, 2, 3, 4 and 8 bits, with or
// without a GPTQ act-order permutation (uploaded as int32 with its
// inverse). Up to 64 rows per call (decode batches) run gemv_q, which dequantizes in
// registers and gathers x through the permutation; longer prefills
// dequantize one weight at a time with dequant_q (through the inverse
// permutation, so in the original column order) into a binary16 scratch
// buffer and run gemm_f16. Both form each element as the float32 nearest
// to scale·(code − zero), exactly weights.Quantized.Dequantize's value,
// also for the fractional 1-bit zero-points. Stacks whose parts differ in
// format or permutation, groups neither a multiple of 8
// columns nor per channel and weights with |Ŵ| > 65504 are dequantized
// on the host and uploaded as binary16 or bfloat16 (kernels/qgemv.cu,
// Model).
//
// Library search order for NVRTC (see NVRTCCandidates): $LMPACK_NVRTC (a file
// or a directory), $CUDA_HOME/lib64, the sonames libnvrtc.so.13, .so.12,
// .so.11.2 through the dynamic loader, /usr/local/cuda/lib64, then the
// pip wheel locations site-packages/nvidia/*/lib of the Python
// installations found on the machine. The driver is libcuda.so.1 through
// the dynamic loader (never a toolkit stub, which has no device).
//
// KV caches on the device (NewDeviceCache, CacheOptions.Method; names as
// runtime/kvcache's methods, docs/METHODS.md §1 and §3). Every quantized
// kind keeps kvcache's fp16 sink and recent window (Sink, Recent) and
// stores each other (token, kv head) row once, quantized as kv_append
// writes it; attn_split reads the rows from their codes (no dequantized
// copy of the history):
//
//	method   device row (kernels/common.cuh)            rotation          read as
//	fp16     binary16                                   none              values
//	oscar2   INT2 asymmetric, fp16 scale and zero       R_K, R_V + clip   code space
//	oscar4   INT4 asymmetric, fp16 scale and zero       R_K, R_V + clip4  code space
//	int8     INT8 asymmetric, fp16 scale and zero       none              code space
//	int4     INT4 asymmetric, fp16 scale and zero       none              code space
//	q8_0     llama.cpp block_q8_0 per 32 values         Hadamard blocks   kv_deq values
//	q4_0     llama.cpp block_q4_0 per 32 values         Hadamard blocks   kv_deq values
//	fp8      FP8 E4M3 per value, per-tensor scale 1     none              kv_deq values
//
// ("code space": scale·(Σ q_j·c_j − zero·Σ q_j) per key row and the
// weighted codes summed before one scale per row; q8_0/q4_0 rotate q by
// llama.cpp's block Hadamard matrix and the output back, as oscar2 does
// with its rotations; clip4: Rotations.ClipK4/ClipV4). The encodings are kvcache's bit for bit on the
// same binary16 input except where a float32 rotation rounds differently
// (q8_0, q4_0: the device rotates with a dense matrix product, kvcache
// with kvq.FWHT; oscar2: a loop against kernels.MatMulNT), and q8_0's
// block maximum skips NaN where kvcache's propagates it. q8_0 and q4_0
// need a head_dim that is a multiple of 32 (as kvcache and llama.cpp).
// fp16 and oscar2 caches run attn_split_g<MG>, compiled for INT2 rows
// only (so it keeps its registers); the other kinds run
// attn_split_kv_g<MG>, which branches on the kind at run time (about 130
// registers per thread at MG 1 on sm_90, against 70: fewer blocks per SM;
// its speed is measured by BenchmarkDecodeKVKinds, not tuned).
// Not on the device, refused by NewDeviceCache with an error naming the
// method (the engine runs such artifacts on the CPU): kivi2 and oscars2
// (per-channel keys over 32-token blocks), quarot2, oscar-mixed,
// int2-naive, turboquant_*, int4_per_token_head.
//
// Weights: binary16, or bfloat16 for BF16 checkpoints and tensors with
// |w| > 65504, used in place by gemv/gemm (_f16, _bf16) with float32
// accumulation; F32 checkpoints are rounded to binary16 at upload, so the
// device holds no float32 weight copy (runtime.LoadOptions.
// DequantizeWeights, which makes the CPU backend widen to float32, is
// ignored here: there is no float32 GEMM on the device).
//
// Models (Backend.Load): the decoders formats/arch describes, dense and
// MoE (top-k routing, Qwen2-MoE's shared expert with its sigmoid gate),
// with a head_dim that is a multiple of 4 up to 256. Weights are binary16
// or bfloat16 on the device, or stay packed when quantized (docs/QUANT.md):
// dense matmuls through gemv_q (decode) and dequant_q + gemm_f16
// (prefill), MoE experts through moe_gemv_q (kernels/moe.cu), which
// takes experts of different widths, groups and act-order permutations
// in one launch through a per-expert offset table. Model says which
// weights fall back to host dequantization.
//
// Known costs, from the structure of the code: a decode step launches about 12 kernels per layer one by one
// (no CUDA graphs), so batch-1 decode of a many-layer model is bounded by
// launch overhead rather than by the KV cache's bytes; each attn_split
// block recomputes q·R_K for its q heads (hd² multiply-adds and an R_K
// read from L2), which at batch 1 and long contexts (many short splits)
// costs L2 traffic of the order of the INT2 cache's own DRAM bytes; and
// gemv_q reads a packed weight once per 4 rows of x, so decode batches
// between 16 and 64 sequences re-read the codes (from L2 when they fit).
package cuda
