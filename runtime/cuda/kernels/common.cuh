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
