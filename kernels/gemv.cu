// Affine-quantized matrix products: y[n, m] = sum_k x[n, k] * (s[m, k/G] * q[m, k] + b[m, k/G]).
//
// Weights are repacked once at load into a tile layout that feeds mma.sync directly, with
// T = 16-row tile, S = 32-input subgroups (padded to an even count for 4-bit codes):
// Sp = S rounded up to a multiple of 16 (zero codes past K; the scales' groups padded the same way,
// with zero scale and bias), so every batch of every kernel is whole.
//   4-bit: codes[T][Sp/2][32 lanes][4 words]: lane (g = lane/4, t = lane%4) holds, for the two
//     subgroups 2j and 2j+1, the words of inputs 8t..8t+7 for rows 16T+g and 16T+g+8 (in that
//     order: s 2j row g, s 2j row g+8, s 2j+1 row g, s 2j+1 row g+8), nibbles permuted so that
//     nibble i is input 2i and nibble i+4 input 2i+1 (one shift+and+or gives two bf16 codes).
//     One 16-byte load per lane feeds two subgroups.
//   8-bit: codes[T][Sp][32 lanes][4 words]: the same lane holds, per row, two words: inputs
//     8t+4st+j (st = 0, 1), each byte split into nibbles (low at (j>>1)+4(j&1), high two above).
//   sb[T][Sp / SUB][16 rows] = (scale, bias) pairs in the source dtype.
//
// qmv runs on tensor cores: codes as bf16 (128+q, exact), x split into bf16 hi + lo (16 bits of
// mantissa), fp32 accumulation per group, then y += s*C + (b - 128 s) * sum(hi + lo): the offset's
// sum is over exactly what the MMA multiplied. 8-bit codes are two nibble products:
// C = C_lo + 16 C_hi with offset 2176.
//
// Exactness: a row's arithmetic depends on the weight shape only. K is cut into P segments of KS
// inputs (qmv_split in launch.py: a function of M and K); each block takes one segment of 128
// weight rows for up to 8*NT x rows, and the segments' partials are added in segment order by the
// last block of the 128 rows to finish. The batching of loads (BATCH, the staged window), the row
// count and where a row sits change nothing in any row's operations.
#include "common.cuh"
#include "qsplit.cuh"

// Two 4-bit codes as bf16 (128 + q): (w >> 4i) & 0x000f000f | magic in one lop3 (magic in a register:
// a LOP3 takes one immediate, so the plain C form costs two).
DEV u32 nib2m(u32 w, int i, u32 magic) {
  u32 r;
  asm("lop3.b32 %0, %1, 0x000f000f, %2, 0xea;" : "=r"(r) : "r"(w >> (4 * i)), "r"(magic));
  return r;
}
DEV u32 nib2(u32 w, int i) { return ((w >> (4 * i)) & 0x000f000fu) | 0x43004300u; }

// Streamed once: read-only path, no L1 allocation (leaves L1 to the staged inputs).
DEV uint4 ldg_stream4(const u32* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// p[0] + p[stride] + ... + p[(n - 1) stride], added in that order from 0 (L2 loads: the partials of
// other blocks); eight loads are issued before their adds, so the chain waits once per eight.
DEV float sum_in_order(const float* __restrict__ p, i64 stride, int n) {
  float v = 0.0f;
  for (int q0 = 0; q0 < n; q0 += 8) {
    float t[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) t[i] = q0 + i < n ? __ldcg(p + (q0 + i) * stride) : 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (q0 + i < n) v = __fadd_rn(v, t[i]);
  }
  return v;
}

// Per (bits, n-tiles, group, blocks an SM): x rows per block, inputs per batch and per staged window
// (a schedule, not arithmetic) and the staged row pitch in bf16. NT 0 packs up to 4 rows: row r's hi
// and lo halves are the MMA's columns 2r and 2r+1, so one MMA gives both products (the same bits as
// two MMAs into separate accumulators, which is what NT >= 1 does) and the sum of the two lands in
// one thread. NT 0 stages a window of 2,048 inputs at once and runs its batches without barriers
// (1-4 row products are chains of round trips, not short of bandwidth); at 2 blocks an SM the next
// batch's codes are in flight during this one's products (PF: at 85 registers that spills). NT 1
// at 2 blocks an SM does the same with windows of 1,024 (5-8 rows: the 8B's down 5-11 % faster, o
// and qkv 1-5 %, gate_up the same). NT 1 at 3 an SM takes batches of 256 in windows of 512
// (batches of 512 spill its 85 registers inside the product loop; 27B gate_up 7 %, lm_head 7 %
// faster; windows of 1,024 were 4 % faster still on the H200 but would let a GB10's 100 KB SM hold
// only 2 blocks). 32 bf16 of
// padding: the 16-byte fragment loads of rows g and g+1 fall on disjoint banks. Batches never cross
// a padded weight's end (Sp is a multiple of 16).
// Batches ahead whose codes an expert product's warp of 1-4 rows prefetches into L2, beyond the one in
// its registers (qmv's AHEAD; <= 2: none).
constexpr int QMV_AHEAD = 4;

template <int BITS, int SUB, int NT, int MINB>
struct QmvShape {
  static constexpr int NT1 = NT > 0 ? NT : 1;
  static constexpr int R = NT > 0 ? 8 * NT : 4;  // x rows a block takes
  static constexpr int SR = 8 * NT1;              // staged rows (packed: hi and lo of 4 rows)
  static constexpr bool PF = NT <= 1 && MINB == 2;  // next batch's codes loaded a batch ahead
  static constexpr bool HALF = PF || (NT == 1 && MINB == 3);  // batches of half size
  static constexpr int B0 = (BITS == 4 ? 512 : 256) / (HALF ? 2 : NT1);
  static constexpr int BATCH = B0 < 32 * SUB ? 32 * SUB : B0;
  static constexpr int WIN = NT == 0 ? 2048 : PF ? 1024 : HALF ? 512 : BATCH;  // inputs staged at once
  static constexpr int WB = WIN / BATCH;             // batches per window
  static constexpr int PITCH = WIN + 32;
  static constexpr int NSB = BATCH / 32;                // subgroups per batch
  static constexpr int GPB = NSB / SUB;                 // groups per batch
  static constexpr int CW = BITS == 4 ? NSB / 2 : NSB;  // 16-byte code words per lane per batch
};

// BITS 4|8, SUB subgroups per group (1, 2, 4), NT 8-row n-tiles (0: 4 rows packed), XM input mode,
// SBT scale type (load_sb's ST: 0 fp16 pair, 1 bf16 pair, 2 fp32 pair):
//   XM 0: x;  1: silu(x) * x2 (the MLP's gate and up halves);
//   2: RMSNorm of h = x (+ x2 when given): the staged input is h * nw and the output is divided by
//      sqrt(mean(h^2) + eps) of the whole row; blocks of the first 128 weight rows write h to hout.
// grid = (ceil(M / 128), P segments, ceil(nrows / R)), block = 256 (8 warps, one tile each); MINB
// blocks an SM (2: at most 128 registers; NVRTC gave the 4-tile variants 134, one block an SM). The
// launcher takes 3 (at most 85 registers, a little slower a block) where that makes one wave fewer:
// the same bits (MINB also picks QmvShape's schedule, never its arithmetic).
// Codes and scales are padded to Sp subgroups (zero codes, zero scale and bias): no per-subgroup
// check runs, the padding adds exact zeros. Each warp walks its tile with one pointer and fixed
// strides; only the rows a block has are staged (the others are zero: zeroed once, or packed, never
// loaded).
// part [z][P][R][Mp] and sspart [z][mblocks][P][R] hold segment partials (P > 1); counters
// [z * mblocks] are zero between launches (the last block of a tile row resets its own).
// EX 1: stacked expert weights (ecodes / esb words apart); slice z takes slot z of `slots`
// ([expert, count, R row ids]; moe_slots builds them): x row id / kx, y row id. EX 2: the same, with
// slots written two or more launches back (the experts' down product): the slot and the first batch
// of weights are read before the PDL wait, so the fetch overlaps the previous product's tail.
// XM 3 (1-2 rows): XM 2 where x2 is the experts' rows [n·cmk, ldx2] and row r's x2 their combination under
// weights cmw [n, cmk], summed as the block stages it (moe_combine's bits; one launch fewer a MoE layer).
template <int BITS, int SUB, int NT, int XM, int SBT, int EX, int MINB>
__global__ void __launch_bounds__(256, MINB) qmv(const u32* __restrict__ codes, const u32* __restrict__ sb, int st_,
                                           const float* __restrict__ x, const float* __restrict__ x2, i64 ldx,
                                           i64 ldx2, const float* __restrict__ nw, float eps,
                                           float* __restrict__ hout, i64 ldh, float* __restrict__ y, i64 ldy,
                                           int nrows, int M, int Mp, int K, int Sp, int KS,
                                           float* __restrict__ part, float* __restrict__ sspart,
                                           int* __restrict__ counters, const int* __restrict__ slots, int kx,
                                           i64 ecodes, i64 esb, const uint4* __restrict__ xsp,
                                           const float* __restrict__ sxp, const float* __restrict__ sqp,
                                           uint4* __restrict__ xso, float* __restrict__ sxo, float* __restrict__ sqo,
                                           const float* __restrict__ reso, i64 ldres, const float* __restrict__ nwo,
                                           float* __restrict__ hso, i64 ldhs, const float* __restrict__ cmw,
                                           int cmk) {
  if (EX == 1) PDL_ENTRY;  // the slots come from the kernel just before
  using Sh = QmvShape<BITS, SUB, NT, MINB>;
  constexpr int R = Sh::R, SR = Sh::SR, BATCH = Sh::BATCH, PITCH = Sh::PITCH, GPB = Sh::GPB, CW = Sh::CW;
  constexpr int WIN = Sh::WIN, WB = Sh::WB, NSB = Sh::NSB;
  constexpr bool PK = NT == 0, PF = Sh::PF;
  // The experts' 1-4 row products run fewer blocks than SMs, each a chain of round trips: codes two
  // batches further ahead come from L2 (a dense product's full grid only got slower, -8 % on the 8B).
  constexpr bool AHEAD = PF && EX && PK && QMV_AHEAD > 2;
  constexpr int NTE = Sh::NT1;  // n-tiles of the MMA
  constexpr int GL = 4 * SUB;     // pieces per group
  constexpr int GPW = WIN / (32 * SUB);  // groups per window
  constexpr int NB64 = WIN / 64 > 0 ? WIN / 64 : 1;
  constexpr int SBW = SBT == 2 ? 2 : 1;  // words per (scale, bias) pair
  constexpr float OFF = BITS == 4 ? 128.0f : 2176.0f;
  __shared__ __align__(16) u16 xh[SR * PITCH];
  __shared__ __align__(16) u16 xl[PK ? 8 : SR * PITCH];  // packed: the lo halves live in xh
  __shared__ float sx_s[R * GPW];
  __shared__ float sq_s[R * NB64];
  __shared__ float ss_s[R];
  __shared__ int last_s;
  __shared__ int srow_s[EX ? R : 1];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int mb = blockIdx.x, p = blockIdx.y, z = blockIdx.z, P = gridDim.y, MB = gridDim.x;
  int r0 = z * R, nr = min(nrows - r0, R);
  if (EX) {  // this slice's expert and rows (an empty slot: the whole block leaves at once)
    const int* sl = slots + (i64)z * (2 + R);
    nr = sl[1];
    if (nr == 0) return;
    codes += sl[0] * ecodes;
    sb += sl[0] * esb;
    if (tid < nr) srow_s[tid] = sl[2 + tid];
    r0 = 0;
    __syncthreads();
  }
  u32 magic = 0x43004300u;
  asm volatile("" : "+r"(magic));  // kept in a register for nib2m
  const int tiles = (M + 15) >> 4;
  const bool tile_on = mb * 8 + warp < tiles;
  const int T = min(mb * 8 + warp, tiles - 1);  // idle warps read a real tile and write nothing
  const int k0 = p * KS, k1 = min(K, k0 + KS);
  // this warp's codes and (rows g, g + 8) scale pairs, advanced batch by batch
  const uint4* cptr = (const uint4*)codes + ((i64)T * (BITS == 4 ? Sp / 2 : Sp) + (BITS == 4 ? k0 / 64 : k0 / 32)) * 32 + lane;
  const u32* sptr = sb + ((i64)T * (Sp / SUB) * 16 + (k0 / (32 * SUB)) * 16 + g) * SBW;
  // staged rows past zr are zero: packed (a window of 8 rows), their fragments are not loaded; else
  // they are zeroed once
  const int zr = PK ? 2 * nr : nr;
  if (!PK)
    for (int i = tid; i < (SR - zr) * PITCH; i += 256) {
      xh[zr * PITCH + i] = 0;
      xl[zr * PITCH + i] = 0;
    }
  for (int i = tid; i < (R - nr) * GPW; i += 256) sx_s[nr * GPW + i] = 0.0f;
  if (XM >= 2 && tid < R) ss_s[tid] = 0.0f;

  float acc[NTE][4];
#pragma unroll
  for (int a = 0; a < NTE; ++a)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[a][c] = 0.0f;

  // one batch of this warp's codes and scale pairs, the pointers advanced past it
  auto load = [&](uint4(&cw)[CW], u32(&sw)[GPB][2][SBW]) {
#pragma unroll
    for (int j = 0; j < CW; ++j) cw[j] = ldg_stream4((const u32*)(cptr + j * 32));
#pragma unroll
    for (int i = 0; i < GPB; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int w = 0; w < SBW; ++w) sw[i][h][w] = __ldg(sptr + (i * 16 + 8 * h) * SBW + w);
    cptr += CW * 32;
    sptr += GPB * 16 * SBW;
  };
  uint4 cw[CW], cn[CW];  // cn, sn: the next batch (PF only)
  u32 sw[GPB][2][SBW], sn[GPB][2][SBW];
  if (k0 < k1) load(cw, sw);  // in flight during the first staging
  if (EX != 1) PDL_ENTRY;  // the first batch of weights is read while the previous kernel ends
  // 8-bit products (routers, gates: few blocks, short rows) also start their second batch before the
  // staging; in the 4-bit products that was slower (35B-A3B router 7.3 -> 6.4 µs, 8B step +3 %, H100).
  constexpr bool EARLY = PF && BITS == 8;
  if (EARLY && k0 + BATCH < k1) load(cn, sn);

  for (int wb = k0; wb < k1; wb += WIN) {
    // --- stage the block's x rows of this window as bf16 hi/lo, with per-group sums of hi + lo ---
    // live pieces a row: whole batches up to k1 (a window of one batch: a constant divisor below)
    const int cpr = WB == 1 ? BATCH / 8 : min(WIN, (k1 - wb + BATCH - 1) / BATCH * BATCH) / 8;
    if (xsp != nullptr) {  // split once by qmv_xsplit: copy this window's pieces and sums
      const int np = Sp * 4;  // pieces a split row
      for (int c = tid; c < nr * cpr; c += 256) {
        const int r = c / cpr, j = c % cpr;
        const uint4* src = xsp + (i64)(r0 + r) * 2 * np + wb / 8 + j;
        cp_async16(smem_addr(xh + (PK ? 2 * r : r) * PITCH + 8 * j), src);
        cp_async16(smem_addr((PK ? xh + (2 * r + 1) * PITCH : xl + r * PITCH) + 8 * j), src + np);
      }
      for (int c = tid; c < nr * (cpr / GL); c += 256) {
        const int r = c / (cpr / GL), j = c % (cpr / GL);
        sx_s[r * GPW + j] = sxp[(i64)(r0 + r) * (np / GL) + wb / (8 * GL) + j];
      }
      if (XM >= 2)
        for (int c = tid; c < nr * (cpr / 8); c += 256) {
          const int r = c / (cpr / 8), j = c % (cpr / 8);
          sq_s[r * NB64 + j] = sqp[(i64)(r0 + r) * (np / 8) + wb / 64 + j];
        }
      cp_async_commit_wait_all();
    } else {
      for (int c0 = 0; c0 < nr * cpr; c0 += 256) {  // whole warps every pass: the shuffles need all lanes
        const int c = c0 + tid, r = c / cpr, j = c % cpr, k = wb + 8 * j;
        const bool here = c < nr * cpr;
        const i64 row = !here ? 0 : EX ? srow_s[r] / kx : r0 + r;
        u32 hi[4], lo[4];
        float xs, sq;
        split_piece<XM>(x + row * ldx, x2 != nullptr ? x2 + row * (XM == 3 ? cmk : 1) * ldx2 : nullptr, nw,
                        hout != nullptr && mb == 0 ? hout + row * ldh : nullptr, here && k < k1, k, hi, lo, xs, sq,
                        cmw + row * cmk, cmk, ldx2);
        if (here) {
          *(uint4*)(xh + (PK ? 2 * r : r) * PITCH + 8 * j) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
          *(uint4*)((PK ? xh + (2 * r + 1) * PITCH : xl + r * PITCH) + 8 * j) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
        xs = lanes_sum<GL>(xs);
        if (here && j % GL == 0) sx_s[r * GPW + j / GL] = xs;
        if (XM >= 2) {
          sq = lanes_sum<8>(sq);
          if (here && j % 8 == 0) sq_s[r * NB64 + j / 8] = sq;
        }
      }
    }
    __syncthreads();
    if (XM >= 2 && tid < nr) {  // the row's sum of squares, 64 inputs at a time in order
      float s = ss_s[tid];
      for (int i = 0; i < NB64 && wb + 64 * i < k1; ++i) s = __fadd_rn(s, sq_s[tid * NB64 + i]);
      ss_s[tid] = s;
    }
    for (int b = 0; b < WB; ++b) {
      const int kb = wb + b * BATCH;
      if (kb >= k1) break;
      const bool more = kb + BATCH < k1;
      if (PF && more && !(EARLY && kb == k0)) load(cn, sn);  // the next batch's round trip overlaps these products
      if (AHEAD && kb + QMV_AHEAD * BATCH < k1) {  // a batch further ahead into L2 (cptr: batch b + 2)
#pragma unroll
        for (int j = 0; j < CW; ++j) l2_prefetch(cptr + (QMV_AHEAD - 2) * CW * 32 + j * 32);
        l2_prefetch(sptr + (QMV_AHEAD - 2) * GPB * 16 * SBW);
      }
      // --- tensor-core products of this warp's tile over the batch: no checks, fixed offsets ---
      // hi and lo products in separate accumulators (C/Cl; D/Dl for the high nibbles of 8-bit codes),
      // added at the group's end; packed, they are the even and odd columns of one accumulator.
#pragma unroll
      for (int gi = 0; gi < GPB; ++gi) {
        float C[NTE][4], Cl[NTE][4], D[NTE][4], Dl[NTE][4];
#pragma unroll
        for (int a = 0; a < NTE; ++a)
#pragma unroll
          for (int c = 0; c < 4; ++c) { C[a][c] = 0.0f; Cl[a][c] = 0.0f; D[a][c] = 0.0f; Dl[a][c] = 0.0f; }
#pragma unroll
        for (int si = 0; si < SUB; ++si) {
          const int sl = gi * SUB + si;  // subgroup within the batch
          u32 w[4];
          if (BITS == 4) {
            const uint4 q = cw[sl / 2];
            w[0] = (sl & 1) ? q.z : q.x;  // row g
            w[1] = (sl & 1) ? q.w : q.y;  // row g + 8
          } else {
            const uint4 q = cw[sl];
            w[0] = q.x; w[1] = q.y; w[2] = q.z; w[3] = q.w;  // (g, st0) (g, st1) (g+8, st0) (g+8, st1)
          }
#pragma unroll
          for (int nt = 0; nt < NTE; ++nt) {
            const int col = (b * NSB + sl) * 32 + 8 * t;  // packed rows past zr: zero registers
            const uint4 bh = !PK || g < zr ? *(const uint4*)(xh + (nt * 8 + g) * PITCH + col) : make_uint4(0, 0, 0, 0);
            uint4 bl = bh;
            if (!PK) bl = *(const uint4*)(xl + (nt * 8 + g) * PITCH + col);
#pragma unroll
            for (int st = 0; st < 2; ++st) {
              const u32 h0 = st ? bh.z : bh.x, h1 = st ? bh.w : bh.y;
              const u32 l0 = st ? bl.z : bl.x, l1 = st ? bl.w : bl.y;
              if (BITS == 4) {
                const u32 a0 = nib2m(w[0], 2 * st, magic), a1 = nib2m(w[1], 2 * st, magic);
                const u32 a2 = nib2m(w[0], 2 * st + 1, magic), a3 = nib2m(w[1], 2 * st + 1, magic);
                mma_bf16(C[nt], a0, a1, a2, a3, h0, h1);
                if (!PK) mma_bf16(Cl[nt], a0, a1, a2, a3, l0, l1);
              } else {
                const u32 w0 = w[st], w1 = w[2 + st];
                const u32 a0 = nib2m(w0, 0, magic), a1 = nib2m(w1, 0, magic), a2 = nib2m(w0, 1, magic);
                const u32 a3 = nib2m(w1, 1, magic), e0 = nib2m(w0, 2, magic), e1 = nib2m(w1, 2, magic);
                const u32 e2 = nib2m(w0, 3, magic), e3 = nib2m(w1, 3, magic);
                mma_bf16(C[nt], a0, a1, a2, a3, h0, h1);
                mma_bf16(D[nt], e0, e1, e2, e3, h0, h1);
                if (!PK) {
                  mma_bf16(Cl[nt], a0, a1, a2, a3, l0, l1);
                  mma_bf16(Dl[nt], e0, e1, e2, e3, l0, l1);
                }
              }
            }
          }
        }
        // group epilogue: scale, offset-corrected bias times the group's sum of x
        float sc[2], bb[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float s_, b_;
          if (SBT == 2) { s_ = __uint_as_float(sw[gi][h][0]); b_ = __uint_as_float(sw[gi][h][SBW - 1]); }
          else if (SBT == 0) { s_ = f16_to_f32(sw[gi][h][0]); b_ = f16_to_f32(sw[gi][h][0] >> 16); }
          else { s_ = bf16_to_f32(sw[gi][h][0]); b_ = bf16_to_f32(sw[gi][h][0] >> 16); }
          sc[h] = s_;
          bb[h] = fmaf(-OFF, s_, b_);
        }
        const int gw = b * GPB + gi;  // group within the window
        if (PK) {  // this thread: x row t, weight rows g (c 0, 1) and g + 8 (c 2, 3)
          const float sxt = sx_s[t * GPW + gw];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float cc = BITS == 4 ? C[0][2 * h] + C[0][2 * h + 1]
                                       : fmaf(16.0f, D[0][2 * h] + D[0][2 * h + 1], C[0][2 * h] + C[0][2 * h + 1]);
            acc[0][2 * h] = fmaf(bb[h], sxt, fmaf(sc[h], cc, acc[0][2 * h]));
          }
        } else {
#pragma unroll
          for (int nt = 0; nt < NTE; ++nt) {
            const float sx0 = sx_s[(nt * 8 + 2 * t) * GPW + gw], sx1 = sx_s[(nt * 8 + 2 * t + 1) * GPW + gw];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const float cc = BITS == 4 ? C[nt][c] + Cl[nt][c] : fmaf(16.0f, D[nt][c] + Dl[nt][c], C[nt][c] + Cl[nt][c]);
              acc[nt][c] = fmaf(bb[c >> 1], (c & 1) ? sx1 : sx0, fmaf(sc[c >> 1], cc, acc[nt][c]));
            }
          }
        }
      }
      if (PF) {
#pragma unroll
        for (int j = 0; j < CW; ++j) cw[j] = cn[j];
#pragma unroll
        for (int i = 0; i < GPB; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int w = 0; w < SBW; ++w) sw[i][h][w] = sn[i][h][w];
      } else if (more && b + 1 < WB) {
        load(cw, sw);
      }
    }
    __syncthreads();  // the staged window is free
    if (!PF && wb + WIN < k1) load(cw, sw);  // the next window's first batch, in flight during its staging
  }

  // --- outputs: the segment's partials, or the rows themselves when K is one segment ---
  if (P == 1) {
    if (tile_on) {
#pragma unroll
      for (int nt = 0; nt < NTE; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int m = T * 16 + g + 8 * (c >> 1), n = PK ? t : nt * 8 + 2 * t + (c & 1);
          if ((!PK || !(c & 1)) && m < M && n < nr) {
            float v = acc[nt][c];
            if (XM >= 2) v = __fdiv_rn(v, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss_s[n], (float)K), eps)));
            y[(i64)(EX ? srow_s[n] : r0 + n) * ldy + m] = v;
          }
        }
    }
    return;
  }
  if (tile_on) {
#pragma unroll
    for (int nt = 0; nt < NTE; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int m = T * 16 + g + 8 * (c >> 1), n = PK ? t : nt * 8 + 2 * t + (c & 1);
        if ((!PK || !(c & 1)) && n < nr) part[(((i64)z * P + p) * R + n) * Mp + m] = acc[nt][c];
      }
  }
  if (XM >= 2 && tid < R) sspart[(((i64)z * MB + mb) * P + p) * R + tid] = ss_s[tid];
  if (!arrive_last(counters + (i64)z * MB + mb, 1, P - 1, &last_s)) return;
  // the last block of these 128 rows: segments added in order, their loads in flight 8 at a time
  for (int e = tid; e < 128 * nr; e += 256) {
    const int n = e >> 7, m = mb * 128 + (e & 127);
    if (m >= M) continue;
    float v = sum_in_order(part + ((i64)z * P * R + n) * Mp + m, (i64)R * Mp, P);
    if (XM >= 2) {
      const float ss = sum_in_order(sspart + ((i64)z * MB + mb) * P * R + n, R, P);
      v = __fdiv_rn(v, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)K), eps)));
    }
    y[(i64)(EX ? srow_s[n] : r0 + n) * ldy + m] = v;
  }
  if (!EX && xso != nullptr) split_out<SUB>(y, ldy, nr, r0, mb, MB, M, reso, ldres, nwo, hso, ldhs, xso, sxo, sqo, tid);
  if (tid == 0) counters[(i64)z * MB + mb] = 0;
}

// The x rows of a 5+ row product split once (split_piece and the staging's sums, so the same bits) for
// every block of qmv to copy: xs [row][hi, lo][Sp * 4 pieces] of 8 bf16, sx [row][Sp / SUB] group
// sums of hi + lo, sq [row][Sp / 2] 64-input sums of squares (XM 2). grid = (ceil(Sp / 64), nrows), block =
// 256 (a piece a thread; Sp is a multiple of 16, so every warp is whole).
template <int XM, int SUB>
__global__ void __launch_bounds__(256) qmv_xsplit(const float* __restrict__ x, const float* __restrict__ x2, i64 ldx,
                                                  i64 ldx2, const float* __restrict__ nw, float* __restrict__ hout,
                                                  i64 ldh, int K, int Sp, uint4* __restrict__ xs,
                                                  float* __restrict__ sx, float* __restrict__ sq) {
  PDL_ENTRY;
  constexpr int GL = 4 * SUB;
  const int r = blockIdx.y, j = blockIdx.x * 256 + threadIdx.x, k = 8 * j, np = Sp * 4;
  if (blockIdx.x * 256 >= np) return;
  u32 hi[4], lo[4];
  float s, q;
  split_piece<XM>(x + (i64)r * ldx, x2 != nullptr ? x2 + (i64)r * ldx2 : nullptr, nw,
                  hout != nullptr ? hout + (i64)r * ldh : nullptr, j < np && k < K, k, hi, lo, s, q);
  if (j < np) {
    xs[(i64)r * 2 * np + j] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    xs[((i64)r * 2 + 1) * np + j] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
  s = lanes_sum<GL>(s);
  if (j < np && j % GL == 0) sx[(i64)r * (np / GL) + j / GL] = s;
  if (XM >= 2) {
    q = lanes_sum<8>(q);
    if (j < np && j % 8 == 0) sq[(i64)r * (np / 8) + j / 8] = q;
  }
}

// Dense fp32 weights [M, K]: one warp per output row, every x row in turn (same arithmetic for
// every row). grid = ceil(M / 8), block = 256.
extern "C" __global__ void __launch_bounds__(256) dense_gemv(const float* __restrict__ W, int M, int K,
                                                             const float* __restrict__ x, const float* __restrict__ x2,
                                                             i64 ldx, int xm, float* __restrict__ y, i64 ldy,
                                                             int nrows) {
  PDL_ENTRY;
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
