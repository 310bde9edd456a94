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
                                               const float2* __restrict__ cs, int half,
                                               const float* __restrict__ v, i64 vs0, i64 vs1,
                                               const int* __restrict__ positions, const int* __restrict__ tables,
                                               int tw, int pt, int KH, int D, void* __restrict__ kc,
                                               void* __restrict__ vc, float* __restrict__ ksc,
                                               float* __restrict__ vsc) {
  PDL_ENTRY;
  __shared__ float buf[2][256];
  const int row = blockIdx.x, kh = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pos = positions[row];
  const i64 slot = slot_of(tables + (i64)row * tw, pos, pt);
  float* b = buf[warp];
  if (warp == 0) load_head(b, k, (i64)row * ks0 + (i64)kh * ks1, D, knw, keps, rope_row(cs, row, half), half, lane);
  else load_head(b, v, (i64)row * vs0 + (i64)kh * vs1, D, nullptr, 0.0f, nullptr, 0, lane);
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
// grid = (KH, n, nch), block = 256: chunk-major, so a short context's live chunks dispatch before the
// empty ones (the grid is sized for the longest context a captured graph may see). A block takes a
// run of CHUNK-key chunks of one row (one chunk at short contexts; a power of two of a group's chunks
// when the row's chunks outnumber the blocks the GPU wants, chunks_per_block) for the G query heads of
// one kv head: q is loaded once, each chunk's K and V come into shared memory as bf16 tiles (by
// cp.async; fp8 decoded on the way, exactly; with two stages the next chunk loads during this one's
// products), then the scores and the weighted values run on tensor cores (warp tiles of 16 keys or
// dims by 8 heads), the softmax one warp a head. With kn given, the block whose chunk holds the
// row's own position first writes that position's K/V (norm + RoPE + encoding, as kv_write) to the
// cache and into its tile, so no separate write kernel runs.
// Partials (max, sum, unnormalised out) are a chunk's own, whichever block computes it, and merge in a
// fixed tree by absolute position: chunks in groups of GROUP in chunk order by the last block of the
// group to finish, then the groups in order by the last group to finish. Dynamic shared memory:
// decode_smem() in launch.py.
// part: [n, H, nch, D + 2]; gpart: [n, H, ngroups, D + 2]; counters [n * KH * (ngroups + 1)], zero.


// Two floats as three bf16x2 parts (h + m + l holds 24 bits of mantissa: their products with bf16
// operands, summed in fp32, are fp32's).
DEV void split3(float2 v, u32& h, u32& m, u32& l) {
  h = pack_bf16x2(v.x, v.y);
  const float rx = __fsub_rn(v.x, bf16_to_f32(h)), ry = __fsub_rn(v.y, bf16_to_f32(h >> 16));
  m = pack_bf16x2(rx, ry);
  l = pack_bf16x2(__fsub_rn(rx, bf16_to_f32(m)), __fsub_rn(ry, bf16_to_f32(m >> 16)));
}

// 8 fp8 K/V elements (2 words) as bf16 (4 words): e4m3 values are exact in bf16.
DEV uint4 fp8_piece(uint2 w) {
  const u32 ws[2] = {w.x, w.y};
  u32 out[4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    u32 lo, hi;
    asm("{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.rn.f16x2.e4m3x2 %0, a; cvt.rn.f16x2.e4m3x2 %1, b; }"
        : "=r"(lo), "=r"(hi) : "r"(ws[i]));
    out[2 * i] = pack_bf16x2(f16_to_f32(lo), f16_to_f32(lo >> 16));
    out[2 * i + 1] = pack_bf16x2(f16_to_f32(hi), f16_to_f32(hi >> 16));
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// One head vector b[0..D) encoded into a cache row: raw bits to dst (global), the value they
// decode to as bf16 to tile (shared; fp8 values are exact in bf16), the fp8 scale (amax / 448, 1 for
// a zero row) to *sdst and *stile. One warp.
template <int KV8>
DEV void encode_head(const float* b, int D, void* dst, u16* tile, float* sdst, float* stile, int lane) {
  if (KV8) {
    float amax = 0.0f;
    for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(b[d]));
    amax = warp_max(amax);
    const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
    for (int d = lane; d < D; d += 32) {
      const u8 c = f32_to_fp8(__fdiv_rn(b[d], scale));
      ((u8*)dst)[d] = c;
      tile[d] = f32_to_bf16(fp8_to_f32(c));
    }
    if (lane == 0) { *sdst = scale; *stile = scale; }
  } else {
    for (int d = lane; d < D; d += 32) {
      const u16 c = f32_to_bf16(b[d]);
      ((u16*)dst)[d] = c;
      tile[d] = c;
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

// Chunks a two-stage block takes (a one-stage block takes one: separate blocks overlap one another
// best). Below LONG chunks, one too. Past it, the fewest (a power of two up to GROUP) that fit the
// launch's (kv head, row) pairs in one wave of `resident` blocks: q is loaded once a block, and the
// next chunk loads during this one's products. Which block computes a chunk changes no bits.
constexpr int LONG = 64;
DEV int chunks_per_block(int nvalid, int units, int resident) {
  if (nvalid < LONG) return 1;
  int cpb = 1;
  while (cpb < GROUP && units * ((nvalid + cpb - 1) / cpb) > resident) cpb *= 2;
  return cpb;
}

// ST stages of K/V tiles: with 2, the next chunk's tiles load while this chunk's products run.
template <int KV8, int ST>
__global__ void __launch_bounds__(256, ST == 1 ? 3 : 2) attn_decode(
    const float* __restrict__ q, i64 qs0, i64 qs1, const float* __restrict__ qnw, float qeps,
    const float2* __restrict__ cs, int half, const float* __restrict__ kn, i64 ks0, i64 ks1,
    const float* __restrict__ knw, float keps, const float* __restrict__ vn, i64 vs0, i64 vs1,
    const int* __restrict__ positions, const int* __restrict__ tables, int tw, int pt, void* __restrict__ kc,
    void* __restrict__ vc, float* __restrict__ ksc, float* __restrict__ vsc, int KH, int G, int D, float scale,
    float* __restrict__ part, float* __restrict__ gpart, int nch, int resident, int* __restrict__ counters,
    float* __restrict__ out) {
  extern __shared__ __align__(16) float sm[];
  __shared__ float m_s[16], l_s[16];
  __shared__ i64 slot_s[ST][CHUNK];
  __shared__ int flag_s;
  const int kh = blockIdx.x, row = blockIdx.y;  // blockIdx.z chunk-major: live chunks dispatch first
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, t4 = lane & 3;
  const int H = KH * G, NT = (G + 7) / 8;  // n-tiles of 8 heads
  const int pos = positions[row];
  const int L = pos + 1, nvalid = (L + CHUNK - 1) / CHUNK;
  if (blockIdx.z >= nvalid) return;  // no live chunk (the grid fits the longest context): before any dependent access
  const int cpb = ST == 2 ? chunks_per_block(nvalid, KH * gridDim.y, resident) : 1;
  const int first = blockIdx.z * cpb, last = ST == 2 ? min(first + cpb, nvalid) : first + 1;
  if (first >= nvalid) return;  // before any dependent access
  // With the new K/V written here, the kernel before wrote no cache: the tables (the host's) and the
  // older keys (earlier steps') are read before the wait. Without (a verify window, whose kv_write
  // runs just before), the wait comes first.
  const bool early = kn != nullptr;
  if (!early) PDL_ENTRY;
  const int PW = D / 2 + 4, QP = D + 8, SP = CHUNK + 8;  // pitches: bf16 words of a key, floats of q and p
  u32* tiles = (u32*)sm;                          // ST x {K, V} [CHUNK][PW] bf16 (fp8 decoded: exact)
  float* q_s = (float*)(tiles + ST * 2 * CHUNK * PW);  // [G][QP]
  float* s_s = q_s + G * QP;                      // [G][SP]: scores, then probabilities
  float* ksc_s = s_s + G * SP;                    // [ST][CHUNK]
  float* vsc_s = ksc_s + ST * CHUNK;              // [ST][CHUNK]
  float* nb = vsc_s + ST * CHUNK;                 // [2][D]: the row's new K and V heads
  const int* tab = tables + (i64)row * tw;

  auto slots = [&](int c, int s) {
    const int k0 = c * CHUNK, nk = min(CHUNK, L - k0);
    if (tid < nk) slot_s[s][tid] = slot_of(tab, k0 + tid, pt);
  };
  // A chunk's 8-element pieces: thread tid takes piece w4 of keys j0, j0 + kpi, ... (kpi keys a pass
  // of 256 threads; threads past kpi * D/8 take none), so a pass costs no division. bf16 by cp.async
  // into stage s; fp8 into registers all at once (land() decodes them). Keys past nk: zeros (their
  // scores are masked).
  constexpr int FP = CHUNK * 32 / 256;
  const int d8 = D / 8, kpi = 256 / d8, j0 = tid / d8, w4 = tid - j0 * d8;
  const bool piece = j0 < kpi;
  const i64 srow = (i64)KH * (KV8 ? D / 4 : D / 2);  // words of one cache slot (every kv head)
  const int soff = kh * (KV8 ? D / 4 : D / 2) + (KV8 ? 2 : 4) * w4;  // this thread's words in a slot
  uint2 kw[KV8 ? FP : 1], vw[KV8 ? FP : 1];
  float kscr = 0.0f, vscr = 0.0f;  // fp8 scales of key tid: stored when the chunk lands, not before the barrier
  auto piece_at = [&](int s) { return tiles + s * 2 * CHUNK * PW + j0 * PW + 4 * w4; };  // stage s's K piece
  auto issue = [&](int c, int s) {
    const int nk = min(CHUNK, L - c * CHUNK);
    u32* kd = piece_at(s);
#pragma unroll
    for (int i = 0; i < FP; ++i) {
      const int j = j0 + i * kpi;
      if (!piece || j >= CHUNK) break;
      u32* vd = kd + CHUNK * PW;
      if (j >= nk) {
        *(uint4*)kd = make_uint4(0, 0, 0, 0);
        *(uint4*)vd = make_uint4(0, 0, 0, 0);
      } else if (KV8) {
        const i64 off = slot_s[s][j] * srow + soff;
        kw[i] = *(const uint2*)((const u32*)kc + off);
        vw[i] = *(const uint2*)((const u32*)vc + off);
      } else {
        const i64 off = slot_s[s][j] * srow + soff;
        cp_async16(smem_addr(kd), (const u32*)kc + off);
        cp_async16(smem_addr(vd), (const u32*)vc + off);
      }
      kd += kpi * PW;
    }
    if (KV8 && tid < CHUNK) {  // zero past nk: their p are 0, and 0 times stale shared bits may be NaN
      kscr = tid < nk ? ksc[slot_s[s][tid] * KH + kh] : 0.0f;
      vscr = tid < nk ? vsc[slot_s[s][tid] * KH + kh] : 0.0f;
    }
    if (!KV8) cp_async_commit();
  };
  auto land = [&](int c, int s) {
    const int nk = min(CHUNK, L - c * CHUNK);
    u32* kd = piece_at(s);
#pragma unroll
    for (int i = 0; i < FP; ++i) {
      const int j = j0 + i * kpi;
      if (!piece || j >= CHUNK) break;
      if (j < nk) {
        *(uint4*)kd = fp8_piece(kw[i]);
        *(uint4*)(kd + CHUNK * PW) = fp8_piece(vw[i]);
      }
      kd += kpi * PW;
    }
    if (tid < CHUNK) {
      ksc_s[s * CHUNK + tid] = kscr;
      vsc_s[s * CHUNK + tid] = vscr;
    }
  };

  slots(first, 0);
  __syncthreads();
  issue(first, 0);
  if (early) PDL_ENTRY;  // q and the new K/V come from the kernel before
  if (KV8) land(first, 0);  // before q's loads: the pieces' registers are free again
  const float2* rot = rope_row(cs, row, half);
  for (int g = warp; g < G; g += 8)
    load_head(q_s + g * QP, q, (i64)row * qs0 + (i64)(kh * G + g) * qs1, D, qnw, qeps, rot, half, lane);
  const bool writes = kn != nullptr && last == nvalid;  // this block holds the row's own position
  if (writes && warp == 0) load_head(nb, kn, (i64)row * ks0 + (i64)kh * ks1, D, knw, keps, rot, half, lane);
  if (writes && warp == 1) load_head(nb + D, vn, (i64)row * vs0 + (i64)kh * vs1, D, nullptr, 0.0f, nullptr, 0, lane);
  const int PD = D + 2, MT = D / 16;

  for (int c = first; c < last; ++c) {
    const int s = ST == 2 ? (c - first) & 1 : 0;
    const bool next = c + 1 < last;
    const int k0 = c * CHUNK, nk = min(CHUNK, L - k0);
    const u32* kt = tiles + s * 2 * CHUNK * PW;
    const u32* vt = kt + CHUNK * PW;
    if (KV8 && c > first) land(c, s);
    if (ST == 2 && next) slots(c + 1, s ^ 1);
    __syncthreads();  // the next chunk's slots are seen; the other stage's readers are done
    if (ST == 2 && next) issue(c + 1, s ^ 1);
    if (!KV8) {
      if (ST == 2 && next) cp_async_wait<1>();
      else cp_async_wait<0>();
    }
    __syncthreads();
    if (writes && c == nvalid - 1) {  // the tile holds the old bits at pos: overwrite them with the new ones
      if (warp < 2) {
        const int j = pos - k0;
        const i64 base = (slot_s[s][j] * KH + kh) * D;
        if (warp == 0)
          encode_head<KV8>(nb, D, KV8 ? (void*)((u8*)kc + base) : (void*)((u16*)kc + base), (u16*)(kt + j * PW),
                           ksc + slot_s[s][j] * KH + kh, ksc_s + s * CHUNK + j, lane);
        else
          encode_head<KV8>(nb + D, D, KV8 ? (void*)((u8*)vc + base) : (void*)((u16*)vc + base),
                           (u16*)(vt + j * PW), vsc + slot_s[s][j] * KH + kh, vsc_s + s * CHUNK + j, lane);
      }
      __syncthreads();
    }

    // --- scores on tensor cores: warp (16 keys, 8 heads), q in three bf16 parts (24 bits: fp32's
    // products), the parts' sums added in one order ---
    if (warp < 4 * NT) {
      const int mt = warp & 3, nt = warp >> 2, hh = 8 * nt + g8;
      float a[3][4] = {};
      const u32* k0p = kt + (16 * mt + g8) * PW + t4;
      const u32* k1p = k0p + 8 * PW;
      const float* qp = q_s + min(hh, G - 1) * QP + 2 * t4;
      for (int ks = 0; ks < D / 16; ++ks) {
        u32 b[3][2];
        split3(hh < G ? *(const float2*)(qp + 16 * ks) : make_float2(0.0f, 0.0f), b[0][0], b[1][0], b[2][0]);
        split3(hh < G ? *(const float2*)(qp + 16 * ks + 8) : make_float2(0.0f, 0.0f), b[0][1], b[1][1], b[2][1]);
        const u32 a0 = k0p[8 * ks], a1 = k1p[8 * ks], a2 = k0p[8 * ks + 4], a3 = k1p[8 * ks + 4];
#pragma unroll
        for (int p = 0; p < 3; ++p) mma_bf16(a[p], a0, a1, a2, a3, b[p][0], b[p][1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = 16 * mt + g8 + 8 * (e >> 1), h = 8 * nt + 2 * t4 + (e & 1);
        const float v = __fadd_rn(__fadd_rn(a[0][e], a[1][e]), a[2][e]);
        if (h < G)
          s_s[h * SP + j] = j < nk ? (KV8 ? v * ksc_s[s * CHUNK + j] : v) * scale : -__int_as_float(0x7f800000);
      }
    }
    __syncthreads();
    // --- softmax statistics of the chunk, one warp per head ---
    for (int g = warp; g < G; g += 8) {
      float m = -__int_as_float(0x7f800000);
      for (int j = lane; j < nk; j += 32) m = fmaxf(m, s_s[g * SP + j]);
      m = warp_max(m);
      float l = 0.0f;
      for (int j = lane; j < CHUNK; j += 32) {
        const float p = j < nk ? expf(s_s[g * SP + j] - m) : 0.0f;
        s_s[g * SP + j] = p;
        l += p;
      }
      l = warp_sum(l);
      if (lane == 0) { m_s[g] = m; l_s[g] = l; }
    }
    __syncthreads();
    // --- weighted values on tensor cores: warp task (16 dims, 8 heads) over the chunk's keys, V^T by
    // ldmatrix.trans, p (times the fp8 scales) in three bf16 parts ---
    for (int task = warp; task < MT * NT; task += 8) {
      const int mt = task % MT, nt = task / MT, hh = 8 * nt + g8;
      float a[3][4] = {};
      const float* pp = s_s + min(hh, G - 1) * SP + 2 * t4;
      const u32* vrow = vt + (((lane >> 4) << 3) + (lane & 7)) * PW + 8 * mt + ((lane >> 3) & 1) * 4;
#pragma unroll
      for (int ks = 0; ks < CHUNK / 16; ++ks) {
        u32 av[4], b[3][2];
        ldsm4t(av, vrow + 16 * ks * PW);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int j = 16 * ks + 8 * hf + 2 * t4;
          float2 p = hh < G ? *(const float2*)(pp + 16 * ks + 8 * hf) : make_float2(0.0f, 0.0f);
          if (KV8) p = make_float2(p.x * vsc_s[s * CHUNK + j], p.y * vsc_s[s * CHUNK + j + 1]);
          split3(p, b[0][hf], b[1][hf], b[2][hf]);
        }
#pragma unroll
        for (int p = 0; p < 3; ++p) mma_bf16(a[p], av[0], av[1], av[2], av[3], b[p][0], b[p][1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * mt + g8 + 8 * (e >> 1), h = 8 * nt + 2 * t4 + (e & 1);
        if (h >= G) continue;
        const float o = __fadd_rn(__fadd_rn(a[0][e], a[1][e]), a[2][e]);
        const i64 hrow = (i64)row * H + kh * G + h;
        if (nvalid == 1) out[hrow * D + d] = o / l_s[h];
        else part[(hrow * nch + c) * PD + d] = o;
      }
    }
    if (nvalid > 1 && tid < G) {
      float* pr = part + (((i64)row * H + kh * G + tid) * nch + c) * PD;
      pr[D] = m_s[tid];
      pr[D + 1] = l_s[tid];
    }
  }
  if (nvalid == 1) return;
  // --- merge: chunks of a group in order, then groups in order (a block's chunks share a group) ---
  const int ng = (nvalid + GROUP - 1) / GROUP, grp = first / GROUP;
  const int gcnt = min(GROUP, nvalid - grp * GROUP), done = last - first;
  const int gmax = (nch + GROUP - 1) / GROUP;
  int* cnt = counters + ((i64)row * KH + kh) * (gmax + 1);
  if (!arrive_last(cnt + 1 + grp, done, gcnt - done, &flag_s)) return;
  for (int g = warp; g < G; g += 8) {
    const i64 hrow = (i64)row * H + kh * G + g;
    merge_partials(part + (hrow * nch + grp * GROUP) * PD, gcnt, PD, D, gpart + (hrow * gmax + grp) * PD,
                   ng == 1 ? out + hrow * D : nullptr, lane);
  }
  if (tid == 0) cnt[1 + grp] = 0;
  if (ng == 1) return;
  if (!arrive_last(cnt, 1, ng - 1, &flag_s)) return;
  for (int g = warp; g < G; g += 8) {
    const i64 hrow = (i64)row * H + kh * G + g;
    merge_partials(gpart + hrow * gmax * PD, ng, PD, D, nullptr, out + hrow * D, lane);
  }
  if (tid == 0) cnt[0] = 0;
}
