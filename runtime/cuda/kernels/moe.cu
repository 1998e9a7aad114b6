// moe.cu: mixture-of-experts routing, grouped expert GEMV over binary16 /
// bfloat16 or packed group-quantized experts (every row count: decode and
// prefill run the same kernels), the weighted combine and the shared
// expert's gated add (Qwen2-MoE).

// moe_route: for token t, p = softmax(logits[t, :E]); pick the K largest
// (ties to the lower expert id, runtime's moeFFN); sel[t, k] the experts in
// pick order, wts[t, k] their p, divided by Σ_k p when norm. One thread per
// token: grid (⌈T/32⌉), block 32.
extern "C" __global__ void moe_route(int* sel, float* wts, const float* logits, int T, int E, int K, int norm) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + (i64)t * E;
  float mx = NEG_INF;
  for (int e = 0; e < E; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0.f;
  for (int e = 0; e < E; ++e) sum += expf(l[e] - mx);
  float tot = 0.f;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    float bp = 0.f;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int kk = 0; kk < k; ++kk) taken |= sel[(i64)t * K + kk] == e;
      float p = expf(l[e] - mx) / sum;
      if (!taken && (best < 0 || p > bp)) {
        best = e;
        bp = p;
      }
    }
    sel[(i64)t * K + k] = best;
    wts[(i64)t * K + k] = bp;
    tot += bp;
  }
  if (norm)
    for (int k = 0; k < K; ++k) wts[(i64)t * K + k] /= tot;
}

// moe_gemv: y[r, n] = x_r · W[sel[r], n, :] for the T·K selected (token,
// expert) pairs r = t·K + k; W [E, N, Kd] binary16 (wbf16 = 0) or
// bfloat16; x_r = x + t·ldx when xsel = 0 (the token's input), x + r·ldx
// when xsel = 1 (one row per pair); y rows r at y + r·ldy. One warp per
// (n, r): grid (T·K, ⌈N/4⌉), block 128. The pair index is on grid.x
// (up to 2³¹−1; grid.y stops at 65535, which top-8 routing of 8192
// tokens passes).
extern "C" __global__ void moe_gemv(float* y, int ldy, const float* x, int ldx, int xsel, const u16* w, const int* sel,
                                    int K, int N, int Kd, int wbf16) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.y * 4 + warp, r = blockIdx.x;
  if (n >= N) return;
  const float* xr = x + (i64)(xsel ? r : r / K) * ldx;
  const u16* wr = w + ((i64)sel[r] * N + n) * Kd;
  float a = 0.f;
  for (int k = lane; k < Kd; k += 32) a += (wbf16 ? b2f(wr[k]) : h2f(wr[k])) * xr[k];
  a = warp_sum(a);
  if (lane == 0) y[(i64)r * ldy + n] = a;
}

// moe_code returns code j of a packed row of rb bytes (bit stream, LSB
// first; quantize/weights.PackRow), bits ≤ 8: the same as qgemv.cu's
// get_code.
__device__ __forceinline__ u32 moe_code(const u8* row, int j, int bits, int rb) {
  int p = j * bits, b = p >> 3, off = p & 7;
  u32 w = row[b];
  if (off + bits > 8 && b + 1 < rb) w |= (u32)row[b + 1] << 8;
  return (w >> off) & ((1u << bits) - 1u);
}

// moe_gemv_q: moe_gemv over packed group-quantized experts (docs/QUANT.md,
// quantize/weights.Quantized; the dequantization fused as in gemv_q).
// Each expert's N rows are P segments of N/P rows (gu: P = 2, its gate
// then its up weight; down: P = 1), each its own quantized weight
// [N/P, Kd], so experts (and gate/up) may differ in bits and group size.
// Segment s = sel[r]·P + n/(N/P) is described by tab[5s .. 5s+4] (int64):
// the byte offset of its codes in `codes`, the element offsets of its
// scales in `scales` and of its zero-points in `zeros` (−1: symmetric,
// z = 2^(bits−1)), the element offset of its act-order permutation in
// `perm` (−1: none; storage column j multiplies x[perm[j]]), and
// bits + 256·group. Row m of a segment: codes ⌈Kd·bits/8⌉ bytes, scales
// and zeros Kd/group binary16 values each. Ŵ[m, j] = qval(scale, code,
// scale·z): scale·(code − z) rounded once to float32, exactly
// Quantized.Dequantize's value. bits 1–8;
// any group dividing Kd (a multiple of 8, or Kd, reads 8 codes at a
// time). x, ldx, xsel, y, ldy, sel, K (experts per token): as moe_gemv.
// One warp per (n, r): grid (T·K, ⌈N/4⌉), block 128.
extern "C" __global__ void moe_gemv_q(float* y, int ldy, const float* x, int ldx, int xsel, const u8* codes,
                                      const u16* scales, const u16* zeros, const int* perm, const i64* tab,
                                      const int* sel, int K, int N, int P, int Kd) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int n = blockIdx.y * 4 + warp, r = blockIdx.x;
  if (n >= N) return;
  int rows = N / P;
  const i64* sg = tab + ((i64)sel[r] * P + n / rows) * 5;
  i64 m = n % rows;
  int bits = (int)(sg[4] & 255), group = (int)(sg[4] >> 8);
  int rb = (Kd * bits + 7) >> 3, G = Kd / group;
  const u8* row = codes + sg[0] + m * rb;
  const u16* sc = scales + sg[1] + m * G;
  const u16* zp = sg[2] >= 0 ? zeros + sg[2] + m * G : 0;
  const int* pm = sg[3] >= 0 ? perm + sg[3] : 0;
  const float* xr = x + (i64)(xsel ? r : r / K) * ldx;
  float zsym = (float)(1 << (bits - 1));
  u32 mask = (1u << bits) - 1u;
  float a = 0.f;
  // Chunks of 8 codes (`bits` bytes from byte c·bits) when no chunk
  // straddles two groups.
  int nc = ((group & 7) == 0 || group == Kd) ? Kd >> 3 : 0;
  for (int c = lane; c < nc; c += 32) {
    unsigned long long w = 0;
    const u8* p = row + c * bits;
    for (int i = 0; i < bits; ++i) w |= (unsigned long long)p[i] << (8 * i);
    int j0 = c * 8, g = j0 / group;
    float s = h2f(sc[g]);
    float sz = s * (zp ? h2f(zp[g]) : zsym);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      float wv = qval(s, (u32)(w >> (i * bits)) & mask, sz);
      a += wv * xr[pm ? pm[j0 + i] : j0 + i];
    }
  }
  for (int j = nc * 8 + lane; j < Kd; j += 32) {
    int g = j / group;
    float s = h2f(sc[g]);
    float sz = s * (zp ? h2f(zp[g]) : zsym);
    a += qval(s, moe_code(row, j, bits, rb), sz) * xr[pm ? pm[j] : j];
  }
  a = warp_sum(a);
  if (lane == 0) y[(i64)r * ldy + n] = a;
}

// moe_combine: out[t, :] += Σ_k wts[t, k]·y[t·K + k, :], rows of H. Grid
// (T), any block.
extern "C" __global__ void moe_combine(float* out, const float* y, const float* wts, int K, int H) {
  int t = blockIdx.x;
  for (int j = threadIdx.x; j < H; j += blockDim.x) {
    float a = 0.f;
    for (int k = 0; k < K; ++k) a += wts[(i64)t * K + k] * y[((i64)t * K + k) * H + j];
    out[(i64)t * H + j] += a;
  }
}

// moe_shared: out[t, :] += g_t·y[t, :] for token t, rows of H, with
// g_t = 1 / (1 + exp(−gate · x[t, :])) when gate ([H] float32) is not
// null, else 1: Qwen2-MoE's shared expert output y = shared(x) scaled by
// sigmoid(shared_expert_gate · x) (runtime's moeFFN). Grid (T), block 256.
extern "C" __global__ void moe_shared(float* out, const float* y, const float* x, const float* gate, int H) {
  __shared__ float red[33];
  int t = blockIdx.x;
  float g = 1.f;
  if (gate) {
    float d = 0.f;
    for (int j = threadIdx.x; j < H; j += blockDim.x) d += gate[j] * x[(i64)t * H + j];
    d = block_sum(d, red);
    g = 1.f / (1.f + expf(-d));
  }
  for (int j = threadIdx.x; j < H; j += blockDim.x) out[(i64)t * H + j] += g * y[(i64)t * H + j];
}
