// Mixture of experts (Qwen3.5 / 3.6 MoE): router softmax + top-k, the expert products for each
// (row, chosen expert), SwiGLU between them, the weighted combination with the shared expert's gated
// output. Numpy twins: moe_route, moe_experts in engine/ops/numpy_backend.py.
//
// Experts in qmv's layout run on gemv.cu's qmv over slots of rows grouped by expert (moe_slots);
// the others (float32, GGUF blocks of 16) moe_gemv, one warp per output element with a fixed
// reduction order. Either way a row's result never depends on the other rows.
#include "common.cuh"

// Softmax over E logits (fp32), top k by probability (ties: the lower expert id first, numpy's
// stable argsort), weights renormalised over the k, of one row x: one warp, p_s [E] shared scratch.
// experts, weights: the row's kk = k choices, or k + 1 with gate given: choice k is the shared
// expert stacked as expert E, under sigmoid(*gate). k <= 31, E <= 1024.
DEV void route_row(const float* __restrict__ x, int E, int k, const float* __restrict__ gate, int* experts,
                   float* __restrict__ weights, float* p_s, int lane) {
  float mx = -__int_as_float(0x7f800000);
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, x[e]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) {
    p_s[e] = expf(__fsub_rn(x[e], mx));
    sum = __fadd_rn(sum, p_s[e]);
  }
  sum = warp_sum(sum);
  for (int e = lane; e < E; e += 32) p_s[e] = __fdiv_rn(p_s[e], sum);
  int mine = -1;       // lane j keeps the j-th choice
  float mine_p = 0.0f;
  if (E <= 256) {  // the lane's 8 candidates sorted in registers; a round takes the warp's best head
    float v[8];
    int id[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int e = lane + 32 * i;
      v[i] = e < E ? p_s[e] : -1.0f;
      id[i] = e < E ? e : 0x7fffffff;
    }
    constexpr int NET[19][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 1}, {2, 3},
                                {4, 5}, {6, 7}, {2, 4}, {3, 5}, {1, 4}, {3, 6}, {1, 2}, {3, 4}, {5, 6}};
#pragma unroll
    for (int c = 0; c < 19; ++c) {  // a sorting network: the argmax order, best first
      const int a = NET[c][0], b = NET[c][1];
      if (argmax_beats(v[b], id[b], v[a], id[a])) {
        const float tv = v[a]; v[a] = v[b]; v[b] = tv;
        const int ti = id[a]; id[a] = id[b]; id[b] = ti;
      }
    }
    for (int j = 0; j < k; ++j) {
      // probabilities are >= 0, so their bits order like them: the best is the largest key, and of
      // equal keys the lowest expert (a lane without candidates offers key 0 and no expert)
      const u32 key = id[0] == 0x7fffffff ? 0u : __float_as_uint(v[0]);
      const u32 best = __reduce_max_sync(FULL_MASK, key);
      const int bi = (int)__reduce_min_sync(FULL_MASK, key == best ? (u32)id[0] : 0x7fffffffu);
      if (lane == j) { mine = bi; mine_p = __uint_as_float(best); }
      if (id[0] == bi) {
#pragma unroll
        for (int i = 0; i < 7; ++i) { v[i] = v[i + 1]; id[i] = id[i + 1]; }
        v[7] = -1.0f;
        id[7] = 0x7fffffff;
      }
    }
  } else {
    u32 taken = 0u;  // bit m: this lane's expert lane + 32·m is chosen already
    for (int j = 0; j < k; ++j) {
      float bv = -1.0f;
      int bi = 0x7fffffff;
      for (int e = lane, bit = 0; e < E; e += 32, ++bit) {
        const float p = p_s[e];
        if (!((taken >> bit) & 1u) && argmax_beats(p, e, bv, bi)) { bv = p; bi = e; }
      }
      warp_argmax(bv, bi);
      if (lane == j) { mine = bi; mine_p = bv; }
      if (bi % 32 == lane) taken |= 1u << (bi / 32);
    }
  }
  float tot = 0.0f;  // in choice order, like numpy's sum over the k
  for (int t = 0; t < k; ++t) tot = __fadd_rn(tot, __shfl_sync(FULL_MASK, mine_p, t));
  if (lane < k) {
    experts[lane] = mine;
    weights[lane] = __fdiv_rn(mine_p, tot);
  } else if (lane == k && gate != nullptr) {
    experts[k] = E;
    weights[k] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-*gate)));
  }
}

// logits [n, E] (row stride ld), gate [n] (stride ldg) or null; experts, weights [n, kk].
// grid = n, block = 32.
extern "C" __global__ void moe_route(const float* __restrict__ logits, i64 ld, int E, int k,
                                     const float* __restrict__ gate, i64 ldg, int* __restrict__ experts,
                                     float* __restrict__ weights) {
  PDL_ENTRY;
  __shared__ float p_s[1024];  // the probabilities, computed once for the k selection rounds
  const i64 row = blockIdx.x;
  const int kk = gate != nullptr ? k + 1 : k;
  route_row(logits + row * ld, E, k, gate != nullptr ? gate + row * ldg : nullptr, experts + row * kk,
            weights + row * kk, p_s, threadIdx.x);
}

// Slots of the expert products (gemv.cu qmv with EX 1): the nk (row, choice) ids grouped by expert,
// at most R to a slot; slot s = [expert, count, ids...] (stride 2 + R), slots past the last one
// empty. Z >= ceil(nk / R) + min(E, nk) slots. Which slots an expert takes and where an id lands
// within them vary from run to run and change no bits (qmv's rows are independent), so an expert
// claims its slots by one shared atomic add, with no scan over the experts (three barriers).
// Block of 1024, E <= 1024.
DEV void build_slots(const int* experts, int nk, int E, int R, int* __restrict__ slots, int Z) {
  __shared__ int cnt[1024], first[1024], fill[1024], total;
  const int tid = threadIdx.x;
  cnt[tid] = 0;
  fill[tid] = 0;
  if (tid == 0) total = 0;
  __syncthreads();
  for (int i = tid; i < nk; i += 1024) atomicAdd(cnt + experts[i], 1);
  __syncthreads();
  const int mine = tid < E ? (cnt[tid] + R - 1) / R : 0;  // this expert's slots
  if (mine > 0) {
    const int f = atomicAdd(&total, mine);
    first[tid] = f;
    for (int j = 0; j < mine; ++j) {
      slots[(i64)(f + j) * (2 + R)] = tid;
      slots[(i64)(f + j) * (2 + R) + 1] = min(R, cnt[tid] - j * R);
    }
  }
  __syncthreads();
  for (int s = total + tid; s < Z; s += 1024) slots[(i64)s * (2 + R) + 1] = 0;
  for (int i = tid; i < nk; i += 1024) {
    const int e = experts[i], pos = atomicAdd(fill + e, 1);
    slots[(i64)(first[e] + pos / R) * (2 + R) + 2 + pos % R] = i;
  }
}

// grid = 1, block = 1024.
extern "C" __global__ void moe_slots(const int* __restrict__ experts, int nk, int E, int R, int* __restrict__ slots,
                                     int Z) {
  PDL_ENTRY;
  build_slots(experts, nk, E, R, slots, Z);
}

// Decode rows in one launch: n <= 32 rows routed one warp a row (moe_route's arithmetic), then the
// slots of their n·kk ids over ES experts (moe_slots'; experts is read back as written, so no
// read-only path for it). grid = 1, block = 1024 (32 for one row), dynamic shared n·E floats.
extern "C" __global__ void moe_route_slots(const float* __restrict__ logits, i64 ld, int E, int k,
                                           const float* __restrict__ gate, i64 ldg, int* experts,
                                           float* __restrict__ weights, int n, int ES, int R,
                                           int* __restrict__ slots, int Z) {
  PDL_ENTRY;
  extern __shared__ float p_all[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kk = gate != nullptr ? k + 1 : k;
  if (n == 1) {  // one row's choices are distinct experts: a slot each, written by the lane that chose it
    route_row(logits, E, k, gate, experts, weights, p_all, lane);
    if (lane < kk) {
      int* sl = slots + (i64)lane * (2 + R);
      sl[0] = experts[lane];  // the lane's own write
      sl[1] = 1;
      sl[2] = lane;
    }
    for (int s = kk + lane; s < Z; s += 32) slots[(i64)s * (2 + R) + 1] = 0;
    return;
  }
  if (warp < n)
    route_row(logits + warp * ld, E, k, gate != nullptr ? gate + warp * ldg : nullptr, experts + warp * kk,
              weights + warp * kk, p_all + warp * E, lane);
  __syncthreads();  // the block's writes of the choices are visible to it
  build_slots(experts, n * kk, ES, R, slots, Z);
}

// A scale or bias of an affine weight: ST 0 fp16, 1 bf16 (raw 16-bit), 2 fp32.
DEV float moe_sb(const void* p, int st, i64 i) {
  if (st == 2) return ((const float*)p)[i];
  const u32 h = ((const unsigned short*)p)[i];
  return st == 0 ? f16_to_f32(h) : bf16_to_f32(h);
}

// y[rj, m] = Σ_c W_e[m, c]·x[c] for each (row, choice) rj = r·k + j, e = experts[rj], over the
// stacked expert weights: BITS 4 or 8: codes uint32 [E, M, K·BITS/32] (element 0 in the least
// significant bits, along the input dim), scales/biases [E, M, K/group] (w = s·q + b); BITS 0:
// float32 [E, M, K]. x: XJ = 0: row r's input (row stride ldx), the same for every choice;
// XJ = 1: one input per (row, choice) (stride ldx per rj). y [n·k, M].
// grid = (ceil(M/8), n·k), block = 256: one warp per output element.
template <int BITS>
__global__ void __launch_bounds__(256) moe_gemv(const void* __restrict__ W, const void* __restrict__ scales,
                                                const void* __restrict__ biases, int st,
                                                const int* __restrict__ experts, int k,
                                                const float* __restrict__ x, i64 ldx, int xj,
                                                float* __restrict__ y, int M, int K, int group) {
  PDL_ENTRY;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int m = blockIdx.x * 8 + warp;
  if (m >= M) return;
  const i64 rj = blockIdx.y;
  const i64 e = experts[rj];
  const float* xr = x + (xj ? rj : rj / k) * ldx;
  float acc = 0.0f;
  if (BITS == 0) {
    const float* wr = (const float*)W + (e * M + m) * (i64)K;
    for (int c = lane; c < K; c += 32) acc = __fmaf_rn(wr[c], xr[c], acc);
  } else {
    constexpr int PER = 32 / (BITS == 0 ? 32 : BITS);
    constexpr u32 MASK = (1u << (BITS == 0 ? 1 : BITS)) - 1u;
    const int words = K / PER;
    const u32* wr = (const u32*)W + (e * M + m) * (i64)words;
    const i64 sb = (e * M + m) * (i64)(K / group);
    for (int wi = lane; wi < words; wi += 32) {
      const u32 word = wr[wi];
      const int c0 = wi * PER;
      const i64 gi = sb + c0 / group;  // group is a multiple of PER: a word never straddles groups
      float dot = 0.0f, xs = 0.0f;
#pragma unroll
      for (int t = 0; t < PER; ++t) {
        const float xv = xr[c0 + t];
        dot = __fmaf_rn((float)((word >> (BITS * t)) & MASK), xv, dot);
        xs = __fadd_rn(xs, xv);
      }
      acc = __fadd_rn(acc, __fadd_rn(__fmul_rn(moe_sb(scales, st, gi), dot), __fmul_rn(moe_sb(biases, st, gi), xs)));
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) y[rj * M + m] = acc;
}

// act[rj, i] = silu(gu[rj, i])·gu[rj, I + i] (the first I outputs are the gate). grid = (n·k, ceil(I/256)).
extern "C" __global__ void moe_swiglu(const float* __restrict__ gu, float* __restrict__ act, int I) {
  PDL_ENTRY;
  const int i = blockIdx.y * 256 + threadIdx.x;
  if (i >= I) return;
  const i64 rj = blockIdx.x;
  act[rj * I + i] = silu_mul_f(gu[rj * 2 * I + i], gu[rj * 2 * I + I + i]);
}

// out[r, h] = Σ_j weights[r, j]·y[r·k + j, h], summed in choice order, then, where shared is given,
// + sigmoid(gate[r])·shared[r, h] (the shared expert's gated output; row strides lds, ldg).
// y [n·k, H], out [n, H] contiguous. grid = (n, ceil(H/256)).
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ weights, int k,
                                       const float* __restrict__ shared, i64 lds, const float* __restrict__ gate,
                                       i64 ldg, float* __restrict__ out, int H) {
  PDL_ENTRY;
  const int h = blockIdx.y * 256 + threadIdx.x;
  if (h >= H) return;
  const i64 r = blockIdx.x;
  float acc = 0.0f;
  for (int j = 0; j < k; ++j) acc = __fadd_rn(acc, __fmul_rn(weights[r * k + j], y[(r * k + j) * H + h]));
  if (shared != nullptr) {
    const float sg = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gate[r * ldg])));
    acc = __fadd_rn(acc, __fmul_rn(shared[r * lds + h], sg));
  }
  out[r * H + h] = acc;
}
