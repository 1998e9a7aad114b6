// kvcache.cu: appending post-RoPE keys and values to the device KV cache.
//
// Device cache of one layer, per sequence b (B sequences, all arrays with a
// leading [B]):
//   sink   K, V: [nkv][sink][hd] binary16      positions [0, sink)
//   ring   K, V: [nkv][ring][hd] binary16      position p ≥ sink in slot p % ring
//   codes  K, V: [nkv][capQ][hd/4] u8          oscar2 INT2 codes of position p at
//                                               index p − sink, 4 codes per byte,
//                                               LSB first (kvq.Pack)
//   params K, V: [nkv][capQ][2] binary16       (scale, zero) of that row
// An fp16 cache has sink = 0, ring = capacity and no codes.

// asym_params_f16 is quantize/kvq.AsymParamsF16(lo, hi, 2): the min-max
// scale and zero of a row, both representable in binary16, scale raised
// to ≥ 2^-14 and ≥ |lo|/32768 and rounded up.
__device__ void asym_params_f16(float lo, float hi, float* scale, float* zero) {
  const float qmax = 3.f;
  float s = __fdiv_rn(hi - lo, qmax);
  float inv = __fdiv_rn(1.f, s);
  if (s > 0.f && !isinf(inv) && !isinf(s)) {
    // AsymParams' zero (−lo/s) is not used by AsymParamsF16.
  } else if (lo > 0.f) {
    s = lo;
  } else if (lo < 0.f) {
    s = -lo;
  } else {
    s = 1.f;
  }
  if (s < 6.103515625e-05f) s = 6.103515625e-05f;  // 2^-14
  float a = fabsf(lo) / 32768.f;
  if (s < a) s = a;
  if (s > 65504.f) s = 65504.f;
  float s16 = round16(s);
  if (s16 < s) s16 = h2f((u16)(f2h(s) + 1));
  *scale = s16;
  *zero = round16(__fdiv_rn(-lo, s16));
}

// kv_append writes T new tokens at positions pos0 .. pos0+T−1 of B
// sequences. kv holds the token rows: sequence b's token t at
// kv + (b·T + t)·ld, keys at column koff, values at voff, head h at
// +h·hd (the qkv activation). side = blockIdx.z: 0 keys, 1 values. For
// p < sink the row goes to the sink, otherwise to ring slot p % ring and,
// when codes is non-null (oscar2), also quantized into index p − sink:
//   1. x = round16(row) (the CPU cache quantizes rows from its fp16 window);
//   2. y = x·R (R [hd, hd] row-major, the layer's rotation; skipped if null);
//   3. clip (clipk ≥ 0): τ = the clipk-th smallest |y_j| (0-based,
//      clipk = min(⌊ratio·hd⌋, hd−1) from the host; |NaN| ranks as +Inf),
//      y clamped to [−τ, τ] (kvq.Clip);
//   4. (scale, zero) = AsymParamsF16(min y, max y, 2); code =
//      floor(y/scale + zero + 0.5) clamped to [0, 3] (kvq.EncodeAsym,
//      no fused multiply-add, as in Go);
//   5. pack 4 codes per byte LSB first; params (scale, zero) as binary16.
// Grid (T, nkv, 2·B) with z = b·2 + side; block = hd rounded up to a
// multiple of 32 (hd ≤ 1024).
extern "C" __global__ void kv_append(const float* kv, int ld, int koff, int voff, int T, int pos0, int nkv, int hd,
                                     u16* sinkK, u16* sinkV, int sink, u16* ringK, u16* ringV, int ring,
                                     u8* codesK, u8* codesV, u16* parK, u16* parV, int capQ,
                                     const float* RK, const float* RV, int clipkK, int clipkV) {
  __shared__ float xs[1024];
  __shared__ float ys[1024];
  __shared__ u8 cs[1024];
  __shared__ float red[33];
  __shared__ float tau_s, sc_s, z_s;
  int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z >> 1, side = blockIdx.z & 1;
  int j = threadIdx.x;
  int p = pos0 + t;
  const float* row = kv + ((i64)b * T + t) * ld + (side ? voff : koff) + (i64)h * hd;
  float x = j < hd ? round16(row[j]) : 0.f;
  if (p < sink) {
    u16* dst = (side ? sinkV : sinkK) + (((i64)b * nkv + h) * sink + p) * hd;
    if (j < hd) dst[j] = f2h(x);
    return;
  }
  // A row that a later token of this launch overwrites (same slot) is
  // skipped, so the slot's final content does not depend on block order.
  if (p + ring >= pos0 + T) {
    u16* rdst = (side ? ringV : ringK) + (((i64)b * nkv + h) * ring + p % ring) * hd;
    if (j < hd) rdst[j] = f2h(x);
  }
  u8* codes = side ? codesV : codesK;
  if (codes == 0) return;
  const float* R = side ? RV : RK;
  int clipk = side ? clipkV : clipkK;
  if (j < hd) xs[j] = x;
  __syncthreads();
  float y = 0.f;
  if (j < hd) {
    if (R) {
      for (int i = 0; i < hd; ++i) y += xs[i] * R[(i64)i * hd + j];
    } else {
      y = xs[j];
    }
    ys[j] = y;
  }
  // τ starts at +Inf (no clipping) so it is never read unset.
  if (j == 0) tau_s = __int_as_float(0x7f800000);
  __syncthreads();
  if (clipk >= 0) {
    if (j < hd) {
      // |NaN| counts as +Inf, as in kvq.Clip: the ranks stay a total
      // order, so exactly one rank class holds clipk and sets τ.
      float a = isnan(y) ? __int_as_float(0x7f800000) : fabsf(y);
      int less = 0, eq = 0;
      for (int i = 0; i < hd; ++i) {
        float c = isnan(ys[i]) ? __int_as_float(0x7f800000) : fabsf(ys[i]);
        less += c < a;
        eq += c == a;
      }
      if (less <= clipk && clipk < less + eq) tau_s = a;
    }
    __syncthreads();
    float tau = tau_s;
    if (j < hd) {
      if (y > tau) y = tau;
      else if (y < -tau) y = -tau;
    }
  }
  float lo = block_min(j < hd ? y : __int_as_float(0x7f800000), red);
  float hi = block_max(j < hd ? y : NEG_INF, red);
  if (j == 0) asym_params_f16(lo, hi, &sc_s, &z_s);
  __syncthreads();
  float scale = sc_s, zero = z_s;
  if (j < hd) {
    float inv = __fdiv_rn(1.f, scale);
    float v = __fadd_rn(__fmul_rn(y, inv), __fadd_rn(zero, 0.5f));
    if (!(v >= 0.f)) v = 0.f;
    else if (v > 3.f) v = 3.f;
    cs[j] = (u8)v;
  }
  __syncthreads();
  i64 qi = ((i64)b * nkv + h) * capQ + (p - sink);
  if (j < hd && (j & 3) == 0) {
    u8 byte = 0;
    for (int k = 0; k < 4 && j + k < hd; ++k) byte |= (u8)(cs[j + k] << (2 * k));
    codes[qi * ((hd + 3) / 4) + j / 4] = byte;
  }
  if (j == 0) {
    u16* par = (side ? parV : parK) + qi * 2;
    par[0] = f2h(scale);
    par[1] = f2h(zero);
  }
}
