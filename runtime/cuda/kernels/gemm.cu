// gemm.cu: y = x·Wᵀ with float32 activations x [M, K] (row stride ldx),
// binary16 or bfloat16 weights W [N, K] row-major, float32 accumulation
// and output y [M, N] (row stride ldy). beta = 1 adds to y (residual),
// beta = 0 overwrites it.

// gemv: for small M (decode). One warp per output column n, 4 warps per
// block; each block handles rows m0 = blockIdx.y·8 .. m0+7 of x. Grid
// (ceil(N/4), ceil(M/8)), block 128. When K is a multiple of 8 the weight
// row is read 8 elements (16 bytes) at a time.
#define GV_ROWS 8
template <typename W>
__device__ void gemv_body(float* y, int ldy, const float* x, int ldx, const u16* w, int M, int N, int K, int beta) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * 4 + warp;
  int m0 = blockIdx.y * GV_ROWS;
  if (n >= N) return;
  int mc = min(GV_ROWS, M - m0);
  const u16* wr = w + (i64)n * K;
  float acc[GV_ROWS];
#pragma unroll
  for (int m = 0; m < GV_ROWS; ++m) acc[m] = 0.f;
  if ((K & 7) == 0) {
    for (int k = lane * 8; k < K; k += 32 * 8) {
      uint4 p = *(const uint4*)(wr + k);
      float wv[8];
      wv[0] = W::ld((u16)(p.x & 0xffff)); wv[1] = W::ld((u16)(p.x >> 16));
      wv[2] = W::ld((u16)(p.y & 0xffff)); wv[3] = W::ld((u16)(p.y >> 16));
      wv[4] = W::ld((u16)(p.z & 0xffff)); wv[5] = W::ld((u16)(p.z >> 16));
      wv[6] = W::ld((u16)(p.w & 0xffff)); wv[7] = W::ld((u16)(p.w >> 16));
#pragma unroll
      for (int m = 0; m < GV_ROWS; ++m) {
        if (m < mc) {
          const float* xr = x + (i64)(m0 + m) * ldx + k;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m] += wv[i] * xr[i];
        }
      }
    }
  } else {
    for (int k = lane; k < K; k += 32) {
      float wv = W::ld(wr[k]);
#pragma unroll
      for (int m = 0; m < GV_ROWS; ++m)
        if (m < mc) acc[m] += wv * x[(i64)(m0 + m) * ldx + k];
    }
  }
#pragma unroll
  for (int m = 0; m < GV_ROWS; ++m) {
    float s = warp_sum(acc[m]);
    if (lane == 0 && m < mc) {
      float* o = y + (i64)(m0 + m) * ldy + n;
      *o = beta ? *o + s : s;
    }
  }
}

extern "C" __global__ void gemv_f16(float* y, int ldy, const float* x, int ldx, const u16* w, int M, int N, int K, int beta) {
  gemv_body<F16>(y, ldy, x, ldx, w, M, N, K, beta);
}
extern "C" __global__ void gemv_bf16(float* y, int ldy, const float* x, int ldx, const u16* w, int M, int N, int K, int beta) {
  gemv_body<BF16>(y, ldy, x, ldx, w, M, N, K, beta);
}

// gemm: 64×64 output tiles, K in steps of 16, 256 threads each computing a
// 4×4 block (rows ty·4.., columns tx·4..). Grid (ceil(N/64), ceil(M/64)),
// block 256.
#define GT 64
#define GK 16
template <typename W>
__device__ void gemm_body(float* y, int ldy, const float* x, int ldx, const u16* w, int M, int N, int K, int beta) {
  __shared__ float xs[GK][GT + 4];
  __shared__ float ws[GK][GT + 4];
  int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  int m0 = blockIdx.y * GT, n0 = blockIdx.x * GT;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
  for (int k0 = 0; k0 < K; k0 += GK) {
    for (int e = threadIdx.x; e < GT * GK; e += 256) {
      int r = e / GK, c = e % GK, k = k0 + c;
      int m = m0 + r, n = n0 + r;
      xs[c][r] = (m < M && k < K) ? x[(i64)m * ldx + k] : 0.f;
      ws[c][r] = (n < N && k < K) ? W::ld(w[(i64)n * K + k]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < GK; ++c) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[c][ty * 4 + i];
        b[i] = ws[c][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int m = m0 + ty * 4 + i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int n = n0 + tx * 4 + j;
      if (n < N) {
        float* o = y + (i64)m * ldy + n;
        *o = beta ? *o + acc[i][j] : acc[i][j];
      }
    }
  }
}

extern "C" __global__ void gemm_f16(float* y, int ldy, const float* x, int ldx, const u16* w, int M, int N, int K, int beta) {
  gemm_body<F16>(y, ldy, x, ldx, w, M, N, K, beta);
}
extern "C" __global__ void gemm_bf16(float* y, int ldy, const float* x, int ldx, const u16* w, int M, int N, int K, int beta) {
  gemm_body<BF16>(y, ldy, x, ldx, w, M, N, K, beta);
}
