// Causal attention of prompt chunks on tensor cores, over the cache of attention.cu (same layout:
// K, V [pages, page_tokens, KH, D] as bf16 words or fp8 bytes with per-(token, head) scales), keys
// split at absolute multiples of a fixed split size and merged per row in split order.
#include "common.cuh"

// c0 += a b[0..1], c1 += a b[2..3] against two n-tiles of B, a = h (ONE) or h + l (two MMAs each).
template <int ONE>
DEV void mma_pair(float* c0, float* c1, const u32* h, const u32* l, const u32* b) {
  mma_bf16(c0, h[0], h[1], h[2], h[3], b[0], b[1]);
  if (!ONE) mma_bf16(c0, l[0], l[1], l[2], l[3], b[0], b[1]);
  mma_bf16(c1, h[0], h[1], h[2], h[3], b[2], b[3]);
  if (!ONE) mma_bf16(c1, l[0], l[1], l[2], l[3], b[2], b[3]);
}

// An A fragment's pair of values: one bf16 rounding (ONE) or bf16 hi + lo.
template <int ONE>
DEV void operand(float x0, float x1, u32& hi, u32& lo) {
  if (ONE) hi = pack_bf16x2(x0, x1);
  else split_bf16(x0, x1, hi, lo);
}

// Causal attention of a prompt chunk on tensor cores: n rows of one lane (its page table is the
// first row's), row r over keys 0..positions[r]. A block holds QR = 16 NW / G rows x G heads of one
// kv head (query vector i = r G + g; the rest of its 16 NW are copies of its first, never written),
// one warp per 16 of them, and walks key tiles of BK positions from 0 with an online softmax in
// base 2. K and V are exact in bf16 (fp8 ones too, with their per-key scales applied to the scores
// and to the probabilities); q * scale * log2(e) and the probabilities are split into bf16 hi + lo,
// near fp32 products (F16 0), or rounded once to bf16 like the cache's K and V (F16 1: the fp16
// prefill precision, one MMA a product). bf16 tiles come through a cp.async double buffer, the next
// tile in flight while this one is used; fp8 ones are widened as they are loaded. A query's result depends on its position and keys only:
// tiles past it add exact zeros, whatever else its block holds. Keys are split at absolute
// multiples of KS (blockIdx.z): each block leaves its split's (max, sum, unnormalised output) per
// query in part[row][head][split][D + 2], and attn_prompt_merge adds a row's splits in order.
// grid = (ceil(n / QR), KH, splits), block = 32 NW; DT = D padded to the kernel's width (zero dims).
template <int KV8, int DT, int BK, int NW, int F16>
__global__ void __launch_bounds__(32 * NW) attn_prompt(const float* __restrict__ q, i64 qs0, i64 qs1,
                                                       const float* __restrict__ qnw, float qeps,
                                                       const float2* __restrict__ cs, int half,
                                                       const int* __restrict__ positions,
                                                       const int* __restrict__ tables, int pt,
                                                       const void* __restrict__ kc, const void* __restrict__ vc,
                                                       const float* __restrict__ ksc, const float* __restrict__ vsc,
                                                       int KH, int G, int D, float scale, int n, int KS,
                                                       float* __restrict__ part) {
  PDL_ENTRY;
  constexpr int QV = 16 * NW, P = DT + 8, NS = BK / 8, NO = DT / 8;  // P: row pitch in bf16
  const float NEG = -__int_as_float(0x7f800000);
  constexpr int NB = KV8 ? 1 : 2;  // tile buffers: bf16 ones double-buffered through cp.async
  extern __shared__ __align__(16) u16 sq[];
  u16* qh = sq;                           // [QV][P] query (hi)
  u16* ql = qh + QV * P;                  // [QV][P] query lo (F16: none)
  u16* kts = ql + (F16 ? 0 : QV * P);     // [NB][BK][P] key tiles
  u16* vts = kts + NB * BK * P;           // [NB][BK][P] value tiles
  float* scr = (float*)(vts + NB * BK * P);  // [NW][DT] a query vector as load_head leaves it
  float* ks_s = scr + NW * DT;            // [BK] fp8 key scales of the tile
  float* vs_s = ks_s + BK;                // [BK] fp8 value scales
  __shared__ int pos_s[QV];
  __shared__ int maxpos_s;
  const int kh = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int QR = QV / G, rbase = blockIdx.x * QR, H = KH * G;
  const float c = scale * 1.4426950408889634f;

  for (int i = warp; i < QV; i += NW) {
    const bool real = i < QR * G;
    const int hg = real ? i % G : 0, row = min(rbase + (real ? i / G : 0), n - 1);
    float* d = scr + warp * DT;
    load_head(d, q, (i64)row * qs0 + (i64)(kh * G + hg) * qs1, D, qnw, qeps, rope_row(cs, row, half), half, lane);
    for (int e = 2 * lane; e < DT; e += 64) {
      u32 hi, lo;
      operand<F16>(e < D ? d[e] * c : 0.0f, e + 1 < D ? d[e + 1] * c : 0.0f, hi, lo);
      *(u32*)(qh + i * P + e) = hi;
      if (!F16) *(u32*)(ql + i * P + e) = lo;
    }
    if (lane == 0) pos_s[i] = positions[row];
    __syncwarp();
  }
  for (int idx = tid; idx < NB * BK * (DT - D); idx += 32 * NW) {  // dims past D stay zero in every tile
    const int j = idx / (DT - D), e = D + idx % (DT - D);
    kts[j * P + e] = 0;
    vts[j * P + e] = 0;
  }
  __syncthreads();
  if (tid == 0) {
    int mp = 0;
    for (int i = 0; i < QV; ++i) mp = max(mp, pos_s[i]);
    maxpos_s = mp;
  }
  __syncthreads();
  const int maxpos = maxpos_s, pa = pos_s[warp * 16 + g], pb = pos_s[warp * 16 + g + 8];
  const int kbeg = blockIdx.z * KS, kend = min(kbeg + KS - 1, maxpos);
  if (kbeg > maxpos) return;  // no row of this block reaches the split: none reads its part
  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float ma = NEG, mb = NEG, la = 0.0f, lb = 0.0f;
  // this lane's ldmatrix rows: A (queries) row and column half, B (keys / values) row and half
  const int arow = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, acol = (lane >> 4) * 8;
  const int brow = (lane & 7) + (lane >> 4) * 8, bcol = ((lane >> 3) & 1) * 8;
  const int vrow = (lane & 7) + ((lane >> 3) & 1) * 8, vcol = (lane >> 4) * 8;
  // 16 stored bytes at a time: 8 bf16 elements, or 16 fp8 ones widened to bf16 (exactly: e4m3 is
  // bf16's upper half of the float); keys past maxpos are zeros
  constexpr int EL = KV8 ? 16 : 8;
  const int ch = D / EL;
  auto load_bf16 = [&](int buf, int k0) {  // the tile's pieces in flight (cp.async, zero-filled)
    for (int idx = tid; idx < BK * ch; idx += 32 * NW) {
      const int j = idx / ch, cc = idx % ch, p = k0 + j;
      const i64 e = p <= maxpos ? (slot_of(tables, p, pt) * KH + kh) * D + cc * 8 : 0;
      const int off = (buf * BK + j) * P + cc * 8, bytes = p <= maxpos ? 16 : 0;
      cp_async16z(smem_addr(kts + off), (const u16*)kc + e, bytes);
      cp_async16z(smem_addr(vts + off), (const u16*)vc + e, bytes);
    }
  };
  const int ntiles = (kend - kbeg) / BK + 1;
  if (!KV8) {
    load_bf16(0, kbeg);
    cp_async_commit();
  }

  for (int it = 0; it < ntiles; ++it) {
    const int k0 = kbeg + it * BK, buf = KV8 ? 0 : it & 1;
    const u16* kt = kts + buf * BK * P;
    const u16* vt = vts + buf * BK * P;
    if (!KV8) {
      if (it + 1 < ntiles) load_bf16(buf ^ 1, k0 + BK);  // its buffer was read in the last tile
      cp_async_commit();
      cp_async_wait<1>();  // this tile's pieces are here
    } else {
      __syncthreads();  // the previous tile is read
      for (int idx = tid; idx < BK * ch; idx += 32 * NW) {
        const int j = idx / ch, cc = idx % ch, p = k0 + j;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
        if (p <= maxpos) {
          const i64 e = (slot_of(tables, p, pt) * KH + kh) * D + cc * EL;
          kv = *(const uint4*)((const u8*)kc + e);
          vv = *(const uint4*)((const u8*)vc + e);
        }
        const uint4 src[2] = {kv, vv};
        u16* dst[2] = {kts + j * P + cc * EL, vts + j * P + cc * EL};
#pragma unroll
        for (int kvi = 0; kvi < 2; ++kvi) {
          const u32 w4[4] = {src[kvi].x, src[kvi].y, src[kvi].z, src[kvi].w};
          u32 b[8];
#pragma unroll
          for (int w = 0; w < 8; ++w) {
            const u32 two = w4[w >> 1] >> (16 * (w & 1));
            b[w] = (__float_as_uint(fp8_to_f32(two & 0xffu)) >> 16) |
                   (__float_as_uint(fp8_to_f32((two >> 8) & 0xffu)) & 0xffff0000u);
          }
          *(uint4*)dst[kvi] = make_uint4(b[0], b[1], b[2], b[3]);
          *(uint4*)(dst[kvi] + 8) = make_uint4(b[4], b[5], b[6], b[7]);
        }
      }
      for (int j = tid; j < BK; j += 32 * NW) {
        const int p = k0 + j;
        const i64 sl = p <= maxpos ? slot_of(tables, p, pt) * KH + kh : 0;
        ks_s[j] = p <= maxpos ? ksc[sl] : 0.0f;
        vs_s[j] = p <= maxpos ? vsc[sl] : 0.0f;
      }
    }
    __syncthreads();
    // scores: s[j] = rows (g, g + 8) x keys k0 + 8j + 2t, +1 of this warp's 16 queries
    float s[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DT / 16; ++kk) {
      u32 ah[4], al[4];
      ldsm4(ah, qh + arow * P + kk * 16 + acol);
      if (!F16) ldsm4(al, ql + arow * P + kk * 16 + acol);
#pragma unroll
      for (int jp = 0; jp < NS / 2; ++jp) {
        u32 b[4];
        ldsm4(b, kt + (jp * 16 + brow) * P + kk * 16 + bcol);
        mma_pair<F16>(s[2 * jp], s[2 * jp + 1], ah, al, b);
      }
    }
    float ta = NEG, tb = NEG;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int jj = 8 * j + 2 * t + e, p = k0 + jj;
        if (KV8) {
          s[j][e] *= ks_s[jj];
          s[j][2 + e] *= ks_s[jj];
        }
        if (p > pa) s[j][e] = NEG;
        if (p > pb) s[j][2 + e] = NEG;
        ta = fmaxf(ta, s[j][e]);
        tb = fmaxf(tb, s[j][2 + e]);
      }
    }
    ta = fmaxf(ta, __shfl_xor_sync(FULL_MASK, ta, 1));
    ta = fmaxf(ta, __shfl_xor_sync(FULL_MASK, ta, 2));
    tb = fmaxf(tb, __shfl_xor_sync(FULL_MASK, tb, 1));
    tb = fmaxf(tb, __shfl_xor_sync(FULL_MASK, tb, 2));
    const float na = fmaxf(ma, ta), nb = fmaxf(mb, tb);
    const float aa = exp2f(ma - na), ab = exp2f(mb - nb);
    float sa = 0.0f, sb = 0.0f;
#pragma unroll
    for (int j = 0; j < NS; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[j][e] = exp2f(s[j][e] - na);
        s[j][2 + e] = exp2f(s[j][2 + e] - nb);
        sa += s[j][e];
        sb += s[j][2 + e];
        if (KV8) {
          s[j][e] *= vs_s[8 * j + 2 * t + e];
          s[j][2 + e] *= vs_s[8 * j + 2 * t + e];
        }
      }
    }
    sa += __shfl_xor_sync(FULL_MASK, sa, 1);
    sa += __shfl_xor_sync(FULL_MASK, sa, 2);
    sb += __shfl_xor_sync(FULL_MASK, sb, 1);
    sb += __shfl_xor_sync(FULL_MASK, sb, 2);
    la = la * aa + sa;
    lb = lb * ab + sb;
    ma = na;
    mb = nb;
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      o[j][0] *= aa; o[j][1] *= aa;
      o[j][2] *= ab; o[j][3] *= ab;
    }
    // o += p v, the probabilities as A fragments straight from the score registers
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      u32 ph[4], pl[4];
      operand<F16>(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
      operand<F16>(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
      operand<F16>(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
      operand<F16>(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
      for (int dp = 0; dp < NO / 2; ++dp) {
        u32 b[4];
        ldsm4t(b, vt + (kk * 16 + vrow) * P + dp * 16 + vcol);
        mma_pair<F16>(o[2 * dp], o[2 * dp + 1], ph, pl, b);
      }
    }
    if (!KV8) __syncthreads();  // every warp is done with this buffer before the next tile's loads
  }
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int i = warp * 16 + g + 8 * h2, r = i / G;
    if (i >= QR * G || rbase + r >= n) continue;
    float* dst = part + (((i64)(rbase + r) * H + kh * G + i % G) * gridDim.z + blockIdx.z) * (D + 2);
    if (t == 0) *(float2*)dst = make_float2(h2 ? mb : ma, h2 ? lb : la);
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      const int d = 8 * j + 2 * t;
      if (d < D) *(float2*)(dst + 2 + d) = make_float2(o[j][2 * h2], o[j][2 * h2 + 1]);
    }
  }
}

// A prompt row's key splits, in order: out = sum_s o_s 2^(m_s - m) / sum_s l_s 2^(m_s - m) over the
// splits its position reaches. grid = (n, H), block = 256 (dims).
extern "C" __global__ void __launch_bounds__(256) attn_prompt_merge(const float* __restrict__ part,
                                                                    const int* __restrict__ positions, int S, int KS,
                                                                    int H, int D, float* __restrict__ out) {
  PDL_ENTRY;
  const int row = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const int ns = positions[row] / KS + 1;
  const float* p = part + ((i64)row * H + h) * S * (D + 2);
  float m = p[0];
  for (int s = 1; s < ns; ++s) m = fmaxf(m, p[s * (D + 2)]);
  float l = 0.0f, o = 0.0f;
  for (int s = 0; s < ns; ++s) {
    const float w = exp2f(p[s * (D + 2)] - m);
    l = fmaf(p[s * (D + 2) + 1], w, l);
    if (d < D) o = fmaf(p[s * (D + 2) + 2 + d], w, o);
  }
  if (d < D) out[((i64)row * H + h) * D + d] = o / l;
}
