// How qmv stages its x rows: f(x) in pieces of 8 inputs, each split into bf16 hi and lo halves with
// the sum of hi + lo (and of h's squares under an RMSNorm). qmv's staging, qmv_xsplit and a producer
// writing the next product's split input (split_out) share these, so all three give the same bits.
#pragma once
#include "common.cuh"

// A piece's pair of inputs as the MMA sees them: (hi0 + lo0) + (hi1 + lo1) of two packed bf16 pairs.
DEV float hl_sum(u32 hi, u32 lo) {
  return __fadd_rn(__fadd_rn(__uint_as_float(hi << 16), __uint_as_float(lo << 16)),
                   __fadd_rn(__uint_as_float(hi & 0xffff0000u), __uint_as_float(lo & 0xffff0000u)));
}

DEV void ld8(float* v, const float* __restrict__ p) {
  const float4 a = *(const float4*)p, b = *(const float4*)(p + 4);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// 8 inputs of Σ_j cw[j]·y[j·ldc + i] over ck expert rows, summed in choice order from zero with moe_combine's
// rounding (the same bits as the combined row it would write). Three rows' loads are in flight at once (the
// rows are in L2, just written by the experts' down product).
DEV void combine8(float* u, const float* __restrict__ y, i64 ldc, const float* __restrict__ cw, int ck) {
#pragma unroll
  for (int i = 0; i < 8; ++i) u[i] = 0.0f;
  int j = 0;
  for (; j + 3 <= ck; j += 3) {
    float t[3][8];
#pragma unroll
    for (int r = 0; r < 3; ++r) ld8(t[r], y + (j + r) * ldc);
#pragma unroll
    for (int r = 0; r < 3; ++r) {
      const float wj = cw[j + r];
#pragma unroll
      for (int i = 0; i < 8; ++i) u[i] = __fadd_rn(u[i], __fmul_rn(wj, t[r][i]));
    }
  }
  for (; j < ck; ++j) {
    float t[8];
    ld8(t, y + j * ldc);
    const float wj = cw[j];
#pragma unroll
    for (int i = 0; i < 8; ++i) u[i] = __fadd_rn(u[i], __fmul_rn(wj, t[i]));
  }
}

// One 8-input piece of an x row (xr, x2r, hr: the row's starts) as qmv stages it: f(x) by XM (XM 2:
// h = x + x2, written to hr when given, then h * nw), its bf16 hi/lo halves, the sum of hi + lo and
// (XM 2) of h's squares; zeros where !live. XM 3: XM 2 with x2 the experts' combination, combine8 of the
// ck rows from x2r (row stride ldc) under weights cw.
template <int XM>
DEV void split_piece(const float* __restrict__ xr, const float* __restrict__ x2r, const float* __restrict__ nw,
                     float* __restrict__ hr, bool live, int k, u32 (&hi)[4], u32 (&lo)[4], float& xs, float& sq,
                     const float* __restrict__ cw = nullptr, int ck = 0, i64 ldc = 0) {
  float v[8];
  sq = 0.0f;
  if (live) {
    ld8(v, xr + k);
    if (XM == 1) {
      float u[8];
      ld8(u, x2r + k);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = silu_mul_f(v[i], u[i]);
    } else if (XM >= 2) {
      if (x2r != nullptr) {
        float u[8];
        if (XM == 3)
          combine8(u, x2r + k, ldc, cw, ck);
        else
          ld8(u, x2r + k);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(v[i], u[i]);
        if (hr != nullptr) {
          *(float4*)(hr + k) = make_float4(v[0], v[1], v[2], v[3]);
          *(float4*)(hr + k + 4) = make_float4(v[4], v[5], v[6], v[7]);
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
  xs = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    split_bf16(v[2 * i], v[2 * i + 1], hi[i], lo[i]);
    xs = __fadd_rn(xs, hl_sum(hi[i], lo[i]));
  }
}

// v summed over aligned groups of N lanes (a butterfly: every lane of the group gets the same bits)
template <int N>
DEV float lanes_sum(float v) {
#pragma unroll
  for (int o = 1; o < N; o <<= 1) v = __fadd_rn(v, __shfl_xor_sync(FULL_MASK, v, o));
  return v;
}

// The input of a norm-staged next product, split as qmv_xsplit does (the same bits), by the block that
// reduced and wrote these 128 columns of rows r0.. of y (the barrier makes them visible to the block):
// h = y + res (written to hs), then the pieces of h * nw, their group sums and 64-input sums of
// squares. The last column block also writes the pieces past M (zeros) to the padded width.
template <int SUB>
DEV void split_out(const float* y, i64 ldy, int nr, int r0, int mb, int MB, int M, const float* __restrict__ res,
                   i64 ldres, const float* __restrict__ nw, float* __restrict__ hs, i64 ldhs,
                   uint4* __restrict__ xs, float* __restrict__ sx, float* __restrict__ sq, int tid) {
  constexpr int GL = 4 * SUB;
  const int np = ((M + 31) / 32 + 15) / 16 * 16 * 4;  // pieces a split row (launch.py padded_subgroups x 4)
  const int j0 = mb * 16, cnt = (mb + 1 == MB ? np : j0 + 16) - j0;  // a multiple of 16: whole groups
  __syncthreads();
  for (int c0 = 0; c0 < nr * cnt; c0 += 256) {  // whole warps every pass: the shuffles need all lanes
    const int c = c0 + tid, r = c / cnt, j = j0 + c % cnt, k = 8 * j;
    const bool here = c < nr * cnt;
    const i64 row = r0 + (here ? r : 0);
    u32 hi[4], lo[4];
    float xs_, q;
    split_piece<2>(y + row * ldy, res + row * ldres, nw, hs + row * ldhs, here && k < M, k, hi, lo, xs_, q);
    if (here) {
      xs[row * 2 * np + j] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
      xs[(row * 2 + 1) * np + j] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    }
    xs_ = lanes_sum<GL>(xs_);
    if (here && j % GL == 0) sx[row * (np / GL) + j / GL] = xs_;
    q = lanes_sum<8>(q);
    if (here && j % 8 == 0) sq[row * (np / 8) + j / 8] = q;
  }
}
