// The chunked (WY / UT-transform) form of the Gated DeltaNet delta rule over one lane's prompt rows:
// what deltanet.cu's deltanet_scan computes token by token, as products of 64-row chunks. Numpy twin:
// NumpyBackend.deltanet_prompt (its docstring is the specification). fp32 on CUDA cores, fixed
// summation orders, no atomics: the bits are a function of the inputs and T alone, and the rows of a
// chunk do not depend on the rows after it (padding rows are zeros), so a prompt cut at a multiple of
// 64 gives the bits of one call.
//
// Three launches (kernels/launch_qwen3_5.py deltanet_chunked):
//   dn_chunk_norm   q̂ = l2norm(q)·qscale, k̂ = l2norm(k) per row and key head, to scratch;
//   dn_chunk_prep   every (chunk, value head) at once: γ = cumsum(g), L = strictly-lower(diag(β)K̂K̂ᵀ ⊙ Γ),
//                   T = (I+L)⁻¹ by forward substitution, U = T·diag(β)V, W = T·diag(βe^γ)K̂ and
//                   P = Q̂K̂ᵀ ⊙ Γ (causal), to scratch;
//   dn_chunk_state  per (value head, 32 columns of the state) the chunks in order:
//                   V′ = U − W·S, O = diag(e^γ)Q̂·S + P·V′, S ← e^{γ_C}S + (diag(e^{γ_C−γ})K̂)ᵀV′.
// Scratch per chunk and value head (chunk-major, `base` = chunk·Hv + h): W [64, DK], U [64, Dv],
// P [64, 64], γ [64]; q̂, k̂ [T, Hk, DK].
#include "common.cuh"

constexpr int DN_C = 64;     // rows per chunk: kernels/launch_qwen3_5.py's DN_CHUNK (the model's DELTANET_CHUNK)
constexpr int DN_COLS = 32;  // state columns per dn_chunk_state block; U/W column tiles in dn_chunk_prep

// Reduction tiles over DK: 32 columns, or all of a smaller head.
template <int DK>
struct DnTile {
  static constexpr int KT = DK < 32 ? DK : 32;
};

// q̂, k̂ of each (row, key head): one warp each, lane-strided sums then warp_sum, as deltanet_scan.
// q, k [T, Hk, DK] (row strides ldq, ldk); qn, kn [T, Hk, DK] contiguous. grid = ceil(T·Hk/8), block = 256.
template <int DK>
__global__ void __launch_bounds__(256)
    dn_chunk_norm(const float* __restrict__ q, i64 ldq, const float* __restrict__ k, i64 ldk,
                  float* __restrict__ qn, float* __restrict__ kn, int T, int Hk, float qscale) {
  PDL_ENTRY;
  const i64 e = (i64)blockIdx.x * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (e >= (i64)T * Hk) return;
  const i64 t = e / Hk;
  const int kh = (int)(e - t * Hk);
  const float* qr = q + t * ldq + (i64)kh * DK;
  const float* kr = k + t * ldk + (i64)kh * DK;
  float sq = 0.0f, sk = 0.0f;
  for (int d = lane; d < DK; d += 32) {
    sq = __fadd_rn(sq, __fmul_rn(qr[d], qr[d]));
    sk = __fadd_rn(sk, __fmul_rn(kr[d], kr[d]));
  }
  float rq, rk;
  qk_norm_factors(sq, sk, qscale, rq, rk);
  for (int d = lane; d < DK; d += 32) {
    qn[e * DK + d] = __fmul_rn(qr[d], rq);
    kn[e * DK + d] = __fmul_rn(kr[d], rk);
  }
}

// The chunk's γ = cumsum(g) and β at head h into gs, bs (rows past T: g = β = 0, numpy's zero padding).
DEV void dn_gates_cumsum(const float* __restrict__ g, const float* __restrict__ beta, i64 row0, int T, int h, int Hv,
                         float* gs, float* bs) {
  if (threadIdx.x < DN_C) {
    const i64 r = row0 + threadIdx.x;
    gs[threadIdx.x] = r < T ? g[r * Hv + h] : 0.0f;
    bs[threadIdx.x] = r < T ? beta[r * Hv + h] : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // the cumulative sum in row order, like np.cumsum
    float acc = 0.0f;
    for (int m = 0; m < DN_C; ++m) gs[m] = acc = __fadd_rn(acc, gs[m]);
  }
  __syncthreads();
}

// A [64, 64] (row stride 68) times a column tile X [64, 32] (row stride 32): rows w + 8a of the
// product at column `lane`, each from x0[a] (the identity's term) plus Σ_m A[i][m]·X[m] in m order.
DEV void dn_rows_times(const float* A, const float* X, int w, int lane, float* acc) {
#pragma unroll
  for (int a = 0; a < 8; ++a) acc[a] = X[(w + 8 * a) * DN_COLS + lane];
  for (int m = 0; m < DN_C; m += 4) {
    const float x0 = X[m * DN_COLS + lane], x1 = X[(m + 1) * DN_COLS + lane];
    const float x2 = X[(m + 2) * DN_COLS + lane], x3 = X[(m + 3) * DN_COLS + lane];
#pragma unroll
    for (int a = 0; a < 8; ++a) {
      const float4 t = *reinterpret_cast<const float4*>(A + (w + 8 * a) * 68 + m);
      acc[a] = __fmaf_rn(t.x, x0, acc[a]);
      acc[a] = __fmaf_rn(t.y, x1, acc[a]);
      acc[a] = __fmaf_rn(t.z, x2, acc[a]);
      acc[a] = __fmaf_rn(t.w, x3, acc[a]);
    }
  }
}

// T − I for T = (I − L′)⁻¹, L′ = −L strictly lower (Ls, row stride 65), into As (row stride 68, zeroed),
// in blocks of 16 rows: (T−I)[i][j] = L′[i][j] + Σ_{j<m<i} L′[i][m]·(T−I)[m][j] is numpy's recurrence;
// here the diagonal blocks T_II run it in parallel (warp I, two lanes a column, no block barrier),
// then block row I at a time T_IJ = T_II·X_IJ with X_IJ = Σ_{J≤K<I} L′_IK T_KJ: 10 barriers, not 63.
DEV void dn_invert(const float* Ls, float* As, int tid) {
  const int w = tid >> 5, lane = tid & 31;
  if (w < 4) {
    const int o = 16 * w, j = lane & 15, part = lane >> 4;
    for (int i = 1; i < 16; ++i) {
      float s = 0.0f;
      if (j < i)
        for (int m = j + 1 + part; m < i; m += 2) s = __fmaf_rn(Ls[(o + i) * 65 + o + m], As[(o + m) * 68 + o + j], s);
      s = __fadd_rn(s, __shfl_xor_sync(FULL_MASK, s, 16));
      if (j < i && part == 0) As[(o + i) * 68 + o + j] = __fadd_rn(Ls[(o + i) * 65 + o + j], s);
      __syncwarp();
    }
  }
  __syncthreads();
  for (int I = 1; I < 4; ++I) {
    const int n0 = 16 * I, cells = 16 * n0;  // block row I left of its diagonal block: [16, n0]
    float x[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) {  // X = L′ + Σ_{n<m<n0} L′[i][m]·(T−I)[m][n]: the rows above block row I only
      const int e = tid + 256 * c, i = n0 + e / n0, n = e % n0;
      if (e >= cells) continue;
      float s = Ls[i * 65 + n];
      for (int m = n + 1; m < n0; ++m) s = __fmaf_rn(Ls[i * 65 + m], As[m * 68 + n], s);
      x[c] = s;
      As[i * 68 + n] = s;  // nobody reads block row I's left part before the barrier
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < 3; ++c) {  // T_IJ = X + (T_II − I)·X
      const int e = tid + 256 * c, i = n0 + e / n0, n = e % n0;
      if (e >= cells) continue;
      for (int p = n0; p < i; ++p) x[c] = __fmaf_rn(As[i * 68 + p], As[p * 68 + n], x[c]);
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      const int e = tid + 256 * c, i = n0 + e / n0, n = e % n0;
      if (e < cells) As[i * 68 + n] = x[c];
    }
    __syncthreads();
  }
}

// One (chunk, value head) of the prompt: γ, P, then T = (I+L)⁻¹, U and W (see the file's comment).
// qn, kn [T, Hk, DK] (dn_chunk_norm's), v [T, Hv, Dv] (row stride ldv), g, beta [T, Hv] contiguous;
// Wm, Um, Pm, gm the scratch. grid = (chunks, Hv), block = 256: 8 warps, warp w owning rows w + 8a.
template <int DK>
__global__ void __launch_bounds__(256)
    dn_chunk_prep(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ v, i64 ldv,
                  const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ Wm,
                  float* __restrict__ Um, float* __restrict__ Pm, float* __restrict__ gm, int T, int Hk, int Hv,
                  int Dv) {
  PDL_ENTRY;
  constexpr int KT = DnTile<DK>::KT, KP = KT + 1;  // odd row stride: the column reads K̂[j][d] hit distinct banks
  constexpr int REGION = 2 * DN_C * KP > DN_C * 65 ? 2 * DN_C * KP : DN_C * 65;
  __shared__ float gs[DN_C], bs[DN_C];
  __shared__ __align__(16) float As[DN_C * 68];     // T − I (strictly lower), row stride 68 for float4 rows
  __shared__ __align__(16) float region[REGION];    // K̂/Q̂ tiles, then L, then the U/W column tiles
  const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int kh = h / (Hv / Hk);
  const i64 row0 = (i64)c * DN_C, base = (i64)c * Hv + h;
  dn_gates_cumsum(g, beta, row0, T, h, Hv, gs, bs);
  if (tid < DN_C) gm[base * DN_C + tid] = gs[tid];

  // K̂K̂ᵀ and Q̂K̂ᵀ: thread (ti, tj) = (tid / 16, tid % 16) holds rows ti + 16a, columns tj + 16b.
  float* Ks = region;
  float* Qs = region + DN_C * KP;
  const int ti = tid >> 4, tj = tid & 15;
  float kk[4][4], qk[4][4];
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) kk[a][b] = qk[a][b] = 0.0f;
  for (int d0 = 0; d0 < DK; d0 += KT) {
    for (int x = tid; x < DN_C * KT; x += 256) {
      const int r = x / KT, d = x - r * KT;
      const bool in = row0 + r < T;
      const i64 at = ((row0 + r) * Hk + kh) * DK + d0 + d;
      Ks[r * KP + d] = in ? kn[at] : 0.0f;
      Qs[r * KP + d] = in ? qn[at] : 0.0f;
    }
    __syncthreads();
#pragma unroll 4
    for (int d = 0; d < KT; ++d) {
      float ki[4], qi[4], kj[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) {
        ki[a] = Ks[(ti + 16 * a) * KP + d];
        qi[a] = Qs[(ti + 16 * a) * KP + d];
        kj[a] = Ks[(tj + 16 * a) * KP + d];
      }
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          kk[a][b] = __fmaf_rn(ki[a], kj[b], kk[a][b]);
          qk[a][b] = __fmaf_rn(qi[a], kj[b], qk[a][b]);
        }
    }
    __syncthreads();  // the next tile (or L) overwrites the staged rows
  }
  // L's negation into the region (the forward substitution reads it), P to scratch, T − I starts at 0.
  float* Ls = region;  // row stride 65
  for (int x = tid; x < DN_C * 68; x += 256) As[x] = 0.0f;
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int i = ti + 16 * a, j = tj + 16 * b;
      const float gam = i >= j ? expf(__fsub_rn(gs[i], gs[j])) : 0.0f;
      Ls[i * 65 + j] = i > j ? -__fmul_rn(__fmul_rn(bs[i], kk[a][b]), gam) : 0.0f;
      Pm[(base * DN_C + i) * DN_C + j] = __fmul_rn(qk[a][b], gam);
    }
  __syncthreads();
  dn_invert(Ls, As, tid);
  // U = T·diag(β)V and W = T·diag(βe^γ)K̂, a tile of 32 columns at a time.
  float* X = region;  // [64, 32]
  float acc[8];
  for (int c0 = 0; c0 < Dv; c0 += DN_COLS) {
    for (int x = tid; x < DN_C * DN_COLS; x += 256) {
      const int r = x / DN_COLS, cc = c0 + x % DN_COLS;
      X[x] = row0 + r < T && cc < Dv ? __fmul_rn(bs[r], v[(row0 + r) * ldv + (i64)h * Dv + cc]) : 0.0f;
    }
    __syncthreads();
    dn_rows_times(As, X, w, lane, acc);
    if (c0 + lane < Dv)
#pragma unroll
      for (int a = 0; a < 8; ++a) Um[(base * DN_C + w + 8 * a) * Dv + c0 + lane] = acc[a];
    __syncthreads();
  }
  for (int c0 = 0; c0 < DK; c0 += DN_COLS) {
    for (int x = tid; x < DN_C * DN_COLS; x += 256) {
      const int r = x / DN_COLS, cc = c0 + x % DN_COLS;
      X[x] = row0 + r < T && cc < DK
                 ? __fmul_rn(__fmul_rn(bs[r], kn[((row0 + r) * Hk + kh) * DK + cc]), expf(gs[r]))
                 : 0.0f;
    }
    __syncthreads();
    dn_rows_times(As, X, w, lane, acc);
    if (c0 + lane < DK)
#pragma unroll
      for (int a = 0; a < 8; ++a) Wm[(base * DN_C + w + 8 * a) * DK + c0 + lane] = acc[a];
    __syncthreads();
  }
}

// acc[a] += Σ_d B[w + 8a][d]·S[d][lane] over a staged tile B [64, n] (row stride 32, n a multiple of 4)
// and S rows [n, 32]: the broadcast rows read as float4.
DEV void dn_tile_times(const float* B, const float* S, int n, int w, int lane, float* acc) {
  for (int d = 0; d < n; d += 4) {
    const float s0 = S[d * DN_COLS + lane], s1 = S[(d + 1) * DN_COLS + lane];
    const float s2 = S[(d + 2) * DN_COLS + lane], s3 = S[(d + 3) * DN_COLS + lane];
#pragma unroll
    for (int a = 0; a < 8; ++a) {
      const float4 t = *reinterpret_cast<const float4*>(B + (w + 8 * a) * DN_COLS + d);
      acc[a] = __fmaf_rn(t.x, s0, acc[a]);
      acc[a] = __fmaf_rn(t.y, s1, acc[a]);
      acc[a] = __fmaf_rn(t.z, s2, acc[a]);
      acc[a] = __fmaf_rn(t.w, s3, acc[a]);
    }
  }
}

// N adjacent floats of shared memory (N-aligned) in one load: a broadcast row of a tile.
template <int N>
DEV void dn_row_load(const float* p, float* k) {
  if constexpr (N == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    k[0] = t.x, k[1] = t.y, k[2] = t.z, k[3] = t.w;
  } else if constexpr (N == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    k[0] = t.x, k[1] = t.y;
  } else {
    k[0] = p[0];
  }
}

// The tiles dn_chunk_state reads, in order, per chunk: W's DK/KT column tiles (phase 1), diag(e^γ)Q̂'s
// (phase 2), P's two (phase 2), diag(e^{γ_C−γ})K̂'s (phase 3); each [64 rows, KT or 32 columns].
// A thread prefetches its ≤ 2 float4 of the next tile into registers while the block computes on
// the current one, then stores them (scaled, for Q̂ and K̂) into the other buffer.
template <int DK>
struct DnStream {
  static constexpr int KT = DnTile<DK>::KT, ND = DK / KT, NT = 3 * ND + 2;
  float4 x[2];
  float gr[2], glast;
  int kind, width;

  DEV void load(int n, int tid, const float* __restrict__ qn, const float* __restrict__ kn,
                const float* __restrict__ Wm, const float* __restrict__ Pm, const float* __restrict__ gm, int T,
                int Hk, int kh, int Hv, int h) {
    const int c = n / NT, t = n - c * NT;
    const i64 row0 = (i64)c * DN_C, base = (i64)c * Hv + h;
    const float* src;
    i64 ld;
    kind = t < ND ? 0 : t < 2 * ND ? 1 : t < 2 * ND + 2 ? 2 : 3;
    if (kind == 0) {
      src = Wm + base * DN_C * DK + t * KT, ld = DK;
    } else if (kind == 2) {
      src = Pm + base * DN_C * DN_C + (t - 2 * ND) * 32, ld = DN_C;
    } else {
      const int d0 = (kind == 1 ? t - ND : t - 2 * ND - 2) * KT;
      src = (kind == 1 ? qn : kn) + (row0 * Hk + kh) * DK + d0, ld = (i64)Hk * DK;
    }
    width = kind == 2 ? 32 : KT;
    const int per = width / 4;  // float4 a row
    glast = gm[base * DN_C + DN_C - 1];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int e = tid + 256 * i, r = e / per;
      const bool in = e < 16 * width && (kind == 0 || kind == 2 || row0 + r < T);
      x[i] = in ? *reinterpret_cast<const float4*>(src + r * ld + 4 * (e - r * per)) : make_float4(0, 0, 0, 0);
      gr[i] = in && (kind & 1) ? gm[base * DN_C + r] : 0.0f;  // the row's γ, for the Q̂ and K̂ tiles
    }
  }

  DEV void store(float* B, int tid) const {
    const int per = width / 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int e = tid + 256 * i, r = e / per;
      if (e >= 16 * width) continue;
      float4 v = x[i];
      if (kind == 1 || kind == 3) {  // Q̂·e^γ and K̂·e^{γ_C−γ} rows, numpy's products
        const float f = expf(kind == 1 ? gr[i] : __fsub_rn(glast, gr[i]));
        v = make_float4(__fmul_rn(v.x, f), __fmul_rn(v.y, f), __fmul_rn(v.z, f), __fmul_rn(v.w, f));
      }
      *reinterpret_cast<float4*>(B + r * DN_COLS + 4 * (e - r * per)) = v;
    }
  }
};

// The chunks of one lane in order at one value head and 32 columns of its state [DK, Dv] (slot
// `slot` of state [slots, Hv, DK, Dv]: the initial state, and the final one goes back there).
// out [T, Hv, Dv]. grid = (Hv, ceil(Dv/32)), block = 256: thread (w, lane) owns column lane and
// rows w + 8a of each chunk; S [DK, 32] and V′ [64, 32] stay in shared memory, the tiles of
// DnStream stream through two buffers with one barrier each.
template <int DK>
__global__ void __launch_bounds__(256)
    dn_chunk_state(const float* __restrict__ qn, const float* __restrict__ kn, const float* __restrict__ Wm,
                   const float* __restrict__ Um, const float* __restrict__ Pm, const float* __restrict__ gm,
                   float* __restrict__ state, int slot, float* __restrict__ out, int T, int Hk, int Hv, int Dv) {
  PDL_ENTRY;
  using Stream = DnStream<DK>;
  constexpr int KT = Stream::KT, ND = Stream::ND, NT = Stream::NT, DPT = KT / 8;  // phase 3: DPT rows a thread
  __shared__ __align__(16) float Ss[DK * DN_COLS];
  __shared__ __align__(16) float Vp[DN_C * DN_COLS];
  __shared__ __align__(16) float Bs[2][DN_C * DN_COLS];
  const int h = blockIdx.x, tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const int j = blockIdx.y * DN_COLS + lane, kh = h / (Hv / Hk);
  const bool on = j < Dv;
  float* S = state + ((i64)slot * Hv + h) * DK * Dv;
  for (int x = tid; x < DK * DN_COLS; x += 256) {
    const int d = x / DN_COLS, jj = blockIdx.y * DN_COLS + x % DN_COLS;
    Ss[x] = jj < Dv ? S[(i64)d * Dv + jj] : 0.0f;
  }
  Stream st;
  st.load(0, tid, qn, kn, Wm, Pm, gm, T, Hk, kh, Hv, h);
  st.store(Bs[0], tid);
  __syncthreads();
  const int total = (T + DN_C - 1) / DN_C * NT;
  float ws[8], acc[8], u[8];
  for (int n = 0; n < total; ++n) {
    const int c = n / NT, t = n - c * NT;
    const i64 row0 = (i64)c * DN_C, base = (i64)c * Hv + h;
    if (n + 1 < total) st.load(n + 1, tid, qn, kn, Wm, Pm, gm, T, Hk, kh, Hv, h);
    const float* B = Bs[n & 1];
    if (t == 0) {
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        ws[a] = acc[a] = 0.0f;
        u[a] = on ? Um[(base * DN_C + w + 8 * a) * Dv + j] : 0.0f;
      }
    }
    if (t < ND) {  // V′ = U − W·S
      dn_tile_times(B, Ss + t * KT * DN_COLS, KT, w, lane, ws);
      if (t == ND - 1)
#pragma unroll
        for (int a = 0; a < 8; ++a) Vp[(w + 8 * a) * DN_COLS + lane] = __fsub_rn(u[a], ws[a]);
    } else if (t < 2 * ND) {  // O = diag(e^γ)Q̂·S + P·V′
      dn_tile_times(B, Ss + (t - ND) * KT * DN_COLS, KT, w, lane, acc);
    } else if (t < 2 * ND + 2) {
      dn_tile_times(B, Vp + (t - 2 * ND) * 32 * DN_COLS, 32, w, lane, acc);
      if (t == 2 * ND + 1)
#pragma unroll
        for (int a = 0; a < 8; ++a)
          if (on && row0 + w + 8 * a < T) out[((row0 + w + 8 * a) * Hv + h) * Dv + j] = acc[a];
    } else {  // S ← e^{γ_C}S + (diag(e^{γ_C−γ})K̂)ᵀV′ at rows d0 + DPT·w + e
      const int d0 = (t - 2 * ND - 2) * KT;
      const float dec = expf(gm[base * DN_C + DN_C - 1]);
      float s[DPT];
#pragma unroll
      for (int e = 0; e < DPT; ++e) s[e] = 0.0f;
      for (int r = 0; r < DN_C; ++r) {
        const float x = Vp[r * DN_COLS + lane];
        float k[DPT];
        dn_row_load<DPT>(B + r * DN_COLS + DPT * w, k);
#pragma unroll
        for (int e = 0; e < DPT; ++e) s[e] = __fmaf_rn(k[e], x, s[e]);
      }
#pragma unroll
      for (int e = 0; e < DPT; ++e) {
        float* at = Ss + (d0 + DPT * w + e) * DN_COLS + lane;
        *at = __fadd_rn(__fmul_rn(dec, *at), s[e]);
      }
    }
    if (n + 1 < total) st.store(Bs[(n + 1) & 1], tid);
    __syncthreads();
  }
  for (int x = tid; x < DK * DN_COLS; x += 256) {
    const int d = x / DN_COLS, jj = blockIdx.y * DN_COLS + x % DN_COLS;
    if (jj < Dv) S[(i64)d * Dv + jj] = Ss[x];
  }
}
