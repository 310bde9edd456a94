// Affine-quantized matrix products: y[n, m] = sum_k x[n, k] * (s[m, k/G] * q[m, k] + b[m, k/G]).
//
// Weights are repacked once at load into a tile layout that feeds mma.sync directly:
//   codes[T][S][32 lanes][WPL words], T = 16-row tile, S = 32-input subgroup.
//   4-bit (WPL 2): lane (g = lane/4, t = lane%4) holds the word of inputs 8t..8t+7 of the
//     subgroup for rows 16T+g and 16T+g+8, nibbles permuted so that nibble i is input 2i and
//     nibble i+4 is input 2i+1 (one shift+and+or gives two bf16 codes).
//   8-bit (WPL 4): the same lane holds, per row, two words: inputs 8t+4st+j (st = 0, 1),
//     each byte split into nibbles (low at (j>>1)+4(j&1), high two positions above).
//   sb[T][NG][16 rows] = (scale, bias) pairs in the source dtype.
//
// The product runs on tensor cores: codes as bf16 (128+q, exact), x split into bf16 hi + lo
// (16 bits of mantissa), fp32 accumulation per group, then y += s*C + (b - 128 s) * sum(hi + lo):
// the offset's sum is over exactly what the MMA multiplied, so only q * (hi + lo) remains.
// 8-bit codes are two nibble products: C = sum (128+lo) x + (128+hi) 16x.
//
// Exactness: every decode row gets the same arithmetic whatever the row count; the reduction
// over K is split among the 8 warps of a block by the weight shape only (groups [w*NG/8,
// (w+1)*NG/8)), and the warps' partials are added in warp order.
#include "common.cuh"

DEV u32 nib2(u32 w, int i) { return ((w >> (4 * i)) & 0x000f000fu) | 0x43004300u; }

DEV void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Streamed once: read-only path, no L1 allocation (leaves L1 to x).
DEV uint2 ldg_stream2(const u32* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
DEV uint4 ldg_stream4(const u32* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// x values of one lane for one subgroup: inputs 8t..8t+7 of row n (XM 1: silu(x) * x2).
DEV void load_x8(float* v, const float* __restrict__ x, const float* __restrict__ x2, int xm, i64 off) {
  float4 a = *(const float4*)(x + off), b = *(const float4*)(x + off + 4);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  if (xm == 1) {
    float4 c = *(const float4*)(x2 + off), d = *(const float4*)(x2 + off + 4);
    v[0] = silu_mul_f(v[0], c.x); v[1] = silu_mul_f(v[1], c.y);
    v[2] = silu_mul_f(v[2], c.z); v[3] = silu_mul_f(v[3], c.w);
    v[4] = silu_mul_f(v[4], d.x); v[5] = silu_mul_f(v[5], d.y);
    v[6] = silu_mul_f(v[6], d.z); v[7] = silu_mul_f(v[7], d.w);
  }
}

DEV void split_bf16(float x0, float x1, u32& hi, u32& lo) {
  hi = pack_bf16x2(x0, x1);
  float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
  lo = pack_bf16x2(x0 - h0, x1 - h1);
}

template <int BITS, int SUB, int TM, int DSUB, int ST_DUMMY = 0>
struct Batch {
  static constexpr int WPL = BITS == 4 ? 2 : 4;
  static constexpr int DG = DSUB / SUB;
  u32 w[DSUB][TM][WPL];
  float sc[DG][TM][2], bb[DG][TM][2];
};

// Codes and (scale, offset-corrected bias) of the DSUB subgroups from group grp0 (zeros past ge).
template <int BITS, int SUB, int TM, int DSUB>
DEV void load_batch(Batch<BITS, SUB, TM, DSUB>& B, const u32* __restrict__ codes, const void* __restrict__ sb,
                    int st_, int T0, int S, int NG, int grp0, int ge, int lane, int g) {
  constexpr int WPL = BITS == 4 ? 2 : 4;
  constexpr float OFF = BITS == 4 ? 128.0f : 2176.0f;
  constexpr int DG = DSUB / SUB;
#pragma unroll
  for (int i = 0; i < DSUB; ++i) {
    const int s = grp0 * SUB + i;
    const bool ok = s < ge * SUB;
#pragma unroll
    for (int tm = 0; tm < TM; ++tm) {
      const u32* p = codes + ((i64)(T0 + tm) * S + s) * (32 * WPL) + lane * WPL;
      if (WPL == 2) {
        uint2 v = ok ? ldg_stream2(p) : make_uint2(0u, 0u);
        B.w[i][tm][0] = v.x; B.w[i][tm][1] = v.y;
      } else {
        uint4 v = ok ? ldg_stream4(p) : make_uint4(0u, 0u, 0u, 0u);
        B.w[i][tm][0] = v.x; B.w[i][tm][1] = v.y; B.w[i][tm][2 % WPL] = v.z; B.w[i][tm][3 % WPL] = v.w;
      }
    }
  }
#pragma unroll
  for (int gi = 0; gi < DG; ++gi) {
    const int grp = grp0 + gi;
#pragma unroll
    for (int tm = 0; tm < TM; ++tm) {
      float s0 = 0.f, b0 = 0.f, s1 = 0.f, b1 = 0.f;
      if (grp < ge) {
        const i64 idx = ((i64)(T0 + tm) * NG + grp) * 16 + g;
        load_sb(sb, st_, idx, s0, b0);
        load_sb(sb, st_, idx + 8, s1, b1);
      }
      B.sc[gi][tm][0] = s0; B.sc[gi][tm][1] = s1;
      B.bb[gi][tm][0] = fmaf(-OFF, s0, b0); B.bb[gi][tm][1] = fmaf(-OFF, s1, b1);
    }
  }
}

// BITS 4|8, SUB subgroups (of 32 inputs) per group, TM 16-row tiles per block, NT 8-row n-tiles
// per row slice, DSUB subgroups loaded per batch, PF 1: the next batch's loads are issued before
// the current batch is computed (software pipelining). TM, DSUB and PF change only the schedule:
// every output element gets the same operations in the same order.
// st_ scale type (see load_sb), xm input mode (0: x, 1: silu(x) * x2).
// grid = (row slices of NT*8 rows, Mp / (16*TM)), block = 256 (8 warps).
template <int BITS, int SUB, int TM, int NT, int DSUB, int PF>
__global__ void __launch_bounds__(256) qgemv(const u32* __restrict__ codes, const void* __restrict__ sb, int st_,
                                             const float* __restrict__ x, const float* __restrict__ x2, i64 ldx,
                                             int xm, float* __restrict__ y, i64 ldy, int nrows, int M, int S,
                                             int NG) {
  constexpr int DG = DSUB / SUB;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * NT * 8;
  const int nr = min(nrows - r0, NT * 8);
  const int T0 = blockIdx.y * TM;
  const int gb = (warp * NG) >> 3, ge = ((warp + 1) * NG) >> 3;

  float acc[TM][NT][4];
#pragma unroll
  for (int a = 0; a < TM; ++a)
#pragma unroll
    for (int b = 0; b < NT; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

  Batch<BITS, SUB, TM, DSUB> cur;
  if (gb < ge) load_batch(cur, codes, sb, st_, T0, S, NG, gb, ge, lane, g);
  for (int grp0 = gb; grp0 < ge; grp0 += DG) {
    Batch<BITS, SUB, TM, DSUB> nxt;
    if (PF && grp0 + DG < ge) load_batch(nxt, codes, sb, st_, T0, S, NG, grp0 + DG, ge, lane, g);
#pragma unroll
    for (int gi = 0; gi < DG; ++gi) {
      const int grp = grp0 + gi;
      if (grp < ge) {
        float C[TM][NT][4];
        float xs[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          xs[nt] = 0.0f;
#pragma unroll
          for (int a = 0; a < TM; ++a)
#pragma unroll
            for (int c = 0; c < 4; ++c) C[a][nt][c] = 0.0f;
        }
#pragma unroll
        for (int si = 0; si < SUB; ++si) {
          const int i = gi * SUB + si;
          const int s = grp * SUB + si;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int n = nt * 8 + g;
            float xv[8];
            if (n < nr) {
              load_x8(xv, x, x2, xm, (i64)(r0 + n) * ldx + s * 32 + 8 * t);
            } else {
#pragma unroll
              for (int j = 0; j < 8; ++j) xv[j] = 0.0f;
            }
            u32 bh[2][2], bl[2][2];
#pragma unroll
            for (int st = 0; st < 2; ++st)
#pragma unroll
              for (int rg = 0; rg < 2; ++rg) {
                split_bf16(xv[4 * st + 2 * rg], xv[4 * st + 2 * rg + 1], bh[st][rg], bl[st][rg]);
                // the sum of x the offset correction uses is the sum of what the MMA saw (hi + lo)
                xs[nt] += (__uint_as_float(bh[st][rg] << 16) + __uint_as_float(bl[st][rg] << 16)) +
                          (__uint_as_float(bh[st][rg] & 0xffff0000u) + __uint_as_float(bl[st][rg] & 0xffff0000u));
              }
            u32 bh16[2][2], bl16[2][2];
            if (BITS == 8) {
#pragma unroll
              for (int st = 0; st < 2; ++st)
#pragma unroll
                for (int rg = 0; rg < 2; ++rg)
                  split_bf16(16.0f * xv[4 * st + 2 * rg], 16.0f * xv[4 * st + 2 * rg + 1], bh16[st][rg], bl16[st][rg]);
            }
#pragma unroll
            for (int tm = 0; tm < TM; ++tm) {
#pragma unroll
              for (int st = 0; st < 2; ++st) {
                if (BITS == 4) {
                  const u32 w0 = cur.w[i][tm][0], w1 = cur.w[i][tm][1];
                  const u32 a0 = nib2(w0, 2 * st), a1 = nib2(w1, 2 * st), a2 = nib2(w0, 2 * st + 1), a3 = nib2(w1, 2 * st + 1);
                  mma_bf16(C[tm][nt], a0, a1, a2, a3, bh[st][0], bh[st][1]);
                  mma_bf16(C[tm][nt], a0, a1, a2, a3, bl[st][0], bl[st][1]);
                } else {
                  constexpr int W = Batch<BITS, SUB, TM, DSUB>::WPL;
                  const u32 w0 = cur.w[i][tm][st % W], w1 = cur.w[i][tm][(2 + st) % W];
                  const u32 a0 = nib2(w0, 0), a1 = nib2(w1, 0), a2 = nib2(w0, 1), a3 = nib2(w1, 1);
                  mma_bf16(C[tm][nt], a0, a1, a2, a3, bh[st][0], bh[st][1]);
                  mma_bf16(C[tm][nt], a0, a1, a2, a3, bl[st][0], bl[st][1]);
                  const u32 h0 = nib2(w0, 2), h1 = nib2(w1, 2), h2 = nib2(w0, 3), h3 = nib2(w1, 3);
                  mma_bf16(C[tm][nt], h0, h1, h2, h3, bh16[st][0], bh16[st][1]);
                  mma_bf16(C[tm][nt], h0, h1, h2, h3, bl16[st][0], bl16[st][1]);
                }
              }
            }
          }
        }
        // --- group epilogue: scale, offset-corrected bias times the group's sum of x ---
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float v = xs[nt];
          v += __shfl_xor_sync(FULL_MASK, v, 1);
          v += __shfl_xor_sync(FULL_MASK, v, 2);
          const float sx0 = __shfl_sync(FULL_MASK, v, (2 * t) * 4);
          const float sx1 = __shfl_sync(FULL_MASK, v, (2 * t + 1) * 4);
#pragma unroll
          for (int tm = 0; tm < TM; ++tm) {
            acc[tm][nt][0] = fmaf(cur.bb[gi][tm][0], sx0, fmaf(cur.sc[gi][tm][0], C[tm][nt][0], acc[tm][nt][0]));
            acc[tm][nt][1] = fmaf(cur.bb[gi][tm][0], sx1, fmaf(cur.sc[gi][tm][0], C[tm][nt][1], acc[tm][nt][1]));
            acc[tm][nt][2] = fmaf(cur.bb[gi][tm][1], sx0, fmaf(cur.sc[gi][tm][1], C[tm][nt][2], acc[tm][nt][2]));
            acc[tm][nt][3] = fmaf(cur.bb[gi][tm][1], sx1, fmaf(cur.sc[gi][tm][1], C[tm][nt][3], acc[tm][nt][3]));
          }
        }
      }
    }
    if (grp0 + DG < ge) {
      if (PF) cur = nxt;
      else load_batch(cur, codes, sb, st_, T0, S, NG, grp0 + DG, ge, lane, g);
    }
  }

  // --- the 8 warps' partials, added in warp order ---
  constexpr int E = TM * NT * 4;
  __shared__ float red[8][E][32];
#pragma unroll
  for (int tm = 0; tm < TM; ++tm)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[warp][(tm * NT + nt) * 4 + c][lane] = acc[tm][nt][c];
  __syncthreads();
  for (int e2 = threadIdx.x; e2 < E * 32; e2 += 256) {
    const int e = e2 >> 5, ln = e2 & 31;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) v += red[w][e][ln];
    const int c = e & 3, nt = (e >> 2) % NT, tm = (e >> 2) / NT;
    const int m = (T0 + tm) * 16 + (ln >> 2) + 8 * (c >> 1);
    const int n = nt * 8 + 2 * (ln & 3) + (c & 1);
    if (m < M && n < nr) y[(i64)(r0 + n) * ldy + m] = v;
  }
}

// Dense fp32 weights [M, K]: one warp per output row, every x row in turn (same arithmetic for
// every row). grid = ceil(M / 8), block = 256.
extern "C" __global__ void __launch_bounds__(256) dense_gemv(const float* __restrict__ W, int M, int K,
                                                             const float* __restrict__ x, const float* __restrict__ x2,
                                                             i64 ldx, int xm, float* __restrict__ y, i64 ldy,
                                                             int nrows) {
  const int m = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (m >= M) return;
  const float* w = W + (i64)m * K;
  for (int n = 0; n < nrows; ++n) {
    const float* xr = x + (i64)n * ldx;
    float acc = 0.0f;
    for (int k = lane; k < K; k += 32) {
      float xv = xm == 1 ? silu_mul_f(xr[k], x2[(i64)n * ldx + k]) : xr[k];
      acc = fmaf(w[k], xv, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(i64)n * ldy + m] = acc;
  }
}

// --- load-time repacking of canonical MLX-style packed words --------------------------------
extern "C" __global__ void repack4(const u32* __restrict__ src, int M, int K, u32* __restrict__ dst, i64 total) {
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int S = K / 32;
  const int half = (int)(idx & 1), lane = (int)((idx >> 1) & 31);
  const i64 rest = idx >> 6;
  const int s = (int)(rest % S);
  const i64 T = rest / S;
  const int g = lane >> 2, t = lane & 3;
  const i64 m = T * 16 + g + 8 * half;
  u32 out = 0u;
  if (m < M) {
    const u32 w = src[m * (K / 8) + 4 * s + t];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out |= ((w >> (8 * i)) & 0xfu) << (4 * i);
      out |= ((w >> (8 * i + 4)) & 0xfu) << (4 * (i + 4));
    }
  }
  dst[idx] = out;
}

extern "C" __global__ void repack8(const u32* __restrict__ src, int M, int K, u32* __restrict__ dst, i64 total) {
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int S = K / 32;
  const int e = (int)(idx & 3), lane = (int)((idx >> 2) & 31);
  const i64 rest = idx >> 7;
  const int s = (int)(rest % S);
  const i64 T = rest / S;
  const int g = lane >> 2, t = lane & 3, half = e >> 1, st = e & 1;
  const i64 m = T * 16 + g + 8 * half;
  u32 out = 0u;
  if (m < M) {
    const u32 w = src[m * (K / 4) + 8 * s + 2 * t + st];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const u32 byte = (w >> (8 * j)) & 0xffu;
      const int lp = (j >> 1) + 4 * (j & 1);
      out |= (byte & 0xfu) << (4 * lp);
      out |= (byte >> 4) << (4 * (lp + 2));
    }
  }
  dst[idx] = out;
}

// The code of weight (m, k) in the repacked layout.
template <int BITS>
DEV u32 code_at(const u32* __restrict__ codes, i64 m, int k, int S) {
  const i64 T = m / 16;
  const int r = (int)(m % 16), g = r & 7, half = r >> 3;
  const int s = k / 32, t = (k % 32) / 8, j = k % 8;
  const i64 lanebase = (T * S + s) * 32 + g * 4 + t;
  if (BITS == 4) {
    const u32 w = codes[lanebase * 2 + half];
    const int p = (j >> 1) + 4 * (j & 1);
    return (w >> (4 * p)) & 0xfu;
  }
  const int st = j >> 2, jj = j & 3;
  const u32 w = codes[lanebase * 4 + half * 2 + st];
  const int lp = (jj >> 1) + 4 * (jj & 1);
  return ((w >> (4 * lp)) & 0xfu) | (((w >> (4 * (lp + 2))) & 0xfu) << 4);
}

// Embedding rows of an affine table: out[n, k] = q * s + b in float32, exactly as numpy.
// grid = (n, ceil(K / 256)), block = 256.
template <int BITS>
__global__ void embed_q(const int* __restrict__ ids, const u32* __restrict__ codes, const void* __restrict__ sb,
                        int st_, int K, int NG, int G, float* __restrict__ out) {
  const int k = blockIdx.y * 256 + threadIdx.x;
  if (k >= K) return;
  const i64 m = ids[blockIdx.x];
  const u32 q = code_at<BITS>(codes, m, k, K / 32);
  float s, b;
  load_sb(sb, st_, ((m / 16) * NG + k / G) * 16 + (m % 16), s, b);
  out[(i64)blockIdx.x * K + k] = __fadd_rn(__fmul_rn((float)q, s), b);
}

extern "C" __global__ void embed_dense(const int* __restrict__ ids, const float* __restrict__ table, int K,
                                       float* __restrict__ out) {
  const int k = blockIdx.y * 256 + threadIdx.x;
  if (k >= K) return;
  out[(i64)blockIdx.x * K + k] = table[(i64)ids[blockIdx.x] * K + k];
}

// Full dequantization (tests and the rare consumer that wants a float matrix).
template <int BITS>
__global__ void dequant(const u32* __restrict__ codes, const void* __restrict__ sb, int st_, int M, int K, int NG,
                        int G, float* __restrict__ out) {
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (i64)M * K) return;
  const i64 m = idx / K;
  const int k = (int)(idx % K);
  const u32 q = code_at<BITS>(codes, m, k, K / 32);
  float s, b;
  load_sb(sb, st_, ((m / 16) * NG + k / G) * 16 + (m % 16), s, b);
  out[idx] = __fadd_rn(__fmul_rn((float)q, s), b);
}

// Random words for synthetic weights (splitmix64 of seed and index): no host round trip.
extern "C" __global__ void fill_random_u32(u32* __restrict__ out, i64 n, u64 seed) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  u64 z = seed + 0x9E3779B97F4A7C15ull * (u64)(i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  out[i] = (u32)(z >> 16);
}
