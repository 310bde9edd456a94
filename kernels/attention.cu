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
// Prompt chunks' attention is attn_prompt.cu's.
#include "common.cuh"

// CHUNK (absolute key positions per decode-attention block) and GROUP (chunks merged together before
// the groups are): kernels/launch.py holds the one value of each and defines them (-DCHUNK=, -DGROUP=).
#if !defined(CHUNK) || !defined(GROUP)
#error "attention.cu needs CHUNK and GROUP: compile it through kernels.launch"
#endif

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
// (max, sum, out) at dst, or into out / sum at fin when fin is given. One warp, D <= 256: lane j
// loads partial j's statistics (all loads in flight at once), the weights reach every lane by
// shuffles and each lane adds its dims over the partials in order.
DEV void merge_partials(const float* src, int cnt, int PD, int D, float* dst, float* fin, int lane) {
  float M = -__int_as_float(0x7f800000);
  for (int c = lane; c < cnt; c += 32) M = fmaxf(M, __ldcg(src + (i64)c * PD + D));
  M = warp_max(M);
  float den = 0.0f, num[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) num[e] = 0.0f;
  for (int c0 = 0; c0 < cnt; c0 += 32) {
    const int c = c0 + lane, n = min(32, cnt - c0);
    const float w = c < cnt ? expf(__ldcg(src + (i64)c * PD + D) - M) : 0.0f;
    const float l = c < cnt ? __ldcg(src + (i64)c * PD + D + 1) : 0.0f;
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
      const float wi = __shfl_sync(FULL_MASK, w, i);
      den = fmaf(wi, __shfl_sync(FULL_MASK, l, i), den);
      const float* pc = src + (i64)(c0 + i) * PD;
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (lane + 32 * e < D) num[e] = fmaf(wi, __ldcg(pc + lane + 32 * e), num[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int d = lane + 32 * e;
    if (d >= D) break;
    if (fin != nullptr) fin[d] = num[e] / den;
    else dst[d] = num[e];
  }
  if (fin == nullptr && lane == 0) { dst[D] = M; dst[D + 1] = den; }
}

template <int KV8>
__global__ void __launch_bounds__(256, 3) attn_decode(const float* __restrict__ q, i64 qs0, i64 qs1,
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
  for (int e = tid; e < nk * QW; e += 256) {
    const int j = e / QW, w4 = e % QW;
    const i64 off = (slot_s[j] * KH + kh) * RW + 4 * w4;
    cp_async16(smem_addr(kt + j * PW + 4 * w4), (const u32*)kc + off);
    cp_async16(smem_addr(vt + j * PW + 4 * w4), (const u32*)vc + off);
  }
  if (KV8 && tid < nk) {
    ksc_s[tid] = ksc[slot_s[tid] * KH + kh];
    vsc_s[tid] = vsc[slot_s[tid] * KH + kh];
  }
  for (int g = warp; g < G; g += 8)
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

  // --- scores: four threads per key, alternating 8-dim pieces ---
  {
    const int j = tid >> 2, h = tid & 3;
    float acc[16];
#pragma unroll
    for (int g = 0; g < 16; ++g) acc[g] = 0.0f;
    if (j < nk) {
      for (int i = h; i < D / 8; i += 4) {
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
        float a = __fadd_rn(acc[g], __shfl_xor_sync(FULL_MASK, acc[g], 1));  // commutative: one value in
        a = __fadd_rn(a, __shfl_xor_sync(FULL_MASK, a, 2));                     // all four threads
        if (h == 0 && j < CHUNK)
          s_s[g * CHUNK + j] = j < nk ? (KV8 ? a * ksc_s[j] : a) * scale : -__int_as_float(0x7f800000);
      }
    }
  }
  __syncthreads();
  // --- softmax statistics of the chunk, one warp per head ---
  for (int g = warp; g < G; g += 8) {
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
  // --- weighted values: S adjacent threads per (head, 8-dim piece), keys interleaved among them ---
  const int PD = D + 2, NP = D / 8, items = G * NP;
  const int S = items >= 256 ? 1 : (items >= 128 ? 2 : (items >= 64 ? 4 : 8));  // a schedule of G and D only
  const int sub = tid % S;
  for (int it0 = 0; it0 < items * S; it0 += 256) {  // whole warps every pass: the shuffles need all lanes
    const int it = (it0 + tid) / S, g = it / NP, i = it % NP;
    const bool here = it < items;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = 0.0f;
    for (int j = sub; here && j < nk; j += S) {
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
    for (int x = 1; x < S; x <<= 1)  // butterfly: every one of the S threads ends with the same sum
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = __fadd_rn(o[e], __shfl_xor_sync(FULL_MASK, o[e], x));
    if (!here || sub != 0) continue;
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
  for (int g = warp; g < G; g += 8) {
    const i64 hrow = (i64)row * H + kh * G + g;
    merge_partials(part + (hrow * nch + grp * GROUP) * PD, gcnt, PD, D, gpart + (hrow * gmax + grp) * PD,
                   ng == 1 ? out + hrow * D : nullptr, lane);
  }
  if (tid == 0) cnt[1 + grp] = 0;
  if (ng == 1) return;
  __threadfence();
  __syncthreads();
  if (tid == 0) flag_s = atomicAdd(cnt, 1) == ng - 1;
  __syncthreads();
  if (!flag_s) return;
  __threadfence();
  for (int g = warp; g < G; g += 8) {
    const i64 hrow = (i64)row * H + kh * G + g;
    merge_partials(gpart + hrow * gmax * PD, ng, PD, D, nullptr, out + hrow * D, lane);
  }
  if (tid == 0) cnt[0] = 0;
}
