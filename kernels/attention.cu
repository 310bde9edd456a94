// KV writes and attention over windows and pages.
//
// Cache layout (per layer): K, V [pages, page_tokens, KH, D] as raw bf16 words or fp8 bytes; fp8
// keeps one fp32 scale per (token, head) in [pages, page_tokens, KH]. A row's page table turns an
// absolute position p into the flat slot table[p / PT] * PT + p % PT, so a window and a page are
// the same thing to these kernels.
//
// Decode attention splits every row's keys at absolute positions into chunks of CHUNK, one block
// per (chunk, kv head, row); partials (max, sum, unnormalised out) merge in a fixed tree of chunk
// groups. The split depends only on the position, never on the page size or on how many rows run.
#include "common.cuh"

// CHUNK (absolute key positions per decode-attention block) and GROUP (chunks merged together before
// the groups are): kernels/launch.py holds the one value of each and defines them (-DCHUNK=, -DGROUP=).
#if !defined(CHUNK) || !defined(GROUP)
#error "attention.cu needs CHUNK and GROUP: compile it through kernels.launch"
#endif

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
// grid = (KH, n, nch), block = 128: chunk-major, so a short context's live chunks dispatch before the
// empty ones (the grid is sized for the longest context a captured graph may see). A block takes one
// CHUNK-key chunk of one row for the G query heads of one kv head: K and V of the chunk come into
// shared memory by cp.async (all in flight at once), then scores, softmax and the weighted values
// run from shared memory. With kn given, the block whose chunk holds the row's own position first
// writes that position's K/V (norm + RoPE + encoding, as kv_write) to the cache and into its tile,
// so no separate write kernel runs.
// Partials (max, sum, unnormalised out) merge in a fixed tree by absolute position: chunks in
// groups of GROUP in chunk order by the last of the group to finish, then the groups in order by
// the last group to finish. Dynamic shared memory: decode_smem() in launch.py.
// part: [n, H, nch, D + 2]; gpart: [n, H, ngroups, D + 2]; counters [n * KH * (ngroups + 1)], zero.

DEV u32 smem_u32(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
DEV void cp_async16(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
DEV void cp_async_commit_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// 8 stored K/V elements at p (bf16: 4 words, fp8: 2 words; 16- or 8-byte aligned) as floats, exactly.
template <int KV8>
DEV void kv_piece(const u32* p, float* f) {
  if (KV8) {
    const uint2 w = *(const uint2*)p;
    const u32 ws[2] = {w.x, w.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      u32 lo, hi;
      asm("{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.rn.f16x2.e4m3x2 %0, a; cvt.rn.f16x2.e4m3x2 %1, b; }"
          : "=r"(lo), "=r"(hi) : "r"(ws[i]));
      f[4 * i] = f16_to_f32(lo); f[4 * i + 1] = f16_to_f32(lo >> 16);
      f[4 * i + 2] = f16_to_f32(hi); f[4 * i + 3] = f16_to_f32(hi >> 16);
    }
  } else {
    const uint4 w = *(const uint4*)p;
    const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) { f[2 * i] = bf16_to_f32(ws[i]); f[2 * i + 1] = bf16_to_f32(ws[i] >> 16); }
  }
}

// One head vector b[0..D) encoded into a cache row: raw bits to dst (global) and tile (shared),
// the fp8 scale (amax / 448, 1 for a zero row) to *sdst and *stile. One warp.
template <int KV8>
DEV void encode_head(const float* b, int D, void* dst, void* tile, float* sdst, float* stile, int lane) {
  if (KV8) {
    float amax = 0.0f;
    for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(b[d]));
    amax = warp_max(amax);
    const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    for (int d = lane; d < D; d += 32) {
      const u8 c = f32_to_fp8(__fdiv_rn(b[d], scale));
      ((u8*)dst)[d] = c;
      ((u8*)tile)[d] = c;
    }
    if (lane == 0) { *sdst = scale; *stile = scale; }
  } else {
    for (int d = lane; d < D; d += 32) {
      const u16 c = f32_to_bf16(b[d]);
      ((u16*)dst)[d] = c;
      ((u16*)tile)[d] = c;
    }
  }
}

// Merge partials src[0..cnt) (each D + 2 floats: out, max, sum; stride PD) in order into
// (max, sum, out) at dst, or into out / sum at fin when fin is given. Threads own dims.
DEV void merge_partials(const float* src, int cnt, int PD, int D, float* dst, float* fin, int tid, int nthr) {
  float M = -__int_as_float(0x7f800000);
  for (int c = 0; c < cnt; ++c) M = fmaxf(M, __ldcg(src + (i64)c * PD + D));
  float den = 0.0f;
  for (int c = 0; c < cnt; ++c)
    den = fmaf(expf(__ldcg(src + (i64)c * PD + D) - M), __ldcg(src + (i64)c * PD + D + 1), den);
  for (int d = tid; d < D; d += nthr) {
    float num = 0.0f;
    for (int c = 0; c < cnt; ++c) num = fmaf(expf(__ldcg(src + (i64)c * PD + D) - M), __ldcg(src + (i64)c * PD + d), num);
    if (fin != nullptr) fin[d] = num / den;
    else dst[d] = num;
  }
  if (fin == nullptr && tid == 0) { dst[D] = M; dst[D + 1] = den; }
}

template <int KV8>
__global__ void __launch_bounds__(128) attn_decode(const float* __restrict__ q, i64 qs0, i64 qs1,
                                                   const float* __restrict__ qnw, float qeps,
                                                   const double* __restrict__ inv, int half,
                                                   const float* __restrict__ kn, i64 ks0, i64 ks1,
                                                   const float* __restrict__ knw, float keps,
                                                   const float* __restrict__ vn, i64 vs0, i64 vs1,
                                                   const int* __restrict__ positions, const int* __restrict__ tables,
                                                   int tw, int pt, void* __restrict__ kc, void* __restrict__ vc,
                                                   float* __restrict__ ksc, float* __restrict__ vsc, int KH, int G,
                                                   int D, float scale, float* __restrict__ part,
                                                   float* __restrict__ gpart, int nch, int* __restrict__ counters,
                                                   float* __restrict__ out) {
  extern __shared__ __align__(16) float sm[];
  __shared__ float m_s[16], l_s[16];
  __shared__ i64 slot_s[CHUNK];
  __shared__ int flag_s;
  const int kh = blockIdx.x, row = blockIdx.y, c = blockIdx.z;  // chunk-major: live chunks dispatch first
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int H = KH * G;
  const int pos = positions[row];
  const int L = pos + 1, nvalid = (L + CHUNK - 1) / CHUNK;
  if (c >= nvalid) return;
  const int RW = KV8 ? D / 4 : D / 2, PW = RW + 8, QW = RW / 4;  // words per key row, pitch, 16-byte pieces
  u32* kt = (u32*)sm;                      // [CHUNK][PW]
  u32* vt = kt + CHUNK * PW;               // [CHUNK][PW]
  float* q_s = (float*)(vt + CHUNK * PW);  // [G][D]
  float* s_s = q_s + G * D;                // [G][CHUNK]
  float* ksc_s = s_s + G * CHUNK;          // [CHUNK]
  float* vsc_s = ksc_s + CHUNK;            // [CHUNK]
  float* nb = vsc_s + CHUNK;               // [2][D]: the row's new K and V heads
  const int* tab = tables + (i64)row * tw;
  const int k0 = c * CHUNK, nk = min(CHUNK, L - k0);
  const bool writer = kn != nullptr && c == nvalid - 1;

  if (tid < nk) slot_s[tid] = slot_of(tab, k0 + tid, pt);
  __syncthreads();
  for (int e = tid; e < nk * QW; e += 128) {
    const int j = e / QW, w4 = e % QW;
    const i64 off = (slot_s[j] * KH + kh) * RW + 4 * w4;
    cp_async16(smem_u32(kt + j * PW + 4 * w4), (const u32*)kc + off);
    cp_async16(smem_u32(vt + j * PW + 4 * w4), (const u32*)vc + off);
  }
  if (KV8 && tid < nk) {
    ksc_s[tid] = ksc[slot_s[tid] * KH + kh];
    vsc_s[tid] = vsc[slot_s[tid] * KH + kh];
  }
  for (int g = warp; g < G; g += 4)
    load_head(q_s + g * D, q, (i64)row * qs0 + (i64)(kh * G + g) * qs1, D, qnw, qeps, positions, row, inv, half, lane);
  if (writer && warp == 0)
    load_head(nb, kn, (i64)row * ks0 + (i64)kh * ks1, D, knw, keps, positions, row, inv, half, lane);
  if (writer && warp == 1)
    load_head(nb + D, vn, (i64)row * vs0 + (i64)kh * vs1, D, nullptr, 0.0f, nullptr, row, nullptr, 0, lane);
  cp_async_commit_wait_all();
  __syncthreads();
  if (writer && warp < 2) {  // the tile holds the old bits at pos: overwrite them with the new ones
    const int j = pos - k0;
    const i64 base = (slot_s[j] * KH + kh) * D;
    if (warp == 0)
      encode_head<KV8>(nb, D, KV8 ? (void*)((u8*)kc + base) : (void*)((u16*)kc + base), kt + j * PW,
                       ksc + slot_s[j] * KH + kh, ksc_s + j, lane);
    else
      encode_head<KV8>(nb + D, D, KV8 ? (void*)((u8*)vc + base) : (void*)((u16*)vc + base), vt + j * PW,
                       vsc + slot_s[j] * KH + kh, vsc_s + j, lane);
  }
  __syncthreads();

  // --- scores: two threads per key, alternating 8-dim pieces ---
  {
    const int j = tid >> 1, h = tid & 1;
    float acc[16];
#pragma unroll
    for (int g = 0; g < 16; ++g) acc[g] = 0.0f;
    if (j < nk) {
      for (int i = h; i < D / 8; i += 2) {
        float kv[8];
        kv_piece<KV8>(kt + j * PW + (KV8 ? 2 : 4) * i, kv);
#pragma unroll
        for (int g = 0; g < 16; ++g) {
          if (g < G) {
            const float4 qa = *(const float4*)(q_s + g * D + 8 * i), qb = *(const float4*)(q_s + g * D + 8 * i + 4);
            float a = acc[g];
            a = fmaf(qa.x, kv[0], a); a = fmaf(qa.y, kv[1], a); a = fmaf(qa.z, kv[2], a); a = fmaf(qa.w, kv[3], a);
            a = fmaf(qb.x, kv[4], a); a = fmaf(qb.y, kv[5], a); a = fmaf(qb.z, kv[6], a); a = fmaf(qb.w, kv[7], a);
            acc[g] = a;
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < 16; ++g) {
      if (g < G) {
        const float other = __shfl_xor_sync(FULL_MASK, acc[g], 1);
        const float a = h == 0 ? acc[g] + other : other + acc[g];  // the same bits in both threads
        if (h == 0 && j < CHUNK)
          s_s[g * CHUNK + j] = j < nk ? (KV8 ? a * ksc_s[j] : a) * scale : -__int_as_float(0x7f800000);
      }
    }
  }
  __syncthreads();
  // --- softmax statistics of the chunk, one warp per head ---
  for (int g = warp; g < G; g += 4) {
    float m = -__int_as_float(0x7f800000);
    for (int j = lane; j < nk; j += 32) m = fmaxf(m, s_s[g * CHUNK + j]);
    m = warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < CHUNK; j += 32) {
      const float p = j < nk ? expf(s_s[g * CHUNK + j] - m) : 0.0f;
      s_s[g * CHUNK + j] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) { m_s[g] = m; l_s[g] = l; }
  }
  __syncthreads();
  // --- weighted values: a thread per (head, 8-dim piece) ---
  const int PD = D + 2, NP = D / 8;
  for (int it = tid; it < G * NP; it += 128) {
    const int g = it / NP, i = it % NP;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = 0.0f;
    for (int j = 0; j < nk; ++j) {
      const float p = s_s[g * CHUNK + j];
      float v[8];
      kv_piece<KV8>(vt + j * PW + (KV8 ? 2 : 4) * i, v);
      if (KV8) {
        const float vs = vsc_s[j];
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = __fmul_rn(v[e], vs);
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = fmaf(p, v[e], o[e]);
    }
    const i64 hrow = (i64)row * H + kh * G + g;
    if (nvalid == 1) {
#pragma unroll
      for (int e = 0; e < 8; ++e) out[hrow * D + 8 * i + e] = o[e] / l_s[g];
    } else {
      float* pr = part + (hrow * nch + c) * PD;
#pragma unroll
      for (int e = 0; e < 8; ++e) pr[8 * i + e] = o[e];
      if (i == 0) { pr[D] = m_s[g]; pr[D + 1] = l_s[g]; }
    }
  }
  if (nvalid == 1) return;
  // --- merge: chunks of a group in order, then groups in order ---
  const int ng = (nvalid + GROUP - 1) / GROUP, grp = c / GROUP;
  const int gcnt = min(GROUP, nvalid - grp * GROUP);
  const int gmax = (nch + GROUP - 1) / GROUP;
  int* cnt = counters + ((i64)row * KH + kh) * (gmax + 1);
  __threadfence();
  __syncthreads();
  if (tid == 0) flag_s = atomicAdd(cnt + 1 + grp, 1) == gcnt - 1;
  __syncthreads();
  if (!flag_s) return;
  __threadfence();
  for (int g = warp; g < G; g += 4) {
    const i64 hrow = (i64)row * H + kh * G + g;
    merge_partials(part + (hrow * nch + grp * GROUP) * PD, gcnt, PD, D, gpart + (hrow * gmax + grp) * PD,
                   ng == 1 ? out + hrow * D : nullptr, lane, 32);
  }
  if (tid == 0) cnt[1 + grp] = 0;
  if (ng == 1) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) flag_s = atomicAdd(cnt, 1) == ng - 1;
  __syncthreads();
  if (!flag_s) return;
  __threadfence();
  for (int g = warp; g < G; g += 4) {
    const i64 hrow = (i64)row * H + kh * G + g;
    merge_partials(gpart + hrow * gmax * PD, ng, PD, D, nullptr, out + hrow * D, lane, 32);
  }
  if (tid == 0) cnt[0] = 0;
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
