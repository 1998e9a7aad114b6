// attention.cu: causal attention of new queries over the device KV cache
// (kvcache.cu layout), for decode (T = 1) and prefill (T > 1), with the
// quantized region (oscar2 INT2, int8, int4, q8_0, q4_0, fp8 rows) read
// from its codes inside the loop.
//
// Sequence b's query t sits at position pq = pos0 + t and attends to the
// positions [lo, pq], lo = max(0, pq − window + 1) when window > 0, else 0.
// The call's own tokens attend to each other through their fresh float32
// keys and values; earlier tokens are read as the cache serves them to a
// query at pq (runtime.QuantizedKV, the CPU runtime's semantics): with
// wq = min(pos0, max(wstart, pq + 1 − recent)) for oscar2 (codes
// non-null) and wq = 0 for fp16, position p is read from
//   the qkv activation  when p ≥ pos0 (row b·T + p − pos0 of q, keys at
//                       column (nh + g)·hd, values at (nh + nkv + g)·hd),
//   the sink            when p < sink,
//   the INT2 codes      when sink ≤ p < wq (index p − sink),
//   the fp16 ring       otherwise (slot p % ring).
// wstart is the call's floor max(sink, hi − ring): positions whose ring
// slot was overwritten (hi = highest position + 1 ever written) stay INT2.
// The launch runs before this call's kv_append, so the ring still holds
// every earlier token of the window.
// Keys and values of the INT2 region are stored rotated (x·R). Scores use
// q·k = (q·R_K)·k_rot, so q is rotated once; the weighted INT2 values are
// summed in the rotated space and un-rotated once in attn_merge
// (o = o_rot·R_Vᵀ + o_fp16). kind and bits (common.cuh) give the codes'
// row format: KV_ASYM rows are scored and summed in code space (scale·
// (Σ q_j·c_j − zero·Σ q_j), the same for values), KV_Q8_0, KV_Q4_0 and
// KV_FP8 rows through kv_deq per element (a block scale per 32 values
// has no per-row factorization); q8_0 and q4_0 pass their Hadamard
// matrices as R_K and R_V, the others none (int8, int4, fp8).
//
// attn_split_g{1,2,4,8} (fp16 and oscar2 caches; attn_split_kv_g{1,2,4,8}
// with the same parameters for the other kinds): one block per (split s, kv head g and a chunk of
// up to MG = 1, 2, 4 or 8 of its q heads, query (b, t)); the split covers
// positions
// [s·split_len, (s+1)·split_len). It keeps an online softmax (running max
// m, sum l) over tiles of 128 positions and writes, per q head, m, l and
// the unnormalized accumulators o_rot and o_fp to
//   part_ml [(b·T + t)·nh + h][nsplit][2]  and
//   part_o  [(b·T + t)·nh + h][nsplit][2][hd].
// Grid (nsplit, nkv·chunks, B·T) with chunks = ⌈(nh/nkv)/MG⌉, block 128,
// dynamic shared memory 4·MG·(4·hd + 256) bytes.
// q: sequence b's query t, head h at q + (b·T + t)·q_ld + h·hd (unscaled;
// scale = 1/√hd is applied here), followed by the row's nkv key and nkv
// value heads (the qkv activation, post-RoPE). hd a multiple of 4, at
// most 256.
#define AT 128
#define MAXHD 256

// asym_dot_words adds Σ_j qr[gg·hd + j]·code_j of a KV_ASYM row cr (rb
// bytes, a multiple of 4, 4-byte aligned) to sc[gg] for gg < G.
template <int BITS, int MG>
__device__ __forceinline__ void asym_dot_words(float* sc, const u8* cr, const float* qr, int hd, int rb, int G) {
  const int PER = 32 / BITS;
  for (int jb = 0; jb < rb; jb += 4) {
    u32 word = *(const u32*)(cr + jb);
    int j0 = jb * 8 / BITS;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      float code = (float)((word >> (BITS * k)) & ((1u << BITS) - 1u));
#pragma unroll
      for (int gg = 0; gg < MG; ++gg)
        if (gg < G) sc[gg] += qr[gg * hd + j0 + k] * code;
    }
  }
}

// attn_split_body is attn_split for blocks of at most MG q heads (MG a
// compile-time 1, 2, 4 or 8, so the accumulators stay in registers).
// INT2: the fp16 and oscar2 kernels attn_split_g<MG>, for which kind is
// KV_ASYM and bits 2 at compile time (the other kinds' code is left out,
// so these keep their registers); attn_split_kv_g<MG> (INT2 false) takes
// every kind at run time. Dynamic shared memory: 4·MG·(4·hd + 256) bytes.
template <int MG, bool INT2>
__device__ void attn_split_body(float* part_o, float* part_ml, const float* q, int q_ld,
                                const u16* sinkK, const u16* sinkV, int sink,
                                const u16* ringK, const u16* ringV, int ring,
                                const u8* codesK, const u8* codesV, const u16* parK, const u16* parV, int capQ,
                                const float* RK, int nh, int nkv, int hd, int T, int pos0, int wstart,
                                int recent, int window, int nsplit, int split_len, float scale, int kind,
                                int bits) {
  if (INT2) {
    kind = KV_ASYM;
    bits = 2;
  }
  extern __shared__ float smem[];
  float* qf = smem;             // [MG][hd] q·scale
  float* qr = qf + MG * hd;     // [MG][hd] (q·scale)·R_K
  float* pw = qr + MG * hd;     // [MG][AT] scores, then softmax weights of the tile
  float* ws = pw + MG * AT;     // [MG][AT] weight·scale of the tile's INT2 values
  float* red = ws + MG * AT;    // [MG][2·hd] final reduction
  __shared__ float qsum[MG];    // Σ_j qr[g][j]
  __shared__ float m_s[MG], l_s[MG], alpha_s[MG];
  __shared__ float u_s[MG];     // Σ weight·scale·zero of the INT2 values so far

  int s = blockIdx.x;
  int group = nh / nkv, chunks = (group + MG - 1) / MG;
  int g = blockIdx.y / chunks, c = blockIdx.y % chunks;
  int h0 = g * group + c * MG;
  int G = min(MG, group - c * MG);
  int bt = blockIdx.z, b = bt / T, t = bt % T;
  int tid = threadIdx.x;
  int pq = pos0 + t;
  int lo = window > 0 ? max(0, pq - window + 1) : 0;
  int s0 = max(lo, s * split_len), s1 = min(pq + 1, (s + 1) * split_len);  // visible part of the split
  int hb = hd / 4;                                                        // groups of 4 channels
  int rb = kv_row_bytes(kind, bits, hd);                                  // bytes per quantized row
  int wq = codesK != 0 ? min(pos0, max(wstart, pq + 1 - recent)) : 0;      // INT2 positions [sink, wq)
  // The call's own rows: token p ≥ pos0 at own + (p − pos0)·q_ld.
  const float* ownK = q + (i64)(bt - t) * q_ld + (i64)nh * hd;

  // Load q heads (scaled) and rotate them.
  for (int e = tid; e < G * hd; e += AT) {
    int gg = e / hd, j = e % hd;
    qf[gg * hd + j] = q[(i64)bt * q_ld + (i64)(h0 + gg) * hd + j] * scale;
  }
  if (tid < MG) {
    m_s[tid] = NEG_INF;
    l_s[tid] = 0.f;
    u_s[tid] = 0.f;
  }
  __syncthreads();
  bool quant = codesK != 0 && wq > sink;
  if (quant) {
    for (int e = tid; e < G * hd; e += AT) {
      int gg = e / hd, j = e % hd;
      float a = 0.f;
      if (RK) {
        for (int i = 0; i < hd; ++i) a += qf[gg * hd + i] * RK[(i64)i * hd + j];
      } else {
        a = qf[gg * hd + j];
      }
      qr[gg * hd + j] = a;
    }
    __syncthreads();
    if (tid < G) {
      float a = 0.f;
      for (int j = 0; j < hd; ++j) a += qr[tid * hd + j];
      qsum[tid] = a;
    }
    __syncthreads();
  }

  // Per-thread value accumulators: channel group cg (4 channels), token
  // lane tl of TS lanes; threads past TS·hb stay idle in phase 2.
  int cg = tid % hb, tl = tid / hb, TS = AT / hb;
  float aq[MG][4], af[MG][4];
#pragma unroll
  for (int gg = 0; gg < MG; ++gg)
#pragma unroll
    for (int k = 0; k < 4; ++k) aq[gg][k] = af[gg][k] = 0.f;

  i64 head = (i64)b * nkv + g;  // (sequence, kv head) index
  for (int p0 = s0; p0 < s1; p0 += AT) {
    // Phase 1a: thread tid scores position p0 + tid when it is INT2 (a
    // 4·hd/16-byte row per thread); fp16 and invisible positions get −∞
    // here, fp16 ones are scored in phase 1b.
    int p = p0 + tid;
    float sc[MG];
#pragma unroll
    for (int gg = 0; gg < MG; ++gg) sc[gg] = NEG_INF;
    if (p < s1) {
      if (p >= sink && p < wq) {
#pragma unroll
        for (int gg = 0; gg < MG; ++gg) sc[gg] = 0.f;
        const u8* cr = codesK + (head * capQ + (p - sink)) * rb;
        if (kind == KV_ASYM) {
          const u16* pr = parK + (head * capQ + (p - sink)) * 2;
          float ks = h2f(pr[0]), kz = h2f(pr[1]);
          // Σ_j qr[j]·code_j, then scale·(that − zero·Σ_j qr[j]).
          if ((rb & 3) == 0) {
            // Rows are 4-byte aligned: 32/bits codes per load.
            if (bits == 2) asym_dot_words<2, MG>(sc, cr, qr, hd, rb, G);
            else if (bits == 4) asym_dot_words<4, MG>(sc, cr, qr, hd, rb, G);
            else asym_dot_words<8, MG>(sc, cr, qr, hd, rb, G);
          } else if (bits == 2) {
            for (int jb = 0; jb < rb; ++jb) {
              u32 byte = cr[jb];
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                float code = (float)((byte >> (2 * k)) & 3u);
#pragma unroll
                for (int gg = 0; gg < MG; ++gg)
                  if (gg < G) sc[gg] += qr[gg * hd + jb * 4 + k] * code;
              }
            }
          } else {
            for (int j = 0; j < hd; ++j) {
              float code = (float)kv_code(cr, j, bits);
#pragma unroll
              for (int gg = 0; gg < MG; ++gg)
                if (gg < G) sc[gg] += qr[gg * hd + j] * code;
            }
          }
#pragma unroll
          for (int gg = 0; gg < MG; ++gg)
            if (gg < G) sc[gg] = ks * (sc[gg] - kz * qsum[gg]);
        } else {
          for (int j = 0; j < hd; ++j) {
            float kv = kv_deq(kind, cr, j);
#pragma unroll
            for (int gg = 0; gg < MG; ++gg)
              if (gg < G) sc[gg] += qr[gg * hd + j] * kv;
          }
        }
      }
    }
#pragma unroll
    for (int gg = 0; gg < MG; ++gg) pw[gg * AT + tid] = sc[gg];
    __syncthreads();
    // Phase 1b: fp16 positions (sink and window), one warp per position and
    // each lane 4 channels, so a warp reads a row in one coalesced sweep.
    int warp = tid >> 5, lane = tid & 31;
    int nvis = min(AT, s1 - p0);
    for (int i = warp; i < nvis; i += AT / 32) {
      int pp = p0 + i;
      if (pp >= sink && pp < wq) continue;  // INT2: done in phase 1a
      bool own = pp >= pos0;
      const u16* kr = pp < sink ? sinkK + (head * sink + pp) * hd : ringK + (head * ring + pp % ring) * hd;
      const float* kf = ownK + (i64)(pp - pos0) * q_ld + (i64)g * hd;
      float a[MG];
#pragma unroll
      for (int gg = 0; gg < MG; ++gg) a[gg] = 0.f;
      for (int j = lane * 4; j < hd; j += 128) {
        float k4[4];
        if (own) {
          float4 f = *(const float4*)(kf + j);
          k4[0] = f.x;
          k4[1] = f.y;
          k4[2] = f.z;
          k4[3] = f.w;
        } else {
          uint2 v = *(const uint2*)(kr + j);
          k4[0] = h2f((u16)(v.x & 0xffff));
          k4[1] = h2f((u16)(v.x >> 16));
          k4[2] = h2f((u16)(v.y & 0xffff));
          k4[3] = h2f((u16)(v.y >> 16));
        }
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
          for (int gg = 0; gg < MG; ++gg)
            if (gg < G) a[gg] += qf[gg * hd + j + k] * k4[k];
      }
#pragma unroll
      for (int gg = 0; gg < MG; ++gg) {
        if (gg < G) {
          float sum = warp_sum(a[gg]);
          if (lane == 0) pw[gg * AT + i] = sum;
        }
      }
    }
    __syncthreads();
    // Online softmax update: warp w handles heads w, w+4, ...
    for (int gg = warp; gg < G; gg += AT / 32) {
      float* pg = pw + gg * AT;
      float mx = NEG_INF;
      for (int i = lane; i < AT; i += 32) mx = fmaxf(mx, pg[i]);
      mx = warp_max(mx);
      float mold = m_s[gg], mnew = fmaxf(mold, mx);
      float sum = 0.f, usum = 0.f;
      for (int i = lane; i < AT; i += 32) {
        float e = pg[i] == NEG_INF ? 0.f : expf(pg[i] - mnew);
        pg[i] = e;
        sum += e;
        // INT2 values are summed in code space: Σ e·(c − z)·s =
        // Σ (e·s)·c − Σ e·s·z, so phase 2 does one multiply-add per code.
        int pp = p0 + i;
        if (i < nvis && pp >= sink && pp < wq) {
          if (kind == KV_ASYM) {
            i64 qi = head * capQ + (pp - sink);
            float es = e * h2f(parV[qi * 2]);
            ws[gg * AT + i] = es;
            usum += es * h2f(parV[qi * 2 + 1]);
          } else {
            ws[gg * AT + i] = e;  // dequantized values: no code-space term
          }
        }
      }
      sum = warp_sum(sum);
      usum = warp_sum(usum);
      if (lane == 0) {
        float al = mold == NEG_INF ? 0.f : expf(mold - mnew);
        alpha_s[gg] = al;
        l_s[gg] = l_s[gg] * al + sum;
        u_s[gg] = u_s[gg] * al + usum;
        m_s[gg] = mnew;
      }
    }
    __syncthreads();
    // Phase 2: weighted values.
#pragma unroll
    for (int gg = 0; gg < MG; ++gg) {
      if (gg < G) {
        float al = alpha_s[gg];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          aq[gg][k] *= al;
          af[gg][k] *= al;
        }
      }
    }
    int pe = tl < TS ? min(AT, s1 - p0) : 0;
    for (int i = tl; i < pe; i += TS) {
      int pp = p0 + i;
      float v4[4];
      bool isq = pp >= sink && pp < wq;
      if (isq) {
        // KV_ASYM: codes only (scale and zero are in ws and u_s);
        // the other kinds: values.
        const u8* vr = codesV + (head * capQ + (pp - sink)) * rb;
        if (kind == KV_ASYM && bits == 2) {
          u32 byte = vr[cg];
#pragma unroll
          for (int k = 0; k < 4; ++k) v4[k] = (float)((byte >> (2 * k)) & 3u);
        } else if (kind == KV_ASYM) {
#pragma unroll
          for (int k = 0; k < 4; ++k) v4[k] = (float)kv_code(vr, cg * 4 + k, bits);
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) v4[k] = kv_deq(kind, vr, cg * 4 + k);
        }
      } else if (pp >= pos0) {
        float4 f = *(const float4*)(ownK + (i64)(pp - pos0) * q_ld + (i64)(nkv + g) * hd + cg * 4);
        v4[0] = f.x;
        v4[1] = f.y;
        v4[2] = f.z;
        v4[3] = f.w;
      } else {
        const u16* vr = pp < sink ? sinkV + (head * sink + pp) * hd : ringV + (head * ring + pp % ring) * hd;
        uint2 v = *(const uint2*)(vr + cg * 4);
        v4[0] = h2f((u16)(v.x & 0xffff));
        v4[1] = h2f((u16)(v.x >> 16));
        v4[2] = h2f((u16)(v.y & 0xffff));
        v4[3] = h2f((u16)(v.y >> 16));
      }
#pragma unroll
      for (int gg = 0; gg < MG; ++gg) {
        if (gg < G) {
          if (isq) {
            float w = ws[gg * AT + i];
#pragma unroll
            for (int k = 0; k < 4; ++k) aq[gg][k] += w * v4[k];
          } else {
            float w = pw[gg * AT + i];
#pragma unroll
            for (int k = 0; k < 4; ++k) af[gg][k] += w * v4[k];
          }
        }
      }
    }
    __syncthreads();
  }

  // Reduce the TS token lanes in order (deterministic), then write.
  for (int e = tid; e < G * hd * 2; e += AT) red[e] = 0.f;
  __syncthreads();
  for (int r = 0; r < TS; ++r) {
    if (tl == r) {
#pragma unroll
      for (int gg = 0; gg < MG; ++gg) {
        if (gg < G) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            red[gg * 2 * hd + cg * 4 + k] += aq[gg][k];
            red[gg * 2 * hd + hd + cg * 4 + k] += af[gg][k];
          }
        }
      }
    }
    __syncthreads();
  }
  for (int e = tid; e < G * hd * 2; e += AT) {
    int gg = e / (hd * 2), j = e % (hd * 2);
    i64 row = ((i64)bt * nh + h0 + gg) * nsplit + s;
    // o_rot = Σ (e·s)·c − Σ e·s·z (the second term is the same for every channel).
    part_o[row * 2 * hd + j] = j < hd ? red[e] - u_s[gg] : red[e];
  }
  if (tid < G) {
    i64 row = ((i64)bt * nh + h0 + tid) * nsplit + s;
    part_ml[row * 2] = m_s[tid];
    part_ml[row * 2 + 1] = l_s[tid];
  }
}

#define ATTN_SPLIT(SUFFIX, MG, INT2)                                                                                \
  extern "C" __global__ void attn_split##SUFFIX##_g##MG(                                                            \
      float* part_o, float* part_ml, const float* q, int q_ld, const u16* sinkK, const u16* sinkV, int sink,        \
      const u16* ringK, const u16* ringV, int ring, const u8* codesK, const u8* codesV, const u16* parK,            \
      const u16* parV, int capQ, const float* RK, int nh, int nkv, int hd, int T, int pos0, int wstart, int recent, \
      int window, int nsplit, int split_len, float scale, int kind, int bits) {                                     \
    attn_split_body<MG, INT2>(part_o, part_ml, q, q_ld, sinkK, sinkV, sink, ringK, ringV, ring, codesK, codesV,    \
                              parK, parV, capQ, RK, nh, nkv, hd, T, pos0, wstart, recent, window, nsplit, split_len, \
                              scale, kind, bits);                                                                   \
  }
ATTN_SPLIT(, 1, true)
ATTN_SPLIT(, 2, true)
ATTN_SPLIT(, 4, true)
ATTN_SPLIT(, 8, true)
ATTN_SPLIT(_kv, 1, false)
ATTN_SPLIT(_kv, 2, false)
ATTN_SPLIT(_kv, 4, false)
ATTN_SPLIT(_kv, 8, false)

// attn_merge combines the splits of head h of query bt: M = max m_s,
// L = Σ l_s·e^(m_s−M), o = (Σ e^(m_s−M)·o_rot_s)·R_Vᵀ + Σ e^(m_s−M)·o_fp_s,
// out[bt·out_ld + h·hd + j] = o[j] / L. R_V null: no un-rotation. Grid
// (nh, B·T), block hd rounded up to a multiple of 32.
extern "C" __global__ void attn_merge(float* out, int out_ld, const float* part_o, const float* part_ml,
                                      const float* RV, int nh, int hd, int nsplit) {
  __shared__ float orot[MAXHD];
  __shared__ float ml[2];
  int h = blockIdx.x, bt = blockIdx.y, j = threadIdx.x;
  i64 row0 = ((i64)bt * nh + h) * nsplit;
  if (j == 0) {
    float M = NEG_INF;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, part_ml[(row0 + s) * 2]);
    float L = 0.f;
    for (int s = 0; s < nsplit; ++s) {
      float m = part_ml[(row0 + s) * 2];
      if (m != NEG_INF) L += part_ml[(row0 + s) * 2 + 1] * expf(m - M);
    }
    ml[0] = M;
    ml[1] = L;
  }
  __syncthreads();
  float M = ml[0], L = ml[1];
  float ar = 0.f, af = 0.f;
  if (j < hd) {
    for (int s = 0; s < nsplit; ++s) {
      float m = part_ml[(row0 + s) * 2];
      if (m == NEG_INF) continue;
      float w = expf(m - M);
      ar += w * part_o[(row0 + s) * 2 * hd + j];
      af += w * part_o[(row0 + s) * 2 * hd + hd + j];
    }
    orot[j] = ar;
  }
  __syncthreads();
  if (j < hd) {
    float o = af;
    if (RV) {
      for (int i = 0; i < hd; ++i) o += orot[i] * RV[(i64)j * hd + i];
    } else {
      o += ar;
    }
    out[(i64)bt * out_ld + (i64)h * hd + j] = o / L;
  }
}
