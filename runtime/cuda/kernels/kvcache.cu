// kvcache.cu: appending post-RoPE keys and values to the device KV cache.
//
// Device cache of one layer, per sequence b (B sequences, all arrays with a
// leading [B]):
//   sink   K, V: [nkv][sink][hd] binary16      positions [0, sink)
//   ring   K, V: [nkv][ring][hd] binary16      position p ≥ sink in slot p % ring
//   codes  K, V: [nkv][capQ][rb] u8            quantized row of position p at
//                                               index p − sink, rb =
//                                               kv_row_bytes(kind, bits, hd)
//                                               (common.cuh: KV_ASYM INT2/4/8
//                                               codes LSB first (kvq.Pack),
//                                               q8_0, q4_0 blocks, fp8 bytes)
//   params K, V: [nkv][capQ][2] binary16       KV_ASYM only: (scale, zero)
// An fp16 cache has sink = 0, ring = capacity and no codes.

// asym_params_f16 is quantize/kvq.AsymParamsF16(lo, hi, bits), qmax =
// 2^bits − 1: the min-max scale and zero of a row, both representable in
// binary16, scale raised to ≥ 2^-14 and ≥ |lo|/32768 and rounded up.
__device__ void asym_params_f16(float lo, float hi, float qmax, float* scale, float* zero) {
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

// f_to_e4m3 is quantize/kvq.F8E4M3FromFloat32: round to nearest even,
// saturating at ±448 (±Inf included), NaN → 0x7f.
__device__ u8 f_to_e4m3(float f) {
  if (f != f) return 0x7f;
  u32 sign = (__float_as_uint(f) >> 24) & 0x80u;
  float a = fabsf(f);
  if (a >= 448.f) return (u8)(sign | 126u);
  if (a < 0.015625f) return (u8)(sign | (u32)__float2int_rn(a * 512.f));  // subnormals m/8·2^-6
  int e = (int)((__float_as_uint(a) >> 23) & 0xffu) - 127;                // a = m·2^(e−3), m ∈ [8, 16)
  float m = rintf(a * __int_as_float((130 - e) << 23));                    // a·2^(3−e), exact scaling
  return (u8)(sign | (u32)((e + 6) * 8 + (int)m));
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
// kind (common.cuh) and bits choose the row format of codes: KV_ASYM as
// above at bits 2, 4 or 8 (codes clamped to [0, 2^bits − 1], 8/bits per
// byte; int8 and int4 pass no rotation and no clipping); KV_Q8_0 and
// KV_Q4_0 (steps 1–2, then runtime/kvcache's encodeQ8_0/encodeQ4_0 per
// block of 32: hd a multiple of 32, one warp per block; q8_0/q4_0 pass
// llama.cpp's block Hadamard matrix as R); KV_FP8 (steps 1–2, then
// f_to_e4m3 per value, no rotation). params is written for KV_ASYM only.
// Grid (T, nkv, 2·B) with z = b·2 + side; block = hd rounded up to a
// multiple of 32 (hd ≤ 1024).
extern "C" __global__ void kv_append(const float* kv, int ld, int koff, int voff, int T, int pos0, int nkv, int hd,
                                     u16* sinkK, u16* sinkV, int sink, u16* ringK, u16* ringV, int ring,
                                     u8* codesK, u8* codesV, u16* parK, u16* parV, int capQ,
                                     const float* RK, const float* RV, int clipkK, int clipkV, int kind,
                                     int bits) {
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
  int rb = kv_row_bytes(kind, bits, hd);
  i64 qi = ((i64)b * nkv + h) * capQ + (p - sink);
  u8* crow = codes + qi * rb;
  if (kind == KV_FP8) {
    if (j < hd) crow[j] = f_to_e4m3(y);
    return;
  }
  if (kind == KV_Q8_0 || kind == KV_Q4_0) {
    // One warp per block of 32 values (hd is a multiple of 32).
    int lane = j & 31;
    u8* blk = crow + (j >> 5) * (kind == KV_Q8_0 ? 34 : 18);
    float d;
    if (kind == KV_Q8_0) {
      // fmaxf skips NaN (encodeQ8_0's max would keep it).
      float amax = warp_max(j < hd ? fabsf(y) : 0.f);
      d = __fdiv_rn(amax, 127.f);
      float id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
      if (j < hd) blk[2 + lane] = (u8)(signed char)(int)roundf(__fmul_rn(y, id));
    } else {
      // m = the value of largest |y|, the first one on ties (encodeQ4_0's
      // strict amax < |y| in index order; NaN never wins), 0 for a zero block.
      float a = (j < hd && y == y) ? fabsf(y) : -1.f, v = y;
      int l = lane;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        float oa = __shfl_xor_sync(0xffffffffu, a, o), ov = __shfl_xor_sync(0xffffffffu, v, o);
        int ol = __shfl_xor_sync(0xffffffffu, l, o);
        if (oa > a || (oa == a && ol < l)) {
          a = oa;
          v = ov;
          l = ol;
        }
      }
      float m = a > 0.f ? v : 0.f;
      d = __fdiv_rn(m, -8.f);
      float id = d != 0.f ? __fdiv_rn(1.f, d) : 0.f;
      if (j < hd) {
        int q = (int)__fadd_rn(__fmul_rn(y, id), 8.5f);  // Go's int8(·) truncates
        cs[j] = (u8)min(15, q);
      }
      __syncthreads();
      if (j < hd && lane < 16) blk[2 + lane] = (u8)(cs[j] | (cs[j + 16] << 4));
    }
    if (j < hd && lane == 0) {
      u16 dh = f2h(d);
      blk[0] = (u8)(dh & 0xff);
      blk[1] = (u8)(dh >> 8);
    }
    return;
  }
  float lo = block_min(j < hd ? y : __int_as_float(0x7f800000), red);
  float hi = block_max(j < hd ? y : NEG_INF, red);
  float qmax = (float)((1 << bits) - 1);
  if (j == 0) asym_params_f16(lo, hi, qmax, &sc_s, &z_s);
  __syncthreads();
  float scale = sc_s, zero = z_s;
  if (j < hd) {
    float inv = __fdiv_rn(1.f, scale);
    float v = __fadd_rn(__fmul_rn(y, inv), __fadd_rn(zero, 0.5f));
    if (!(v >= 0.f)) v = 0.f;
    else if (v > qmax) v = qmax;
    cs[j] = (u8)v;
  }
  __syncthreads();
  int per = 8 / bits;
  if (j < hd && j % per == 0) {
    u8 byte = 0;
    for (int k = 0; k < per && j + k < hd; ++k) byte |= (u8)(cs[j + k] << (bits * k));
    crow[j / per] = byte;
  }
  if (j == 0) {
    u16* par = (side ? parV : parK) + qi * 2;
    par[0] = f2h(scale);
    par[1] = f2h(zero);
  }
}
