// qgemv.cu: y = x·Ŵᵀ for packed group-quantized weights (quantize/weights
// Quantized), the dequantization fused into the product (decode path), and
// dequant_q, which expands one into binary16 for the prefill GEMM.
//
// Layout (quantize/weights.PackRow): row n of codes is RowBytes = ⌈K·bits/8⌉
// bytes holding one little-endian bit stream; code j is stream bits
// [j·bits, (j+1)·bits), stream bit k in byte k/8 at bit k%8. Eight
// consecutive codes 8c..8c+7 therefore fill exactly `bits` bytes starting at
// byte c·bits (bits ∈ {1, 2, 3, 4, 8}). Ŵ[n, j] = scale[n·G + j/group]·
// (code − z), G = K/group, z = zeros[n·G + j/group] (binary16; an integer in
// [0, 2^bits−1] at 2-8 bits, any finite fraction at 1 bit: the 1-bit grid
// of weights.binaryGrid has its two levels s·(0 − z), s·(1 − z)) or
// 2^(bits−1) when zeros is null (symmetric). Each element is formed as
// qval(s, code, s·z) = fmaf(s, code, −s·z): s·z is exact in float32 (two
// 11-bit significands), so the one rounding of the fma gives the float32
// nearest to s·(code − z), exactly Dequantize's float32(float64 product),
// even for the fractional 1-bit z, where float32 (code − z) may round.
//
// Act-order (GPTQ --act-order, weights.Quantized.Perm, NAME.perm): codes,
// scales and zeros are in storage (permuted) order, and storage column j
// holds original input column perm[j]: weights.Quantized.Dequantize writes
// storage column j to Ŵ[n, perm[j]], and the CPU's y = x·Ŵᵀ is
// Σ_j Ŵstorage[n, j]·x[perm[j]]. gemv_q takes perm itself (x is gathered);
// dequant_q takes its inverse iperm (iperm[perm[j]] = j) and gathers
// storage column iperm[c] into output column c, so its output is Ŵ in the
// original column order and the writes stay coalesced.

__device__ __forceinline__ u32 get_code(const u8* row, int j, int bits, int rb) {
  int p = j * bits, b = p >> 3, off = p & 7;
  u32 w = row[b];
  if (off + bits > 8 && b + 1 < rb) w |= (u32)row[b + 1] << 8;
  return (w >> off) & ((1u << bits) - 1u);
}

// gemv_q: one warp per output n (4 per block), rows m0 = blockIdx.y·4 ..
// m0+3 of x [M, K] (stride ldx); y [M, N] (stride ldy), beta = 1 adds.
// bits ∈ {1, 2, 3, 4, 8}; group a multiple of 8, or K (per channel); perm
// null or [K] int32 (storage column j multiplies x[perm[j]], see above).
// Grid (ceil(N/4), ceil(M/4)), block 128.
extern "C" __global__ void gemv_q(float* y, int ldy, const float* x, int ldx, const u8* codes, const u16* scales,
                                  const u16* zeros, const int* perm, int M, int N, int K, int bits, int group, int beta) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.x * 4 + warp;
  int m0 = blockIdx.y * 4;
  if (n >= N) return;
  int mc = min(4, M - m0);
  int rb = (K * bits + 7) / 8;
  int G = K / group;
  const u8* row = codes + (i64)n * rb;
  const u16* sc = scales + (i64)n * G;
  const u16* zp = zeros ? zeros + (i64)n * G : 0;
  float zsym = (float)(1 << (bits - 1));
  u32 mask = (1u << bits) - 1u;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int nc = K / 8;
  for (int c = lane; c < nc; c += 32) {
    // Bytes c·bits .. c·bits+bits−1 hold codes 8c..8c+7.
    unsigned long long w = 0;
    const u8* p = row + c * bits;
    for (int i = 0; i < bits; ++i) w |= (unsigned long long)p[i] << (8 * i);
    int j0 = c * 8, g = j0 / group;
    float s = h2f(sc[g]);
    float sz = s * (zp ? h2f(zp[g]) : zsym);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float wv = qval(s, (u32)(w >> (i * bits)) & mask, sz);
      int xj = perm ? perm[j0 + i] : j0 + i;
#pragma unroll
      for (int m = 0; m < 4; ++m)
        if (m < mc) acc[m] += wv * x[(i64)(m0 + m) * ldx + xj];
    }
  }
  for (int j = nc * 8 + lane; j < K; j += 32) {
    int g = j / group;
    float s = h2f(sc[g]);
    float sz = s * (zp ? h2f(zp[g]) : zsym);
    float wv = qval(s, get_code(row, j, bits, rb), sz);
    int xj = perm ? perm[j] : j;
#pragma unroll
    for (int m = 0; m < 4; ++m)
      if (m < mc) acc[m] += wv * x[(i64)(m0 + m) * ldx + xj];
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    float s = warp_sum(acc[m]);
    if (lane == 0 && m < mc) {
      float* o = y + (i64)(m0 + m) * ldy + n;
      *o = beta ? *o + s : s;
    }
  }
}

// dequant_q: w [N, K] binary16 (row stride K) = Ŵ of the packed weight
// (layout above) in the original column order, rounded to nearest even:
// the prefill path dequantizes one weight into a scratch buffer and runs
// gemm_f16 on it. iperm null (natural order) or [K] int32, the inverse of
// the act-order perm: output column c is storage column iperm[c]. bits ∈
// {1, 2, 3, 4, 8}. One thread per element: grid (N, ceil(K/256)), block 256.
extern "C" __global__ void dequant_q(u16* w, const u8* codes, const u16* scales, const u16* zeros, const int* iperm, int N,
                                     int K, int bits, int group) {
  int n = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
  if (n >= N || c >= K) return;
  int j = iperm ? iperm[c] : c;  // storage column
  int rb = (K * bits + 7) / 8;
  int G = K / group, g = j / group;
  float s = h2f(scales[(i64)n * G + g]);
  float sz = s * (zeros ? h2f(zeros[(i64)n * G + g]) : (float)(1 << (bits - 1)));
  w[(i64)n * K + c] = f2h(qval(s, get_code(codes + (i64)n * rb, j, bits, rb), sz));
}
