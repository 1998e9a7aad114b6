// elementwise.cu: embedding, RMSNorm, RoPE, SwiGLU, residual and bias adds.
// Activations are float32, row-major.

// embed: out[t, :] = table[ids[t], :] for t < T; table [V, H] binary16
// (wbf16 = 0) or bfloat16. Grid (T), any block size.
extern "C" __global__ void embed(float* out, const u16* table, const int* ids, int H, int wbf16) {
  int t = blockIdx.x;
  const u16* row = table + (i64)ids[t] * H;
  float* o = out + (i64)t * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) o[i] = wbf16 ? b2f(row[i]) : h2f(row[i]);
}

// rmsnorm: for row r = a·inner + b (a < rows/inner, b < inner) with
// x_r = x + a·ld + b·n and out_r likewise: out_r = x_r · w / sqrt(mean(x_r²)
// + eps) (runtime/kernels.RMSNorm). inner = 1, ld = n for plain rows;
// inner = heads, ld = the qkv row length for per-head q/k norms. Grid
// (rows), block a multiple of 32. out may equal x.
extern "C" __global__ void rmsnorm(float* out, const float* x, const float* w, int n, int inner, int ld, float eps) {
  __shared__ float red[33];
  int r = blockIdx.x;
  i64 off = (i64)(r / inner) * ld + (i64)(r % inner) * n;
  const float* xr = x + off;
  float* o = out + off;
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  float s = (float)(1.0 / sqrt((double)ss / (double)n + (double)eps));
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = s * xr[i] * w[i];
}

// rope rotates heads [heads, hd] of row r, stored at x + r·ld, for
// position pos0 + r % T (rows are B sequences of T tokens) with pairs (i, i + hd/2) (rotate_half): a' = a·c − b·s,
// b' = b·c + a·s, c and s from tables cosT, sinT [positions, hd/2]
// (runtime's ropeTable, computed on the host in float64).
// block ≥ 1 (threads loop over hd/2). Grid (B·T, heads).
extern "C" __global__ void rope(float* x, int ld, int hd, int T, int pos0, const float* cosT, const float* sinT) {
  int r = blockIdx.x, h = blockIdx.y, half = hd / 2;
  float* v = x + (i64)r * ld + (i64)h * hd;
  const float* c = cosT + (i64)(pos0 + r % T) * half;
  const float* s = sinT + (i64)(pos0 + r % T) * half;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float a = v[i], b = v[i + half];
    v[i] = a * c[i] - b * s[i];
    v[i + half] = b * c[i] + a * s[i];
  }
}

// silu_mul: for each row t of gu [T, 2I] (gate then up): gu[t, i] =
// silu(gu[t, i])·gu[t, I+i], i < I. Grid (T), any block.
extern "C" __global__ void silu_mul(float* gu, int I) {
  float* g = gu + (i64)blockIdx.x * 2 * I;
  for (int i = threadIdx.x; i < I; i += blockDim.x) {
    float a = g[i];
    g[i] = a / (1.f + expf(-a)) * g[I + i];
  }
}

// add_bias: x[t, j] += b[j] for j < n, rows t at x + t·ld. Grid (T).
extern "C" __global__ void add_bias(float* x, const float* b, int n, int ld) {
  float* r = x + (i64)blockIdx.x * ld;
  for (int j = threadIdx.x; j < n; j += blockDim.x) r[j] += b[j];
}
