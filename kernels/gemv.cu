// Affine-quantized matrix products: y[n, m] = sum_k x[n, k] * (s[m, k/G] * q[m, k] + b[m, k/G]).
//
// Weights are repacked once at load into a tile layout that feeds mma.sync directly, with
// T = 16-row tile, S = 32-input subgroups (padded to an even count for 4-bit codes):
//   4-bit: codes[T][S/2][32 lanes][4 words]: lane (g = lane/4, t = lane%4) holds, for the two
//     subgroups 2j and 2j+1, the words of inputs 8t..8t+7 for rows 16T+g and 16T+g+8 (in that
//     order: s 2j row g, s 2j row g+8, s 2j+1 row g, s 2j+1 row g+8), nibbles permuted so that
//     nibble i is input 2i and nibble i+4 input 2i+1 (one shift+and+or gives two bf16 codes).
//     One 16-byte load per lane feeds two subgroups.
//   8-bit: codes[T][S][32 lanes][4 words]: the same lane holds, per row, two words: inputs
//     8t+4st+j (st = 0, 1), each byte split into nibbles (low at (j>>1)+4(j&1), high two above).
//   sb[T][NG][16 rows] = (scale, bias) pairs in the source dtype.
//
// qmv runs on tensor cores: codes as bf16 (128+q, exact), x split into bf16 hi + lo (16 bits of
// mantissa), fp32 accumulation per group, then y += s*C + (b - 128 s) * sum(hi + lo): the offset's
// sum is over exactly what the MMA multiplied. 8-bit codes are two nibble products:
// C = C_lo + 16 C_hi with offset 2176.
//
// Exactness: a row's arithmetic depends on the weight shape only. K is cut into P segments of KS
// inputs (qmv_split in launch.py: a function of M and K); each block takes one segment of 128
// weight rows for up to 8*NT x rows, and the segments' partials are added in segment order by the
// last block of the 128 rows to finish. The batching of loads (BATCH), the row count and where a
// row sits change nothing in any row's operations.
#include "common.cuh"

DEV u32 nib2(u32 w, int i) { return ((w >> (4 * i)) & 0x000f000fu) | 0x43004300u; }

DEV void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Streamed once: read-only path, no L1 allocation (leaves L1 to the staged inputs).
DEV uint4 ldg_stream4(const u32* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

DEV void split_bf16(float x0, float x1, u32& hi, u32& lo) {
  hi = pack_bf16x2(x0, x1);
  float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
  lo = pack_bf16x2(x0 - h0, x1 - h1);
}

DEV float hl_sum(u32 hi, u32 lo) {
  return __fadd_rn(__fadd_rn(__uint_as_float(hi << 16), __uint_as_float(lo << 16)),
                   __fadd_rn(__uint_as_float(hi & 0xffff0000u), __uint_as_float(lo & 0xffff0000u)));
}

DEV void ld8(float* v, const float* __restrict__ p) {
  const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Per n-tile count: x rows per block, inputs staged per batch (a schedule, not arithmetic), and
// the staged row pitch in bf16 (64 bytes of padding: the 16-byte fragment loads of rows g and g+1
// fall on disjoint banks).
template <int NT>
struct QmvShape {
  static constexpr int R = 8 * NT;
  static constexpr int BATCH = 512 / NT;
  static constexpr int PITCH = BATCH + 32;
  static constexpr int NSB = BATCH / 32;
};

// Code words of one lane for subgroup pairs [s0, s0 + 2*CW) (zeros past Sp).
template <int BITS, int CW>
DEV void qmv_load_codes(uint4* cw, const u32* __restrict__ codes, int T, int Sp, int s0, int lane) {
#pragma unroll
  for (int i = 0; i < CW; ++i) {
    if (BITS == 4) {
      const int pr = s0 / 2 + i;
      cw[i] = pr < Sp / 2 ? ldg_stream4(codes + (((i64)T * (Sp / 2) + pr) * 32 + lane) * 4) : make_uint4(0u, 0u, 0u, 0u);
    } else {
      const int s = s0 + i;
      cw[i] = s < Sp ? ldg_stream4(codes + (((i64)T * Sp + s) * 32 + lane) * 4) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// (scale, offset-corrected bias) of rows g and g+8 for groups [grp0, grp0 + NGC) (zeros past NG).
template <int BITS, int NGC>
DEV void qmv_load_sb(float (*sc)[2], float (*bb)[2], const void* __restrict__ sb, int st_, int T, int NG, int grp0,
                     int g) {
  constexpr float OFF = BITS == 4 ? 128.0f : 2176.0f;
#pragma unroll
  for (int i = 0; i < NGC; ++i) {
    const int grp = grp0 + i;
    float s0 = 0.f, b0 = 0.f, s1 = 0.f, b1 = 0.f;
    if (grp < NG) {
      const i64 idx = ((i64)T * NG + grp) * 16 + g;
      load_sb(sb, st_, idx, s0, b0);
      load_sb(sb, st_, idx + 8, s1, b1);
    }
    sc[i][0] = s0; sc[i][1] = s1;
    bb[i][0] = fmaf(-OFF, s0, b0); bb[i][1] = fmaf(-OFF, s1, b1);
  }
}

// BITS 4|8, SUB subgroups per group (1, 2, 4), NT 8-row n-tiles, XM input mode:
//   0: x;  1: silu(x) * x2 (the MLP's gate and up halves);
//   2: RMSNorm of h = x (+ x2 when given): the staged input is h * nw and the output is divided by
//      sqrt(mean(h^2) + eps) of the whole row; blocks of the first 128 weight rows write h to hout.
// grid = (ceil(M / 128), P segments, ceil(nrows / (8 NT))), block = 256 (8 warps, one tile each).
// part [z][P][8 NT][Mp] and sspart [z][mblocks][P][8 NT] hold segment partials (P > 1); counters
// [z * mblocks] are zero between launches (the last block of a tile row resets its own).
template <int BITS, int SUB, int NT, int XM>
__global__ void __launch_bounds__(256) qmv(const u32* __restrict__ codes, const void* __restrict__ sb, int st_,
                                           const float* __restrict__ x, const float* __restrict__ x2, i64 ldx,
                                           i64 ldx2, const float* __restrict__ nw, float eps,
                                           float* __restrict__ hout, i64 ldh, float* __restrict__ y, i64 ldy,
                                           int nrows, int M, int Mp, int K, int NG, int KS,
                                           float* __restrict__ part, float* __restrict__ sspart,
                                           int* __restrict__ counters) {
  using Sh = QmvShape<NT>;
  constexpr int R = Sh::R, BATCH = Sh::BATCH, PITCH = Sh::PITCH, NSB = Sh::NSB;
  constexpr int GPB = NSB / SUB;                       // groups per batch
  constexpr int SPC0 = BITS == 4 && SUB > 1 ? 16 : 8;  // subgroups per code chunk (<= 8 groups of scales)
  constexpr int SPC = SPC0 < NSB ? SPC0 : NSB;
  constexpr int CW = BITS == 4 ? SPC / 2 : SPC;        // uint4 per lane per chunk
  constexpr int GPC = SPC / SUB;                       // groups per chunk
  constexpr int NCH = NSB / SPC;                       // chunks per batch
  constexpr int CPR = BATCH / 8;                       // 8-input pieces per staged row
  constexpr int GL = 4 * SUB;                          // pieces per group
  constexpr int NB64 = BATCH / 64;
  __shared__ __align__(16) u16 xh[R * PITCH];
  __shared__ __align__(16) u16 xl[R * PITCH];
  __shared__ float sx_s[R * GPB];
  __shared__ float sq_s[R * NB64];
  __shared__ float ss_s[R];
  __shared__ int last_s;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int mb = blockIdx.x, p = blockIdx.y, z = blockIdx.z, P = gridDim.y, MB = gridDim.x;
  const int r0 = z * R, nr = min(nrows - r0, R);
  const int T = mb * 8 + warp;
  const bool tile_on = T * 16 < M;
  const int S = K / 32, Sp = BITS == 4 ? S + (S & 1) : S;
  const int k0 = p * KS, k1 = min(K, k0 + KS);
  if (XM == 2 && tid < R) ss_s[tid] = 0.0f;

  float acc[NT][4];
#pragma unroll
  for (int a = 0; a < NT; ++a)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[a][c] = 0.0f;

  for (int kb = k0; kb < k1; kb += BATCH) {
    const int sb0 = kb / 32;  // first subgroup of the batch
    uint4 cw[CW];
    float sc[GPC][2], bb[GPC][2];
    if (tile_on) {  // the first chunk's codes are in flight while the batch is staged
      qmv_load_codes<BITS, CW>(cw, codes, T, Sp, sb0, lane);
      qmv_load_sb<BITS, GPC>(sc, bb, sb, st_, T, NG, sb0 / SUB, g);
    }
    // --- stage x[r0 .. r0+R, kb .. kb+BATCH) as bf16 hi/lo, with per-group sums of hi + lo ---
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int c = pass * 256 + tid, r = c / CPR, j = c % CPR, k = kb + 8 * j;
      float v[8];
      float sq = 0.0f;
      if (r < nr && k < k1) {
        const i64 row = r0 + r;
        ld8(v, x + row * ldx + k);
        if (XM == 1) {
          float u[8];
          ld8(u, x2 + row * ldx2 + k);
#pragma unroll
          for (int i = 0; i < 8; ++i) v[i] = silu_mul_f(v[i], u[i]);
        } else if (XM == 2) {
          if (x2 != nullptr) {
            float u[8];
            ld8(u, x2 + row * ldx2 + k);
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(v[i], u[i]);
            if (hout != nullptr && mb == 0) {
              *(float4*)(hout + row * ldh + k) = make_float4(v[0], v[1], v[2], v[3]);
              *(float4*)(hout + row * ldh + k + 4) = make_float4(v[4], v[5], v[6], v[7]);
            }
          }
          float w[8];
          ld8(w, nw + k);
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            sq = __fadd_rn(sq, __fmul_rn(v[i], v[i]));
            v[i] = __fmul_rn(v[i], w[i]);
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
      }
      u32 hi[4], lo[4];
      float xs = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        split_bf16(v[2 * i], v[2 * i + 1], hi[i], lo[i]);
        xs = __fadd_rn(xs, hl_sum(hi[i], lo[i]));
      }
      *(uint4*)(xh + r * PITCH + 8 * j) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      *(uint4*)(xl + r * PITCH + 8 * j) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
#pragma unroll
      for (int o = 1; o < GL; o <<= 1) xs = __fadd_rn(xs, __shfl_xor_sync(FULL_MASK, xs, o));
      if (j % GL == 0) sx_s[r * GPB + j / GL] = xs;
      if (XM == 2) {
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) sq = __fadd_rn(sq, __shfl_xor_sync(FULL_MASK, sq, o));
        if (j % 8 == 0) sq_s[r * NB64 + j / 8] = sq;
      }
    }
    __syncthreads();
    if (XM == 2 && tid < R) {  // the row's sum of squares, 64 inputs at a time in order
      float s = ss_s[tid];
      for (int i = 0; i < NB64 && kb + 64 * i < k1; ++i) s = __fadd_rn(s, sq_s[tid * NB64 + i]);
      ss_s[tid] = s;
    }
    // --- tensor-core products of this warp's tile over the batch ---
    if (tile_on) {
#pragma unroll
      for (int ch = 0; ch < NCH; ++ch) {
        if (ch > 0) {
          qmv_load_codes<BITS, CW>(cw, codes, T, Sp, sb0 + ch * SPC, lane);
          qmv_load_sb<BITS, GPC>(sc, bb, sb, st_, T, NG, (sb0 + ch * SPC) / SUB, g);
        }
#pragma unroll
        for (int gi = 0; gi < GPC; ++gi) {
          const int grp = (sb0 + ch * SPC) / SUB + gi;
          if (grp < NG && grp * SUB * 32 < k1) {
            float C[NT][4], Ch[NT][4];
#pragma unroll
            for (int a = 0; a < NT; ++a)
#pragma unroll
              for (int c = 0; c < 4; ++c) { C[a][c] = 0.0f; Ch[a][c] = 0.0f; }
#pragma unroll
            for (int si = 0; si < SUB; ++si) {
              const int sl = ch * SPC + gi * SUB + si;  // subgroup within the batch
              const int ci = gi * SUB + si;             // within the chunk
              u32 w[4];
              if (BITS == 4) {
                const uint4 q = cw[ci / 2];
                w[0] = (ci & 1) ? q.z : q.x;  // row g
                w[1] = (ci & 1) ? q.w : q.y;  // row g + 8
              } else {
                const uint4 q = cw[ci];
                w[0] = q.x; w[1] = q.y; w[2] = q.z; w[3] = q.w;  // (g, st0) (g, st1) (g+8, st0) (g+8, st1)
              }
#pragma unroll
              for (int nt = 0; nt < NT; ++nt) {
                const uint4 bh = *(const uint4*)(xh + (nt * 8 + g) * PITCH + sl * 32 + 8 * t);
                const uint4 bl = *(const uint4*)(xl + (nt * 8 + g) * PITCH + sl * 32 + 8 * t);
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                  const u32 h0 = st ? bh.z : bh.x, h1 = st ? bh.w : bh.y;
                  const u32 l0 = st ? bl.z : bl.x, l1 = st ? bl.w : bl.y;
                  if (BITS == 4) {
                    const u32 a0 = nib2(w[0], 2 * st), a1 = nib2(w[1], 2 * st);
                    const u32 a2 = nib2(w[0], 2 * st + 1), a3 = nib2(w[1], 2 * st + 1);
                    mma_bf16(C[nt], a0, a1, a2, a3, h0, h1);
                    mma_bf16(C[nt], a0, a1, a2, a3, l0, l1);
                  } else {
                    const u32 w0 = w[st], w1 = w[2 + st];
                    mma_bf16(C[nt], nib2(w0, 0), nib2(w1, 0), nib2(w0, 1), nib2(w1, 1), h0, h1);
                    mma_bf16(C[nt], nib2(w0, 0), nib2(w1, 0), nib2(w0, 1), nib2(w1, 1), l0, l1);
                    mma_bf16(Ch[nt], nib2(w0, 2), nib2(w1, 2), nib2(w0, 3), nib2(w1, 3), h0, h1);
                    mma_bf16(Ch[nt], nib2(w0, 2), nib2(w1, 2), nib2(w0, 3), nib2(w1, 3), l0, l1);
                  }
                }
              }
            }
            // group epilogue: scale, offset-corrected bias times the group's sum of x
            const int gb = ch * GPC + gi;  // group within the batch
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const float sx0 = sx_s[(nt * 8 + 2 * t) * GPB + gb], sx1 = sx_s[(nt * 8 + 2 * t + 1) * GPB + gb];
#pragma unroll
              for (int c = 0; c < 4; ++c) {
                const float cc = BITS == 4 ? C[nt][c] : fmaf(16.0f, Ch[nt][c], C[nt][c]);
                const int h = c >> 1;
                acc[nt][c] = fmaf(bb[gi][h], (c & 1) ? sx1 : sx0, fmaf(sc[gi][h], cc, acc[nt][c]));
              }
            }
          }
        }
      }
    }
    __syncthreads();  // the staged batch is free
  }

  // --- outputs: the segment's partials, or the rows themselves when K is one segment ---
  if (P == 1) {
    if (tile_on) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int m = T * 16 + g + 8 * (c >> 1), n = nt * 8 + 2 * t + (c & 1);
          if (m < M && n < nr) {
            float v = acc[nt][c];
            if (XM == 2) v = __fdiv_rn(v, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss_s[n], (float)K), eps)));
            y[(i64)(r0 + n) * ldy + m] = v;
          }
        }
    }
    return;
  }
  if (tile_on) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = T * 16 + g + 8 * (c >> 1), n = nt * 8 + 2 * t + (c & 1);
        if (n < nr) part[(((i64)z * P + p) * R + n) * Mp + m] = acc[nt][c];
      }
  }
  if (XM == 2 && tid < R) sspart[(((i64)z * MB + mb) * P + p) * R + tid] = ss_s[tid];
  __threadfence();
  __syncthreads();
  if (tid == 0) last_s = atomicAdd(counters + (i64)z * MB + mb, 1) == P - 1;
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  // the last block of these 128 rows: segments added in order
  for (int e = tid; e < 128 * nr; e += 256) {
    const int n = e >> 7, m = mb * 128 + (e & 127);
    if (m >= M) continue;
    float v = 0.0f;
    for (int q = 0; q < P; ++q) v = __fadd_rn(v, __ldcg(part + (((i64)z * P + q) * R + n) * Mp + m));
    if (XM == 2) {
      float ss = 0.0f;
      for (int q = 0; q < P; ++q) ss = __fadd_rn(ss, __ldcg(sspart + (((i64)z * MB + mb) * P + q) * R + n));
      v = __fdiv_rn(v, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)K), eps)));
    }
    y[(i64)(r0 + n) * ldy + m] = v;
  }
  if (tid == 0) counters[(i64)z * MB + mb] = 0;
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
  const int S = K / 32, Sp2 = (S + 1) / 2;
  const int e = (int)(idx & 3), lane = (int)((idx >> 2) & 31);
  const i64 rest = idx >> 7;
  const int s = 2 * (int)(rest % Sp2) + (e >> 1);
  const i64 T = rest / Sp2;
  const int g = lane >> 2, t = lane & 3, half = e & 1;
  const i64 m = T * 16 + g + 8 * half;
  u32 out = 0u;
  if (m < M && s < S) {
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
  const int lane = g * 4 + t;
  if (BITS == 4) {
    const int Sp2 = (S + 1) / 2;
    const u32 w = codes[((T * Sp2 + s / 2) * 32 + lane) * 4 + (s & 1) * 2 + half];
    const int p = (j >> 1) + 4 * (j & 1);
    return (w >> (4 * p)) & 0xfu;
  }
  const int st = j >> 2, jj = j & 3;
  const u32 w = codes[((T * S + s) * 32 + lane) * 4 + half * 2 + st];
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
