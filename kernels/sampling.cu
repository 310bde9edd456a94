// Token choice on the device: the same choice as engine.sampling.sample (up to the last bit of a
// float64 exp, which CUDA and numpy may round differently) without copying a logits row back.
#include "common.cuh"

// The argmax (lowest index on ties) of x[0..V) by a block of 1024 threads; the answer in thread 0
// (0 for an empty or all-NaN row).
DEV int block_argmax1024(const float* __restrict__ x, int V) {
  __shared__ float bv_s[32];
  __shared__ int bi_s[32];
  float bv = -__int_as_float(0x7f800000);
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += 1024) {
    const float v = x[i];
    if (argmax_beats(v, i, bv, bi)) { bv = v; bi = i; }
  }
  warp_argmax(bv, bi);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) { bv_s[warp] = bv; bi_s[warp] = bi; }
  __syncthreads();
  int b = bi_s[0];
  if (threadIdx.x == 0) {
    float v = bv_s[0];
    for (int w = 1; w < 32; ++w)
      if (argmax_beats(bv_s[w], bi_s[w], v, b)) { v = bv_s[w]; b = bi_s[w]; }
  }
  return b == 0x7fffffff ? 0 : b;
}

#define SAMPLE_CAP 2048  // candidates gathered at a top-k threshold (ties included); past it, exactly k

// An unsigned key in the order of the floats: -0 == +0, NaN lowest (a descending numpy argsort puts
// it last); key_value inverts it (NaN stays a NaN).
DEV u32 order_key(float f) {
  if (f != f) return 0u;
  const u32 u = f == 0.0f ? 0u : __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
DEV float key_value(u32 k) { return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k); }

// Candidate order: a larger key first, then the lower index (a stable descending sort).
DEV bool before(u32 ka, int ia, u32 kb, int ib) { return ka > kb || (ka == kb && ia < ib); }

// The k-th largest key of x[0..V) (k >= 1), 8 bits a pass from the top; histograms aggregated per
// warp by match.any. Block-wide: every thread returns it.
DEV u32 radix_threshold(const float* __restrict__ xr, int V, int k, u32* hist, u32* sel) {
  const int tid = threadIdx.x, lane = tid & 31;
  u32 prefix = 0u, mask = 0u, remaining = (u32)k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += 1024) hist[i] = 0u;
    __syncthreads();
    for (int base = 0; base < V; base += 1024) {
      const int i = base + tid;
      const u32 key = i < V ? order_key(xr[i]) : 0u;
      const bool act = i < V && (key & mask) == prefix;
      const u32 d = (key >> shift) & 255u;
      const u32 peers = __match_any_sync(FULL_MASK, act ? d : 256u + lane);
      if (act && lane == __ffs(peers) - 1) atomicAdd(&hist[d], (u32)__popc(peers));
    }
    __syncthreads();
    if (tid == 0) {
      u32 above = 0u, b = 255u;
      for (;; --b) {
        if (above + hist[b] >= remaining || b == 0u) break;
        above += hist[b];
      }
      sel[0] = prefix | (b << shift);
      sel[1] = remaining - above;
    }
    __syncthreads();
    prefix = sel[0];
    remaining = sel[1];
    mask |= 255u << shift;
    __syncthreads();
  }
  return prefix;
}

// Every (key, index) with key >= thr into ck/ci, unordered (at most SAMPLE_CAP kept); the count.
DEV int gather(const float* __restrict__ xr, int V, u32 thr, u32* ck, int* ci, u32* count) {
  if (threadIdx.x == 0) *count = 0u;
  __syncthreads();
  for (int i = threadIdx.x; i < V; i += 1024) {
    const u32 key = order_key(xr[i]);
    if (key >= thr) {
      const u32 slot = atomicAdd(count, 1u);
      if (slot < SAMPLE_CAP) { ck[slot] = key; ci[slot] = i; }
    }
  }
  __syncthreads();
  return (int)*count;
}

// The k candidates of a row whose exact threshold thr (its k-th largest key) ties beyond SAMPLE_CAP:
// every key > thr (fewer than k), then the keys == thr of the lowest indices, as numpy's stable
// order takes them. Those by an ordered compaction of 1024 indices a pass: a warp's ballot, a prefix
// over the 32 warps and a running count rank each tie; the passes stop once enough are held. Returns k.
DEV int gather_lowest_ties(const float* __restrict__ xr, int V, u32 thr, int k, u32* ck, int* ci, u32* count) {
  __shared__ u32 woff[33];  // warps' exclusive offsets in a pass; [32] the pass's total
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  __syncthreads();  // every thread has read *count of the last gather before this one resets it
  const u32 above = (u32)gather(xr, V, thr + 1u, ck, ci, count);  // key > thr: no key is 0xffffffff
  const u32 need = (u32)k - above;
  u32 taken = 0u;  // ties met so far, the same in every thread: the loop's exit is block-uniform
  for (int base = 0; base < V && taken < need; base += 1024) {
    const int i = base + tid;
    const bool tie = i < V && order_key(xr[i]) == thr;
    const u32 ballot = __ballot_sync(FULL_MASK, tie);
    if (lane == 0) woff[warp] = (u32)__popc(ballot);
    __syncthreads();
    if (warp == 0) {
      const u32 c = woff[lane];
      u32 s = c;
      for (int d = 1; d < 32; d <<= 1) {
        const u32 t = __shfl_up_sync(FULL_MASK, s, d);
        if (lane >= d) s += t;
      }
      woff[lane] = s - c;
      if (lane == 31) woff[32] = s;
    }
    __syncthreads();
    const u32 r = taken + woff[warp] + (u32)__popc(ballot & ((1u << lane) - 1u));
    if (tie && r < need) { ck[above + r] = thr; ci[above + r] = i; }
    taken += woff[32];
    __syncthreads();  // woff is rewritten by the next pass
  }
  return k;
}

// ck/ci[0..n) sorted by `before`, over P (a power of two >= n) slots padded with the lowest pair.
DEV void bitonic_sort(u32* ck, int* ci, int n, int P) {
  const int tid = threadIdx.x;
  for (int i = n + tid; i < P; i += 1024) { ck[i] = 0u; ci[i] = 0x7fffffff; }
  __syncthreads();
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < P; i += 1024) {
        const int j = i ^ stride;
        if (j > i && before(ck[j], ci[j], ck[i], ci[i]) == ((i & size) == 0)) {
          const u32 tk = ck[i]; ck[i] = ck[j]; ck[j] = tk;
          const int ti = ci[i]; ci[i] = ci[j]; ci[j] = ti;
        }
      }
      __syncthreads();
    }
  }
}

// Per row: mode[r] = -1 greedy (argmax), else top-k with k = mode[r] (1 <= k <= 1024);
// par[r] = (temperature, top_p, u): u is engine.sampling.uniform(seed, position).
// out[r] = the token, always (ties beyond SAMPLE_CAP at the threshold by gather_lowest_ties).
// grid = rows, block = 1024.
extern "C" __global__ void __launch_bounds__(1024) sample_rows(const float* __restrict__ x, i64 ldx, int V,
                                                               const int* __restrict__ mode,
                                                               const double* __restrict__ par,
                                                               int* __restrict__ out) {
  PDL_ENTRY;
  __shared__ u32 hist[256];
  __shared__ u32 sel[2];
  __shared__ u32 count;
  __shared__ u32 ck[SAMPLE_CAP];
  __shared__ int ci[SAMPLE_CAP];
  __shared__ double cdf[1024];
  const int row = blockIdx.x, tid = threadIdx.x;
  const float* xr = x + (i64)row * ldx;
  const int k = mode[row];
  if (k < 0) {
    const int b = block_argmax1024(xr, V);
    if (tid == 0) out[row] = b;
    return;
  }

  // A threshold at or below the k-th largest key in one pass: the k-th largest of the threads'
  // maxima (k of them are distinct elements). Its candidates usually fit; else the exact one.
  u32 mx = 0u;
  for (int i = tid; i < V; i += 1024) mx = max(mx, order_key(xr[i]));
  ck[tid] = mx;
  ci[tid] = tid;
  __syncthreads();
  bitonic_sort(ck, ci, 1024, 1024);
  u32 thr = ck[k - 1];
  __syncthreads();
  int n = gather(xr, V, thr, ck, ci, &count);
  if (n > SAMPLE_CAP) {
    thr = radix_threshold(xr, V, k, hist, sel);
    n = gather(xr, V, thr, ck, ci, &count);
  }
  if (n > SAMPLE_CAP) n = gather_lowest_ties(xr, V, thr, k, ck, ci, &count);
  int P = 1;
  while (P < n) P <<= 1;
  bitonic_sort(ck, ci, n, P);

  // Weights exp(z - z0) with z = logit / T in float64, summed in order; the top-p cut; the inverse CDF.
  const int m = k < n ? k : n;
  const double T = par[3 * row], top_p = par[3 * row + 1], u = par[3 * row + 2];
  const double z0 = (double)key_value(ck[0]) / T;
  for (int i = tid; i < m; i += 1024) cdf[i] = exp((double)key_value(ck[i]) / T - z0);
  __syncthreads();
  if (tid == 0) {
    double s = 0.0;
    for (int i = 0; i < m; ++i) { s += cdf[i]; cdf[i] = s; }
    int keep = m;
    if (top_p < 1.0) {
      const double cut = top_p * cdf[m - 1];
      int j = 0;
      while (j < m && cdf[j] < cut) ++j;  // numpy searchsorted, side left
      keep = j + 1 < m ? j + 1 : m;
    }
    const double target = u * cdf[keep - 1];
    int j = 0;
    while (j < keep && cdf[j] <= target) ++j;  // side right
    out[row] = ci[j < keep ? j : keep - 1];
  }
}
