// common.cuh: helpers prepended to every kernel source. No CUDA header is
// included (NVRTC 11.8 lacks cuda_fp16.h): binary16 values travel as
// unsigned short bits and bfloat16 as the high half of a float.
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define NEG_INF __int_as_float(0xff800000)

// h2f converts binary16 bits to float (exact).
__device__ __forceinline__ float h2f(u16 h) {
  float f;
  asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
  return f;
}

// f2h converts float to binary16 bits, round to nearest even (overflow to
// ±Inf), the same as quantize/kvq.F16FromFloat32.
__device__ __forceinline__ u16 f2h(float f) {
  u16 h;
  asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
  return h;
}

// round16 rounds f to the nearest binary16 value.
__device__ __forceinline__ float round16(float f) { return h2f(f2h(f)); }

// b2f converts bfloat16 bits to float (exact).
__device__ __forceinline__ float b2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

// Weight element loaders: W is u16 storage of binary16 (F16) or bfloat16
// (BF16).
struct F16 {
  static __device__ __forceinline__ float ld(u16 v) { return h2f(v); }
};
struct BF16 {
  static __device__ __forceinline__ float ld(u16 v) { return b2f(v); }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_min(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// block_sum returns the sum of v over the block (blockDim.x a multiple of
// 32, at most 1024) to every thread; red is __shared__ float[33].
__device__ __forceinline__ float block_sum(float v, float* red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    float s = lane < nw ? red[lane] : 0.f;
    s = warp_sum(s);
    if (lane == 0) red[32] = s;
  }
  __syncthreads();
  return red[32];
}

// block_max and block_min are block_sum for max and min.
__device__ __forceinline__ float block_max(float v, float* red) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    float s = lane < nw ? red[lane] : NEG_INF;
    s = warp_max(s);
    if (lane == 0) red[32] = s;
  }
  __syncthreads();
  return red[32];
}

__device__ __forceinline__ float block_min(float v, float* red) {
  return -block_max(-v, red);
}

// qval(s, code, s·z) = fmaf(s, code, −s·z): the float32 nearest to
// s·(code − z) for a binary16 scale s and zero-point z (s·z is exact in
// float32), as quantize/weights.Quantized.Dequantize computes it; shared
// by qgemv.cu and moe.cu.
__device__ __forceinline__ float qval(float s, u32 code, float sz) { return fmaf(s, (float)code, -sz); }

// Quantized KV row kinds of the device cache (kvcache.cu, attention.cu;
// cache.go kvKind): the codes of a (token, kv head) row of hd values.
//   KV_ASYM  asymmetric min-max codes of 2, 4 or 8 bits, packed LSB first
//            (kvq.Pack), hd·bits/8 bytes, with (scale, zero) binary16 in
//            params (oscar2, int8, int4)
//   KV_Q8_0  llama.cpp block_q8_0 per 32 values: binary16 d (little
//            endian), 32 int8 codes; x̂ = q·d               hd/32·34 bytes
//   KV_Q4_0  block_q4_0: binary16 d, 16 bytes, byte j = q[j] | q[j+16]<<4;
//            x̂ = (q − 8)·d                                  hd/32·18 bytes
//   KV_FP8   one FP8 E4M3 byte per value (vLLM fp8, per-tensor scale 1)
#define KV_ASYM 1
#define KV_Q8_0 2
#define KV_Q4_0 3
#define KV_FP8 4

// kv_row_bytes is the size in bytes of one row of codes of a kind.
__device__ __forceinline__ int kv_row_bytes(int kind, int bits, int hd) {
  if (kind == KV_ASYM) return hd * bits / 8;
  if (kind == KV_Q8_0) return hd / 32 * 34;
  if (kind == KV_Q4_0) return hd / 32 * 18;
  return hd;
}

// kv_code is code j of a KV_ASYM row (bits 2, 4 or 8: a code never
// straddles a byte).
__device__ __forceinline__ u32 kv_code(const u8* row, int j, int bits) {
  int p = j * bits;
  return ((u32)row[p >> 3] >> (p & 7)) & ((1u << bits) - 1u);
}

// e4m3_to_f is quantize/kvq.F8E4M3ToFloat32 (exact; S.1111.111 is NaN).
__device__ __forceinline__ float e4m3_to_f(u32 c) {
  u32 a = c & 0x7fu, e = a >> 3, m = a & 7u;
  float v;
  if (a == 0x7fu) v = __int_as_float(0x7fc00000);
  else if (e == 0) v = (float)m * 0.001953125f;  // m/8·2^-6
  else v = (float)(8u + m) * __int_as_float((int)((e + 117u) << 23));  // (1 + m/8)·2^(e−7)
  return (c & 0x80u) ? -v : v;
}

// kv_deq is value j of a KV_Q8_0, KV_Q4_0 or KV_FP8 row, as kvcache's
// decodeQ8_0, decodeQ4_0 and fp8Codec.decode (scale 1) form it.
__device__ __forceinline__ float kv_deq(int kind, const u8* row, int j) {
  if (kind == KV_Q8_0) {
    const u8* b = row + (j >> 5) * 34;
    float d = h2f((u16)(b[0] | (b[1] << 8)));
    return __fmul_rn((float)(signed char)b[2 + (j & 31)], d);
  }
  if (kind == KV_Q4_0) {
    const u8* b = row + (j >> 5) * 18;
    float d = h2f((u16)(b[0] | (b[1] << 8)));
    int jj = j & 31;
    u32 by = b[2 + (jj & 15)];
    int q = jj < 16 ? (int)(by & 15u) : (int)(by >> 4);
    return __fmul_rn((float)(q - 8), d);
  }
  return e4m3_to_f(row[j]);
}
