// Prompt-chunk products on tensor cores: y[n, m] = sum_k f(x)[n, k] * (s * q[m, k] + b) for the 4-bit
// affine weights in gemv.cu's tile layout, every weight read once per 128 x rows. The "fp16" prefill
// precision (EngineSettings.prefill_precision; "exact" keeps qmv's near-fp32 products).
//
// Rounding: each x row is staged once as fp16 after a power-of-two scale that puts its largest
// magnitude in [2^14, 2^15), so fp16's range never clips and each value keeps 11 bits; each weight is
// dequantized to fp16 (q exact, one rounding of s*q + b). Products and sums are fp32 in the MMA. (qmv's
// arithmetic as a GEMM -- exact codes, x as hi + lo, fp32 group scaling -- needs two MMAs a product and
// a per-group epilogue, and measured no faster than qmv: docs/perf-notes.md.)
//
// Exactness: a row's bits depend on its own values and the weight only. The MMA computes each output
// from its own row and column; K is cut into segments by the weight shape and the prefill chunk
// (qgemm_split), never by the row count, and segments are added in order.
#include "common.cuh"

#define QG_BN 128  // x rows a block (and weight rows: 8 tiles of 16)
#define QG_BK 64   // inputs a stage (a pair of 32-input subgroups)
// QG_STAGES, the cp.async pipeline depth: kernels/launch.py holds the one value (-DQG_STAGES=).
#ifndef QG_STAGES
#error "qgemm.cu needs QG_STAGES: compile it through kernels.launch"
#endif

// Two 4-bit codes (nibbles i and i+4 of w: inputs 2i, 2i+1) as fp16 s*q + b: 1024 + q is exact, so
// is the subtraction; the fma rounds once.
DEV u32 deq2(u32 w, int i, u32 s2, u32 b2) {
  u32 c, q, r;
  asm("lop3.b32 %0, %1, 0x000f000f, 0x64006400, 0xea;" : "=r"(c) : "r"(w >> (4 * i)));
  asm("sub.f16x2 %0, %1, %2;" : "=r"(q) : "r"(c), "r"(0x64006400u));
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(q), "r"(s2), "r"(b2));
  return r;
}

// f(x) for 4 inputs at k: XM 0 x; 1 silu(x) * x2; 2 (x [+ x2]) * nw, with h = x + x2 and its square
// sum returned through h4/sq.
template <int XM>
DEV float4 stage_in(const float* __restrict__ x, const float* __restrict__ x2, const float* __restrict__ nw, int k,
                    float4& h4) {
  float4 v = *(const float4*)(x + k);
  if (XM == 1) {
    const float4 u = *(const float4*)(x2 + k);
    v = make_float4(silu_mul_f(v.x, u.x), silu_mul_f(v.y, u.y), silu_mul_f(v.z, u.z), silu_mul_f(v.w, u.w));
  } else if (XM == 2) {
    if (x2 != nullptr) {
      const float4 u = *(const float4*)(x2 + k);
      v = make_float4(__fadd_rn(v.x, u.x), __fadd_rn(v.y, u.y), __fadd_rn(v.z, u.z), __fadd_rn(v.w, u.w));
    }
    h4 = v;
    const float4 w = *(const float4*)(nw + k);
    v = make_float4(__fmul_rn(v.x, w.x), __fmul_rn(v.y, w.y), __fmul_rn(v.z, w.z), __fmul_rn(v.w, w.w));
  }
  return v;
}

// One x row a block: f(x) times 2^e rounded to fp16 into xs[row, 0..Kp) (zeros past K), and
// rf[row] = (2^-e, the RMSNorm's divisor or 1). XM 2 with x2 and hout writes h = x + x2 to hout.
// grid = rows, block = 256.
template <int XM>
__global__ void __launch_bounds__(256) qgemm_stage(const float* __restrict__ x, i64 ldx, const float* __restrict__ x2,
                                                   i64 ldx2, const float* __restrict__ nw, float eps,
                                                   float* __restrict__ hout, i64 ldh, int K, int Kp,
                                                   u32* __restrict__ xs, float* __restrict__ rf) {
  PDL_ENTRY;
  __shared__ float red[2][8];
  const int row = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  x += row * ldx;
  if (x2 != nullptr) x2 += row * ldx2;
  float mx = 0.0f, sq = 0.0f;
  for (int k = 4 * tid; k < K; k += 1024) {
    float4 h;
    const float4 v = stage_in<XM>(x, x2, nw, k, h);
    mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    if (XM == 2) {
      sq = fmaf(h.x, h.x, fmaf(h.y, h.y, fmaf(h.z, h.z, fmaf(h.w, h.w, sq))));
      if (x2 != nullptr && hout != nullptr) *(float4*)(hout + row * ldh + k) = h;
    }
  }
  mx = warp_max(mx);
  sq = warp_sum(sq);
  if (lane == 0) { red[0][warp] = mx; red[1][warp] = sq; }
  __syncthreads();
  mx = red[0][0];
  sq = red[1][0];
  for (int w = 1; w < 8; ++w) { mx = fmaxf(mx, red[0][w]); sq = __fadd_rn(sq, red[1][w]); }
  int e = 0;
  if (mx > 0.0f && mx <= 3.0e38f) {
    frexpf(mx, &e);  // mx < 2^e
    e = 15 - e;
  }
  const float scale = ldexpf(1.0f, e);
  if (tid == 0) {
    rf[2 * row] = ldexpf(1.0f, -e);
    rf[2 * row + 1] = XM == 2 ? __fsqrt_rn(__fadd_rn(__fdiv_rn(sq, (float)K), eps)) : 1.0f;
  }
  u32* out = xs + (i64)row * (Kp / 2);
  for (int k = 4 * tid; k < Kp; k += 1024) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), h;
    if (k < K) v = stage_in<XM>(x, x2, nw, k, h);
    *(uint2*)(out + k / 2) = make_uint2(f16x2(v.x * scale, v.y * scale), f16x2(v.z * scale, v.w * scale));
  }
}

// Stage layout: X [QG_BN rows][64 inputs] fp16 (16-byte pieces of odd rows swapped by halves, so a
// fragment load's 8 lanes of rows g, g+1 fall on distinct banks), codes [8 tiles][32 lanes] uint4,
// (scale, bias) words [8 tiles][NG groups][16 rows][SBW].
template <int SUB, int SBT>
struct QgShape {
  static constexpr int SBW = SBT == 2 ? 2 : 1;
  static constexpr int NG = SUB == 1 ? 2 : 1;  // groups a stage touches
  static constexpr int SWORDS = NG * 16 * SBW;  // per tile
  static constexpr int XB = QG_BN * QG_BK * 2, CB = 8 * 32 * 16, SB = 8 * SWORDS * 4;
  static constexpr int STAGE = XB + CB + SB;
};

DEV u32 sb_f16x2(const u32* w, int SBT, bool bias) {
  float v;
  if (SBT == 2) v = __uint_as_float(w[bias ? 1 : 0]);
  else if (SBT == 0) v = f16_to_f32(bias ? w[0] >> 16 : w[0]);
  else v = bf16_to_f32(bias ? w[0] >> 16 : w[0]);
  return f16x2(v, v);
}

// grid = (ceil(M / 128), ceil(rows / 128), P segments of KB stages), block = 256: warp (wm, wn) =
// (warp % 4, warp / 4) takes weight tiles 2wm, 2wm+1 and x rows 64wn.. of the block.
// P == 1: y = acc * rf; else part[p][rows][M] holds the segment's sums for qgemm_reduce.
template <int SUB, int SBT>
__global__ void __launch_bounds__(256, 1) qgemm(const u32* __restrict__ codes, const u32* __restrict__ sb,
                                               const u32* __restrict__ xs, const float* __restrict__ rf,
                                               float* __restrict__ y, i64 ldy, float* __restrict__ part, int rows,
                                               int M, int Sp, int KB) {
  PDL_ENTRY;
  using Sh = QgShape<SUB, SBT>;
  constexpr int SBW = Sh::SBW, NG = Sh::NG, SWORDS = Sh::SWORDS;
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;
  const int mb = blockIdx.x, nb = blockIdx.y, p = blockIdx.z;
  const int tiles = (M + 15) >> 4, nkb_all = Sp / 2;
  const int kb0 = p * KB, nkb = min(KB, nkb_all - kb0);
  const int Kw = Sp * 16;  // u32 words of an xs row (fp16 pairs)

  auto load = [&](int s, int kb) {
    unsigned char* st = smem + s * Sh::STAGE;
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // x: 128 rows x 8 pieces
      const int i = tid + 256 * j, r = i >> 3, c = i & 7, n = nb * QG_BN + r;
      const u32* src = xs + (i64)min(n, rows - 1) * Kw + kb * 32 + c * 4;
      cp_async16z(smem_addr(st + r * 128 + ((c ^ ((r & 1) << 2)) * 16)), src, n < rows ? 16 : 0);
    }
    {  // codes: one 16-byte piece a lane of each tile
      const int T = min(mb * 8 + warp, tiles - 1);
      cp_async16(smem_addr(st + Sh::XB + tid * 16), (const uint4*)codes + ((i64)T * (Sp / 2) + kb) * 32 + lane);
    }
    constexpr int PIECES = SWORDS / 4;  // 16-byte pieces of a tile's scale words
    if (tid < 8 * PIECES) {
      const int tt = tid / PIECES, pc = tid % PIECES, T = min(mb * 8 + tt, tiles - 1);
      const int grp = (kb * 2) / SUB;
      cp_async16(smem_addr(st + Sh::XB + Sh::CB + (tt * SWORDS + pc * 4) * 4),
                 sb + ((i64)T * (Sp / SUB) + grp) * 16 * SBW + pc * 4);
    }
  };

  float acc[2][8][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 8; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

#pragma unroll
  for (int s = 0; s < QG_STAGES - 1; ++s) {
    if (s < nkb) load(s, kb0 + s);
    cp_async_commit();
  }
  for (int i = 0; i < nkb; ++i) {
    cp_async_wait<QG_STAGES - 2>();
    __syncthreads();  // stage i is here for every thread; stage i-1 is free
    if (i + QG_STAGES - 1 < nkb) load((i + QG_STAGES - 1) % QG_STAGES, kb0 + i + QG_STAGES - 1);
    cp_async_commit();
    const unsigned char* st = smem + (i % QG_STAGES) * Sh::STAGE;
    const uint4* cs = (const uint4*)(st + Sh::XB);
    const u32* ss = (const u32*)(st + Sh::XB + Sh::CB);
    uint4 cw[2];
    u32 s2[2][2][NG], b2[2][2][NG];  // [m-tile][row g, g + 8][group]
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      cw[mt] = cs[(2 * wm + mt) * 32 + lane];
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int gi = 0; gi < NG; ++gi) {
          const u32* w = ss + (2 * wm + mt) * SWORDS + (gi * 16 + g + 8 * h) * SBW;
          s2[mt][h][gi] = sb_f16x2(w, SBT, false);
          b2[mt][h][gi] = sb_f16x2(w, SBT, true);
        }
    }
#pragma unroll
    for (int sl = 0; sl < 2; ++sl) {
      const int gi = NG == 2 ? sl : 0;
      uint4 bq[8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int r = 64 * wn + 8 * nt + g, c = 4 * sl + t;
        bq[nt] = *(const uint4*)(st + r * 128 + ((c ^ ((r & 1) << 2)) * 16));
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const u32 w0 = sl ? cw[mt].z : cw[mt].x, w1 = sl ? cw[mt].w : cw[mt].y;  // rows g, g + 8
#pragma unroll
        for (int st2 = 0; st2 < 2; ++st2) {
          const u32 a0 = deq2(w0, 2 * st2, s2[mt][0][gi], b2[mt][0][gi]);
          const u32 a1 = deq2(w1, 2 * st2, s2[mt][1][gi], b2[mt][1][gi]);
          const u32 a2 = deq2(w0, 2 * st2 + 1, s2[mt][0][gi], b2[mt][0][gi]);
          const u32 a3 = deq2(w1, 2 * st2 + 1, s2[mt][1][gi], b2[mt][1][gi]);
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            mma_f16(acc[mt][nt], a0, a1, a2, a3, st2 ? bq[nt].z : bq[nt].x, st2 ? bq[nt].w : bq[nt].y);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = (mb * 8 + 2 * wm + mt) * 16 + g + 8 * (c >> 1);
        const int n = nb * QG_BN + 64 * wn + 8 * nt + 2 * t + (c & 1);
        if (m >= M || n >= rows) continue;
        if (gridDim.z == 1) y[(i64)n * ldy + m] = __fdiv_rn(__fmul_rn(acc[mt][nt][c], rf[2 * n]), rf[2 * n + 1]);
        else part[((i64)p * rows + n) * M + m] = acc[mt][nt][c];
      }
}

// The fp16 weights of the products above, written out whole for a GEMM library: w16[m, k] = s*q + b with
// deq2's rounding, rows of Sp*32 inputs (zeros past K). One thread a code word: row m's inputs
// k..k+7 of subgroup s. grid = ceil(words / 256), block = 256.
template <int SUB, int SBT>
__global__ void __launch_bounds__(256) qgemm_dequant(const u32* __restrict__ codes, const u32* __restrict__ sb,
                                                    int M, int Sp, i64 words, uint4* __restrict__ w16) {
  PDL_ENTRY;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= words) return;
  const int e = (int)(idx & 3), lane = (int)((idx >> 2) & 31), g = lane >> 2, t = lane & 3;
  const i64 rest = idx >> 7, T = rest / (Sp / 2);
  const int s = 2 * (int)(rest % (Sp / 2)) + (e >> 1);
  const i64 m = T * 16 + g + 8 * (e & 1);
  if (m >= M) return;
  const u32* w = sb + ((T * (Sp / SUB) + s / SUB) * 16 + (m & 15)) * (SBT == 2 ? 2 : 1);
  const u32 s2 = sb_f16x2(w, SBT, false), b2 = sb_f16x2(w, SBT, true), c = codes[idx];
  w16[(m * Sp * 32 + s * 32 + t * 8) / 8] = make_uint4(deq2(c, 0, s2, b2), deq2(c, 1, s2, b2), deq2(c, 2, s2, b2),
                                                     deq2(c, 3, s2, b2));
}

// The segments' sums in order, times the row factors. grid = (ceil(M / 256), rows), block = 256.
extern "C" __global__ void qgemm_reduce(const float* __restrict__ part, int P, int rows, int M,
                                        const float* __restrict__ rf, float* __restrict__ y, i64 ldy) {
  PDL_ENTRY;
  const int m = blockIdx.x * 256 + threadIdx.x, n = blockIdx.y;
  if (m >= M) return;
  float v = 0.0f;
  for (int p = 0; p < P; ++p) v = __fadd_rn(v, part[((i64)p * rows + n) * M + m]);
  y[(i64)n * ldy + m] = __fdiv_rn(__fmul_rn(v, rf[2 * n]), rf[2 * n + 1]);
}
