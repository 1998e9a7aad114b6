// moe.cu: mixture-of-experts routing and grouped expert GEMV (decode).

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
