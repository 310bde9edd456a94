// KV writes and attention over windows and pages.
//
// Cache layout (per layer): K, V [pages, page_tokens, KH, D] as raw bf16 words or fp8 bytes; fp8
// keeps one fp32 scale per (token, head) in [pages, page_tokens, KH]. A row's page table turns an
// absolute position p into the flat slot table[p / PT] * PT + p % PT, so a window and a page are
// the same thing to these kernels.
//
// Decode attention splits every row's keys at absolute positions into chunks of 256, one block
// per (chunk, kv head, row); each writes a partial (max, sum, unnormalised out) and the last block
// of a (row, kv head) to finish merges the partials in chunk order. The split depends only on the
// position, never on the page size or on how many rows run.
#include "common.cuh"

#define CHUNK 256

DEV i64 slot_of(const int* __restrict__ tab, int p, int pt) { return (i64)tab[p / pt] * pt + (p % pt); }

// New K (with its lazy q/k norm + RoPE) and V of n rows into the cache. grid = (n, KH), block = 64:
// warp 0 encodes K, warp 1 V. fp8: scale = amax / 448 (1 if amax is 0), value = x / scale, both
// rounded like numpy + ml_dtypes.
template <int KV8>
__global__ void __launch_bounds__(64) kv_write(const float* __restrict__ k, i64 ks0, i64 ks1,
                                               const float* __restrict__ knw, float keps,
                                               const double* __restrict__ inv, int half,
                                               const float* __restrict__ v, i64 vs0, i64 vs1,
                                               const int* __restrict__ positions, const int* __restrict__ tables,
                                               int tw, int pt, int KH, int D, void* __restrict__ kc,
                                               void* __restrict__ vc, float* __restrict__ ksc,
                                               float* __restrict__ vsc) {
  __shared__ float buf[2][256];
  const int row = blockIdx.x, kh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pos = positions[row];
  const i64 slot = slot_of(tables + (i64)row * tw, pos, pt);
  float* b = buf[warp];
  if (warp == 0) load_head(b, k, (i64)row * ks0 + (i64)kh * ks1, D, knw, keps, positions, row, inv, half, lane);
  else load_head(b, v, (i64)row * vs0 + (i64)kh * vs1, D, nullptr, 0.0f, nullptr, row, nullptr, 0, lane);
  void* dst = warp == 0 ? kc : vc;
  const i64 base = (slot * KH + kh) * D;
  if (KV8) {
    float amax = 0.0f;
    for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(b[d]));
    amax = warp_max(amax);
    const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    for (int d = lane; d < D; d += 32) ((u8*)dst)[base + d] = f32_to_fp8(__fdiv_rn(b[d], scale));
    if (lane == 0) (warp == 0 ? ksc : vsc)[slot * KH + kh] = scale;
  } else {
    for (int d = lane; d < D; d += 32) ((u16*)dst)[base + d] = f32_to_bf16(b[d]);
  }
}

// Decode attention of n rows, each over its own lane's keys 0..positions[row].
// grid = (nch, KH, n), block = 128. A block takes one 256-key chunk of one row for the G query
// heads of one kv head: K then V come into shared memory 64 keys at a time with 16-byte loads,
// all in flight together; scores, softmax and the weighted sum run from shared memory.
// Dynamic shared = G*D + G*CHUNK floats, CHUNK slots (i64), CHUNK fp8 scales, one raw tile of
// KT_DEC keys (64, or 32 for wide heads: under 48 KB).
// part: [n, H, nch, D + 2] partials; counters: [n * KH] ints, zero between launches.

template <int KV8>
DEV int kv_row_words(int D) { return KV8 ? D / 4 : D / 2; }  // 32-bit words of one key row

template <int KV8>
__global__ void __launch_bounds__(128) attn_decode(const float* __restrict__ q, i64 qs0, i64 qs1,
                                                   const float* __restrict__ qnw, float qeps,
                                                   const double* __restrict__ inv, int half,
                                                   const int* __restrict__ positions, const int* __restrict__ tables,
                                                   int tw, int pt, const void* __restrict__ kc,
                                                   const void* __restrict__ vc, const float* __restrict__ ksc,
                                                   const float* __restrict__ vsc, int KH, int G, int D, float scale,
                                                   float* __restrict__ part, int nch, int* __restrict__ counters,
                                                   int KT_DEC, float* __restrict__ out) {
  extern __shared__ float sm[];
  __shared__ float m_s[16], l_s[16];
  __shared__ int last_s;
  const int c = blockIdx.x, kh = blockIdx.y, row = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int H = KH * G;
  const int pos = positions[row];
  const int L = pos + 1, nvalid = (L + CHUNK - 1) / CHUNK;
  if (c >= nvalid) return;
  const int RW = kv_row_words<KV8>(D), PW = RW + 1;  // row words, padded pitch (odd: no bank conflicts)
  float* q_s = sm;                                   // [G][D]
  float* s_s = q_s + G * D;                          // [G][CHUNK]
  i64* slot_s = (i64*)(s_s + G * CHUNK);             // [CHUNK]
  float* sc_s = (float*)(slot_s + CHUNK);            // [CHUNK] fp8 scales of the tile's keys
  u32* t_s = (u32*)(sc_s + CHUNK);                   // [KT_DEC][PW] raw K or V words
  const int* tab = tables + (i64)row * tw;
  const int k0 = c * CHUNK, nk = min(CHUNK, L - k0);

  for (int g = warp; g < G; g += 4)
    load_head(q_s + g * D, q, (i64)row * qs0 + (i64)(kh * G + g) * qs1, D, qnw, qeps, positions, row, inv, half, lane);
  for (int j = tid; j < nk; j += 128) slot_s[j] = slot_of(tab, k0 + j, pt);
  __syncthreads();

  const int QW = RW / 4;  // 16-byte pieces per key row (D % 16 == 0)
  // --- pass 1: scores of every key of the chunk ---
  for (int j0 = 0; j0 < nk; j0 += KT_DEC) {
    const int kt = min(KT_DEC, nk - j0);
    for (int e = tid; e < kt * QW; e += 128) {
      const int j = e / QW, w4 = e % QW;
      const i64 sl = slot_s[j0 + j];
      const uint4 v = *((const uint4*)((const u32*)kc + (sl * KH + kh) * RW) + w4);
      u32* dst = t_s + j * PW + 4 * w4;
      dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
    }
    if (KV8)
      for (int j = tid; j < kt; j += 128) sc_s[j] = ksc[slot_s[j0 + j] * KH + kh];
    __syncthreads();
    for (int e = tid; e < kt * G; e += 128) {
      const int j = e % kt, g = e / kt;
      const u32* kr = t_s + j * PW;
      const float* qg = q_s + g * D;
      float a = 0.0f;
      if (KV8) {
        for (int w = 0; w < RW; ++w) {
          const u32 x = kr[w];
          a = fmaf(qg[4 * w], fp8_to_f32(x & 0xffu), a);
          a = fmaf(qg[4 * w + 1], fp8_to_f32((x >> 8) & 0xffu), a);
          a = fmaf(qg[4 * w + 2], fp8_to_f32((x >> 16) & 0xffu), a);
          a = fmaf(qg[4 * w + 3], fp8_to_f32(x >> 24), a);
        }
        a *= sc_s[j];
      } else {
        for (int w = 0; w < RW; ++w) {
          const u32 x = kr[w];
          a = fmaf(qg[2 * w], bf16_to_f32(x), a);
          a = fmaf(qg[2 * w + 1], bf16_to_f32(x >> 16), a);
        }
      }
      s_s[g * CHUNK + j0 + j] = a * scale;
    }
    __syncthreads();
  }

  // --- softmax statistics of the chunk, one warp per head ---
  for (int g = warp; g < G; g += 4) {
    float m = -__int_as_float(0x7f800000);
    for (int j = lane; j < nk; j += 32) m = fmaxf(m, s_s[g * CHUNK + j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < nk; j += 32) {
      const float p = expf(s_s[g * CHUNK + j] - m);
      s_s[g * CHUNK + j] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) { m_s[g] = m; l_s[g] = l; }
  }

  // --- pass 2: weighted values; thread owns dims tid and tid + 128 of every head ---
  float o[16][2];
#pragma unroll
  for (int g = 0; g < 16; ++g) { o[g][0] = 0.0f; o[g][1] = 0.0f; }
  const int d0 = tid, d1 = tid + 128;
  for (int j0 = 0; j0 < nk; j0 += KT_DEC) {
    const int kt = min(KT_DEC, nk - j0);
    __syncthreads();  // the tile buffer is free (and, the first time, the statistics are written)
    for (int e = tid; e < kt * QW; e += 128) {
      const int j = e / QW, w4 = e % QW;
      const i64 sl = slot_s[j0 + j];
      const uint4 v = *((const uint4*)((const u32*)vc + (sl * KH + kh) * RW) + w4);
      u32* dst = t_s + j * PW + 4 * w4;
      dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
    }
    if (KV8)
      for (int j = tid; j < kt; j += 128) sc_s[j] = vsc[slot_s[j0 + j] * KH + kh];
    __syncthreads();
    for (int j = 0; j < kt; ++j) {
      const u32* vr = t_s + j * PW;
      float v0 = 0.0f, v1 = 0.0f;
      if (KV8) {
        const float vs = sc_s[j];
        if (d0 < D) v0 = __fmul_rn(fp8_to_f32((vr[d0 >> 2] >> (8 * (d0 & 3))) & 0xffu), vs);
        if (d1 < D) v1 = __fmul_rn(fp8_to_f32((vr[d1 >> 2] >> (8 * (d1 & 3))) & 0xffu), vs);
      } else {
        if (d0 < D) v0 = bf16_to_f32(vr[d0 >> 1] >> (16 * (d0 & 1)));
        if (d1 < D) v1 = bf16_to_f32(vr[d1 >> 1] >> (16 * (d1 & 1)));
      }
#pragma unroll
      for (int g = 0; g < 16; ++g) {
        if (g < G) {
          const float p = s_s[g * CHUNK + j0 + j];
          o[g][0] = fmaf(p, v0, o[g][0]);
          o[g][1] = fmaf(p, v1, o[g][1]);
        }
      }
    }
  }

  if (nvalid == 1) {
#pragma unroll
    for (int g = 0; g < 16; ++g) {
      if (g < G) {
        float* orow = out + ((i64)row * H + kh * G + g) * D;
        if (d0 < D) orow[d0] = o[g][0] / l_s[g];
        if (d1 < D) orow[d1] = o[g][1] / l_s[g];
      }
    }
    return;
  }
  const int PD = D + 2;
#pragma unroll
  for (int g = 0; g < 16; ++g) {
    if (g < G) {
      float* pr = part + (((i64)row * H + kh * G + g) * nch + c) * PD;
      if (d0 < D) pr[d0] = o[g][0];
      if (d1 < D) pr[d1] = o[g][1];
      if (tid == 0) { pr[D] = m_s[g]; pr[D + 1] = l_s[g]; }
    }
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const int prev = atomicAdd(counters + (i64)row * KH + kh, 1);
    last_s = prev == nvalid - 1;
  }
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  // the last block: merge the chunks' partials in chunk order
  for (int g = 0; g < G; ++g) {
    const volatile float* pr = part + ((i64)row * H + kh * G + g) * nch * PD;
    float M = -__int_as_float(0x7f800000);
    for (int cc = 0; cc < nvalid; ++cc) M = fmaxf(M, pr[cc * PD + D]);
    float num0 = 0.0f, num1 = 0.0f, den = 0.0f;
    for (int cc = 0; cc < nvalid; ++cc) {
      const float w = expf(pr[cc * PD + D] - M);
      den = fmaf(w, pr[cc * PD + D + 1], den);
      if (d0 < D) num0 = fmaf(w, pr[cc * PD + d0], num0);
      if (d1 < D) num1 = fmaf(w, pr[cc * PD + d1], num1);
    }
    float* orow = out + ((i64)row * H + kh * G + g) * D;
    if (d0 < D) orow[d0] = num0 / den;
    if (d1 < D) orow[d1] = num1 / den;
  }
  if (tid == 0) counters[(i64)row * KH + kh] = 0;
}

// Causal attention of a prompt chunk: n rows of one lane (its page table is the first row's),
// row r over keys 0..positions[r]. grid = (ceil(n / QR), KH), block = 256; each block holds QR rows
// x G heads of queries and walks key tiles of KT positions from 0 (online softmax). A row's result
// depends only on its own position and keys.
template <int KV8>
__global__ void __launch_bounds__(256) attn_prompt(const float* __restrict__ q, i64 qs0, i64 qs1,
                                                   const float* __restrict__ qnw, float qeps,
                                                   const double* __restrict__ inv, int half,
                                                   const int* __restrict__ positions, const int* __restrict__ tables,
                                                   int pt, const void* __restrict__ kc, const void* __restrict__ vc,
                                                   const float* __restrict__ ksc, const float* __restrict__ vsc,
                                                   int KH, int G, int D, float scale, int n, int QR, int KT,
                                                   float* __restrict__ out) {
  extern __shared__ float sm[];
  __shared__ int pos_s[64];
  __shared__ int maxpos_s;
  const int kh = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int H = KH * G, QV = QR * G;
  const int rbase = blockIdx.x * QR;
  float* q_s = sm;                    // [QV][D]
  float* k_s = q_s + QV * D;          // [KT][D + 1]
  float* v_s = k_s + KT * (D + 1);    // [KT][D]
  float* s_s = v_s + KT * D;          // [QV][KT]
  float* m_s = s_s + QV * KT;         // [QV]
  float* l_s = m_s + QV;              // [QV]
  float* a_s = l_s + QV;              // [QV]

  if (tid < QR) pos_s[tid] = rbase + tid < n ? positions[rbase + tid] : 0;
  __syncthreads();
  if (tid == 0) {
    int mp = 0;
    for (int r = 0; r < QR; ++r) mp = max(mp, pos_s[r]);
    maxpos_s = mp;
  }
  for (int qv = warp; qv < QV; qv += 8) {
    const int r = qv / G, g = qv % G;
    const int row = min(rbase + r, n - 1);
    load_head(q_s + qv * D, q, (i64)row * qs0 + (i64)(kh * G + g) * qs1, D, qnw, qeps, positions, row, inv, half, lane);
  }
  for (int qv = tid; qv < QV; qv += 256) { m_s[qv] = -__int_as_float(0x7f800000); l_s[qv] = 0.0f; }
  __syncthreads();
  const int maxpos = maxpos_s;
  const int* tab = tables;  // every row of a prompt chunk shares its lane's table: the first row's
  const int nout = QV * D;
  float o[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i] = 0.0f;

  for (int k0 = 0; k0 <= maxpos; k0 += KT) {
    // K and V tiles (decoded, fp8 scaled) into shared memory
    for (int idx = tid; idx < KT * D; idx += 256) {
      const int j = idx / D, d = idx % D, p = k0 + j;
      float kvv = 0.0f, vvv = 0.0f;
      if (p <= maxpos) {
        const i64 sl = slot_of(tab, p, pt);
        const i64 e = (sl * KH + kh) * D + d;
        kvv = kv_elem<KV8>(kc, e);
        vvv = kv_elem<KV8>(vc, e);
        if (KV8) {
          kvv = __fmul_rn(kvv, ksc[sl * KH + kh]);
          vvv = __fmul_rn(vvv, vsc[sl * KH + kh]);
        }
      }
      k_s[j * (D + 1) + d] = kvv;
      v_s[j * D + d] = vvv;
    }
    __syncthreads();
    // scores
    for (int idx = tid; idx < QV * KT; idx += 256) {
      const int qv = idx / KT, j = idx % KT, p = k0 + j;
      float a = -__int_as_float(0x7f800000);
      if (p <= pos_s[qv / G]) {
        a = 0.0f;
        for (int d = 0; d < D; ++d) a = fmaf(q_s[qv * D + d], k_s[j * (D + 1) + d], a);
        a *= scale;
      }
      s_s[qv * KT + j] = a;
    }
    __syncthreads();
    // online softmax update, one thread per query vector
    for (int qv = tid; qv < QV; qv += 256) {
      const float mo = m_s[qv];
      float mt = mo;
      for (int j = 0; j < KT; ++j) mt = fmaxf(mt, s_s[qv * KT + j]);
      const float alpha = expf(mo - mt);
      float l = 0.0f;
      for (int j = 0; j < KT; ++j) {
        const float p = expf(s_s[qv * KT + j] - mt);
        s_s[qv * KT + j] = p;
        l += p;
      }
      l_s[qv] = fmaf(l_s[qv], alpha, l);
      m_s[qv] = mt;
      a_s[qv] = alpha;
    }
    __syncthreads();
    // weighted values
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int idx = tid + 256 * i;
      if (idx < nout) {
        const int qv = idx / D, d = idx % D;
        float acc = o[i] * a_s[qv];
        for (int j = 0; j < KT; ++j) acc = fmaf(s_s[qv * KT + j], v_s[j * D + d], acc);
        o[i] = acc;
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int idx = tid + 256 * i;
    if (idx < nout) {
      const int qv = idx / D, d = idx % D, r = qv / G, g = qv % G;
      if (rbase + r < n) out[((i64)(rbase + r) * H + kh * G + g) * D + d] = o[i] / l_s[qv];
    }
  }
}
