// Gated DeltaNet, the linear-attention layers of Qwen3.5 / 3.6: the causal depthwise conv1d with its
// per-lane state, the gates, the delta-rule scan and the gated RMSNorm. Numpy twins: the
// "Qwen3.5 / Qwen3.6" section of engine/ops/numpy_backend.py. float32 throughout.
//
// State lives in arrays with one slot per lane, [slots, ...]: a row updates only its own lane's
// slot, in place (a verify window's row j: the lane's window slot j). A lane < 0 (a padding row of a
// captured decode batch) uses the last slot, which the model keeps as scratch. Every row is computed
// with the same arithmetic whatever else is in the batch (a verify window's rows by one set of
// threads, in order: the state stays in registers between them).
#include "common.cuh"

DEV int dn_slot(int lane, int slots) { return lane < 0 ? slots - 1 : lane; }
DEV float dn_silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

// The conv at one channel: Σ_j w[j]·win[j] accumulated in j order (the prompt and step kernels
// share it, so both forms give the same bits).
template <int K>
DEV float conv_point(const float* __restrict__ wc, const float* win) {
  float acc = __fmul_rn(wc[0], win[0]);
#pragma unroll
  for (int j = 1; j < K; ++j) acc = __fadd_rn(acc, __fmul_rn(wc[j], win[j]));
  return acc;
}

// g = -exp(A_log)·softplus(a + dt_bias) (softplus(x) = x above 20, as torch), beta = sigmoid(b), at
// head h of a row (deltanet_gates and the decode conv's gate block share it: the same bits).
DEV void gates_at(float a, float b, int h, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                  float* g, float* beta) {
  const float x = __fadd_rn(a, dt_bias[h]);
  const float sp = x > 20.0f ? x : log1pf(expf(x));
  *g = -__fmul_rn(expf(a_log[h]), sp);
  *beta = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-b)));
}

// One step of a channel's conv: `win` holds the K-1 rows before it; x joins them, the output is
// silu(conv_point) and `win` moves on by one row (the prompt and decode kernels share it).
template <int K>
DEV float conv_next(const float* __restrict__ wc, float* win, float x) {
  win[K - 1] = x;
  const float y = dn_silu(conv_point<K>(wc, win));
#pragma unroll
  for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
  return y;
}

// Decode rows in windows of W rows per stream (W = 1: plain decode; a verify window: k + 1), stream
// by stream: row s·W + j is stream s's window row j. x [n, C] (row stride ldx), w [C, K], state
// [slots, C, K-1] (oldest row first), lanes [n] (a stream's rows share one); out [n, C] = silu(conv).
// A thread steps its channel through the stream's rows in order from the lane's slot and writes the
// state after row j to slot lane + j·stride (Cache.window_slots): what W one-row steps, each from a
// copy of the state row j-1 left, would write. With a != nullptr one more block per stream writes
// its rows' gates (g, beta [n, Hv]) from a, b [n, Hv] (row strides lda, ldb): one launch for both.
// grid = (ceil(C/256) (+1 with gates), n / W), block = 256.
template <int K>
__global__ void __launch_bounds__(256) conv1d_step(const float* __restrict__ x, i64 ldx, const float* __restrict__ w,
                                                   float* __restrict__ state, const int* __restrict__ lanes,
                                                   int slots, float* __restrict__ out, int C,
                                                   const float* __restrict__ a, i64 lda, const float* __restrict__ b,
                                                   i64 ldb, const float* __restrict__ a_log,
                                                   const float* __restrict__ dt_bias, float* __restrict__ g,
                                                   float* __restrict__ beta, int Hv, int W, int stride) {
  PDL_ENTRY;
  const i64 r0 = (i64)blockIdx.y * W;  // the stream's first row
  if (a != nullptr && blockIdx.x == gridDim.x - 1) {
    for (int e = threadIdx.x; e < W * Hv; e += 256) {
      const i64 i = r0 + e / Hv;
      const int h = e % Hv;
      gates_at(a[i * lda + h], b[i * ldb + h], h, a_log, dt_bias, g + i * Hv + h, beta + i * Hv + h);
    }
    return;
  }
  const int c = blockIdx.x * 256 + threadIdx.x;
  if (c >= C) return;
  const int lane = lanes[r0];
  const float* wc = w + (i64)c * K;
  const float* st = state + ((i64)dn_slot(lane, slots) * C + c) * (K - 1);
  float win[K];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) win[j] = st[j];
  for (int r = 0; r < W; ++r) {
    const i64 i = r0 + r;
    out[i * C + c] = conv_next<K>(wc, win, x[i * ldx + c]);
    float* sr = state + ((i64)dn_slot(lane + r * stride, slots) * C + c) * (K - 1);
#pragma unroll
    for (int j = 0; j < K - 1; ++j) sr[j] = win[j];
  }
}

// Row t of (state ++ x) for t in [-(K-1), T): the state holds the K-1 rows before x, oldest first.
template <int K>
DEV float conv_row(const float* __restrict__ st, const float* __restrict__ x, i64 ldx, int c, int t) {
  return t < 0 ? st[K - 1 + t] : x[(i64)t * ldx + c];
}

// One lane's prompt rows: x [T, C] (row stride ldx); slot `slot` holds the K-1 rows before them and
// receives the last K-1 rows of (state ++ x). out [T, C]. A thread computes CONV_ROWS rows of its
// channel from the rows before them (the serial loop's values, so its bits); blockIdx.y 0, the only
// block that reads the old state, writes the new one. grid = (ceil(C/256), ceil(T/CONV_ROWS)), block = 256.
#define CONV_ROWS 16
template <int K>
__global__ void __launch_bounds__(256) conv1d_prompt(const float* __restrict__ x, i64 ldx,
                                                     const float* __restrict__ w, float* __restrict__ state,
                                                     int slot, float* __restrict__ out, int C, int T) {
  PDL_ENTRY;
  const int c = blockIdx.x * 256 + threadIdx.x, t0 = blockIdx.y * CONV_ROWS, t1 = min(T, t0 + CONV_ROWS);
  if (c >= C) return;
  float* st = state + ((i64)slot * C + c) * (K - 1);
  const float* wc = w + (i64)c * K;
  float win[K];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) win[j] = conv_row<K>(st, x, ldx, c, t0 - (K - 1) + j);
  for (int t = t0; t < t1; ++t) out[(i64)t * C + c] = conv_next<K>(wc, win, x[(i64)t * ldx + c]);
  if (blockIdx.y != 0) return;
  float last[K - 1];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) last[j] = conv_row<K>(st, x, ldx, c, T - (K - 1) + j);
#pragma unroll
  for (int j = 0; j < K - 1; ++j) st[j] = last[j];
}

// The gates of rows (prompt chunks): a, b [n, Hv] (row strides lda, ldb); g, beta [n, Hv] contiguous.
// grid = ceil(n·Hv/256), block = 256.
extern "C" __global__ void deltanet_gates(const float* __restrict__ a, i64 lda, const float* __restrict__ b, i64 ldb,
                                          const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                          float* __restrict__ g, float* __restrict__ beta, int Hv, i64 total) {
  PDL_ENTRY;
  const i64 idx = (i64)blockIdx.x * 256 + threadIdx.x;
  if (idx >= total) return;
  const i64 i = idx / Hv;
  const int h = (int)(idx - i * Hv);
  gates_at(a[i * lda + h], b[i * ldb + h], h, a_log, dt_bias, g + idx, beta + idx);
}

// Rows per tile of a prompt chunk: their q̂, k̂, v, e^g and β are staged in shared memory and the norms
// computed in parallel, so the per-token loop reads only shared memory and never waits at a barrier.
constexpr int SCAN_TILE = 16;

#ifndef GN_PER_LANE
#error "deltanet.cu needs GN_PER_LANE: compile it through kernels.launch"
#endif

// A head's D values as a lane's N registers, v[e] = src[lane + 32e] (0 past D): the gated norm's z and w.
template <int N>
DEV void gn_load(const float* __restrict__ src, int D, int lane, float* v) {
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int d = lane + 32 * e;
    v[e] = d < D ? src[d] : 0.0f;
  }
}

// The gated RMSNorm of one head by one warp: y = w ⊙ x·rsqrt(mean x² + eps) ⊙ silu(z), zv and wv from
// gn_load (D <= 32·N). Each lane sums its squares d = lane + 32e in e order, then warp_sum: gated_rmsnorm
// and the scan's NORM build share it, so a head has the same bits from either.
template <int N>
DEV void gn_head(const float* x, const float* zv, const float* wv, float* __restrict__ y, int D, float eps, int lane) {
  float xv[N];
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int d = lane + 32 * e;
    xv[e] = d < D ? x[d] : 0.0f;
    if (d < D) ss = __fadd_rn(ss, __fmul_rn(xv[e], xv[e]));
  }
  ss = warp_sum(ss);
  const float r = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)D), eps));
#pragma unroll
  for (int e = 0; e < N; ++e) {
    const int d = lane + 32 * e;
    if (d < D) y[d] = __fmul_rn(__fmul_rn(__fdiv_rn(xv[e], r), wv[e]), dn_silu(zv[e]));
  }
}

// S ← e^g S and Sᵀk̂ at one thread's R rows of S (the first half of a token's step).
template <int R>
DEV float decay_dot(float* s, float dec, const float* k) {
  float m = 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = __fmul_rn(s[r], dec);
    m = __fmaf_rn(s[r], k[r], m);
  }
  return m;
}

// The gated delta rule over T consecutive rows of each of nseq sequences — decode rows: nseq = n,
// T = 1, one lane each; verify windows: nseq streams of T = W rows (row s·T + t is stream s's
// window row t); a prompt chunk: nseq = 1, T rows of lanes[0] (the recurrent form: the numpy
// twin of a prompt is the chunked form, equal within rounding). The state comes from the lane's
// slot; stride = 0: the state after the last row goes back there; stride > 0 (a verify window): row
// 0's state goes there, and row t >= 1, stepping from row t-1's, writes its update (k̂ [Hv][DK],
// δ [Hv][Dv], e^g [Hv]) to log slot lane + (t-1)·stride of klog, dlog, glog (Cache.logs), from which
// deltanet_keep rebuilds what T one-row steps would leave. Per value head h (key head
// h / (Hv/Hk)), per token: q̂ = l2norm(q)·qscale, k̂ = l2norm(k) (eps 1e-6 inside the root);
// S ← e^g S; δ = β(v − Sᵀk̂); S ← S + k̂ δᵀ; o = Sᵀq̂.
// q, k [rows, Hk, DK] (row strides ldq, ldk; heads contiguous), v [rows, Hv, Dv] (row stride ldv),
// g, beta [rows, Hv] contiguous, state [slots, Hv, DK, Dv], lanes[seq·T] the lane of sequence seq
// (a prompt chunk passes one); out [rows, Hv, Dv].
// grid = (nseq, Hv, ceil(Dv / COLS)), block = G·COLS: G adjacent threads share column j = z·COLS + tid / G
// of S, each keeping DK/G of its rows in registers (pair sums by xor shuffles, the same bits in every
// thread); warp w computes the norms of the tile's rows w, w + warps, ...
// NORM (decode rows, verify windows; COLS >= Dv, so grid z = 1): out is y = gated_rmsnorm(o, z, nw, eps)
// instead of o, z [rows, Hv, Dv] (row stride ldz), nw [Dv]: a tile's o rows are staged in shared memory
// and warp w norms rows w, w + warps, ... with gn_head, gated_rmsnorm's bits. Else COLS = 32
// (kernels/launch_qwen3_5.py SCAN_COLS: columns evolve independently given k̂, β and g, so a head
// spreads over several SMs, each scheduler with few warps).
// A token's arithmetic is the same whatever T, the tile or the grid: decode and prompt rows agree bit for bit.
// A NORM build asks for one block an SM (ptxas would otherwise cap its 64-thread builds at 168 registers
// and spill); the plain builds keep ptxas's own choice.
template <int DK, int G, int COLS, int NORM>
__global__ void __launch_bounds__(G * COLS, NORM ? 1 : 0)
    deltanet_scan(const float* __restrict__ q, i64 ldq, const float* __restrict__ k, i64 ldk,
                  const float* __restrict__ v, i64 ldv, const float* __restrict__ g, const float* __restrict__ beta,
                  float* __restrict__ state, const int* __restrict__ lanes, int slots, float* __restrict__ out, int T,
                  int stride, float* __restrict__ klog, float* __restrict__ dlog, float* __restrict__ glog, int Hk,
                  int Hv, int Dv, float qscale, const float* __restrict__ z, i64 ldz, const float* __restrict__ nw,
                  float eps) {
  // A part's rows sit at stride P (4 floats of padding) so the G parts of a warp read distinct banks.
  constexpr int R = DK / G, P = R + 4, DP = G * P, N = COLS / 32;
  static_assert(COLS % 32 == 0 && (!NORM || N <= GN_PER_LANE), "whole warps; a NORM head within gn_head's registers");
  __shared__ __align__(16) float qs[SCAN_TILE * DP];
  __shared__ __align__(16) float ks[SCAN_TILE * DP];
  // vs: the tile's v columns. NORM: token t's o replaces its v once read (the G parts' reads feed o
  // through the xor shuffles, so they come before part 0's write): the norm's rows at no more memory.
  __shared__ float vs[SCAN_TILE * COLS], ds[SCAN_TILE], bs[SCAN_TILE];
  const int seq = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int c = threadIdx.x / G, part = threadIdx.x % G, j = blockIdx.z * COLS + c;
  const int kh = h / (Hv / Hk);
  const bool on = j < Dv;
  const int lane0 = lanes[(i64)seq * T];
  float* S = state + ((i64)dn_slot(lane0, slots) * Hv + h) * DK * Dv;
  float s[R];
#pragma unroll
  for (int r = 0; r < R; ++r) s[r] = on ? S[(i64)(part * R + r) * Dv + j] : 0.0f;
  // NORM: the weight, and z of the warp's first row (the in-projection's, two launches back), also
  // before the wait, as gated_rmsnorm reads them
  float zv[N], wv[N];
  if constexpr (NORM) {
    gn_load<N>(nw, Dv, lane, wv);
    if (warp < T) gn_load<N>(z + ((i64)seq * T + warp) * ldz + (i64)h * Dv, Dv, lane, zv);
  }
  PDL_ENTRY;  // the state (the last scan's, two kernels back at least) is read; the rows come from the conv
  for (int t0 = 0; t0 < T; t0 += SCAN_TILE) {
    const int nt = min(SCAN_TILE, T - t0);
    const i64 row0 = (i64)seq * T + t0;
    for (int x = threadIdx.x; x < nt * DK; x += blockDim.x) {
      const int t = x / DK, d = x - t * DK, at = t * DP + (d / R) * P + d % R;
      qs[at] = q[(row0 + t) * ldq + (i64)kh * DK + d];
      ks[at] = k[(row0 + t) * ldk + (i64)kh * DK + d];
    }
    for (int x = threadIdx.x; x < nt * COLS; x += blockDim.x) {
      const int t = x / COLS, jj = blockIdx.z * COLS + (x - t * COLS);
      vs[x] = jj < Dv ? v[(row0 + t) * ldv + (i64)h * Dv + jj] : 0.0f;
    }
    for (int t = threadIdx.x; t < nt; t += blockDim.x) {
      ds[t] = expf(g[(row0 + t) * Hv + h]);
      bs[t] = beta[(row0 + t) * Hv + h];
    }
    __syncthreads();
    for (int t = warp; t < nt; t += warps) {  // one warp per row, in place: lane-strided sums, then warp_sum
      float* qr = qs + t * DP;
      float* kr = ks + t * DP;
      float sq = 0.0f, sk = 0.0f;
      for (int d = lane; d < DK; d += 32) {
        const int at = (d / R) * P + d % R;
        sq = __fadd_rn(sq, __fmul_rn(qr[at], qr[at]));
        sk = __fadd_rn(sk, __fmul_rn(kr[at], kr[at]));
      }
      float rq, rk;
      qk_norm_factors(sq, sk, qscale, rq, rk);
      for (int d = lane; d < DK; d += 32) {
        const int at = (d / R) * P + d % R;
        qr[at] = __fmul_rn(qr[at], rq);
        kr[at] = __fmul_rn(kr[at], rk);
      }
    }
    __syncthreads();
    const float* kt = ks + part * P;
    const float* qt = qs + part * P;
    float m = decay_dot<R>(s, on ? ds[0] : 0.0f, kt);
    for (int t = 0; t < nt; ++t) {
#pragma unroll
      for (int o = 1; o < G; o <<= 1) m = __fadd_rn(m, __shfl_xor_sync(FULL_MASK, m, o));
      const float bt = on ? bs[t] : 0.0f;
      const float delta = __fmul_rn(bt, __fsub_rn(vs[t * COLS + c], m));
      const float* kr = kt + t * DP;
      const float* qr = qt + t * DP;
      float o = 0.0f;
      if (t + 1 < nt && stride == 0) {  // the next token's decay and Sᵀk̂ beside this token's Sᵀq̂: two chains
        const float dec = on ? ds[t + 1] : 0.0f;
        const float* kn = kr + DP;
        float mn = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          s[r] = __fmaf_rn(kr[r], delta, s[r]);
          o = __fmaf_rn(s[r], qr[r], o);
          s[r] = __fmul_rn(s[r], dec);
          mn = __fmaf_rn(s[r], kn[r], mn);
        }
        m = mn;
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          s[r] = __fmaf_rn(kr[r], delta, s[r]);
          o = __fmaf_rn(s[r], qr[r], o);
        }
        if (stride != 0) {  // a verify window: row 0's state to the lane's slot, a later row's log; then
                            // the next row's first half
          const int wr = t0 + t;
          if (wr == 0 && on) {
#pragma unroll
            for (int r = 0; r < R; ++r) S[(i64)(part * R + r) * Dv + j] = s[r];
          } else if (wr > 0) {
            const i64 at = ((i64)(wr - 1) * stride + dn_slot(lane0, slots)) * Hv + h;
            if (on && part == 0) dlog[at * Dv + j] = delta;
            if (blockIdx.z == 0) {
              const float* krow = ks + t * DP;  // k̂ of the row, every part
              for (int d = threadIdx.x; d < DK; d += blockDim.x) klog[at * DK + d] = krow[(d / R) * P + d % R];
              if (threadIdx.x == 0) glog[at] = ds[t];
            }
          }
          if (t + 1 < nt) m = decay_dot<R>(s, on ? ds[t + 1] : 0.0f, kr + DP);
        }
      }
#pragma unroll
      for (int x = 1; x < G; x <<= 1) o = __fadd_rn(o, __shfl_xor_sync(FULL_MASK, o, x));
      if (on && part == 0) {
        if constexpr (NORM) {
          vs[t * COLS + c] = o;
        } else {
          out[((row0 + t) * Hv + h) * Dv + j] = o;
        }
      }
    }
    if constexpr (NORM) {
      __syncthreads();  // the tile's o rows are whole
      for (int t = warp; t < nt; t += warps) {
        const i64 i = row0 + t;
        if (t0 + t != warp) gn_load<N>(z + i * ldz + (i64)h * Dv, Dv, lane, zv);  // not the row read before the wait
        gn_head<N>(vs + t * COLS, zv, wv, out + (i * Hv + h) * Dv, Dv, eps, lane);
      }
    }
    __syncthreads();  // the next tile overwrites the staged rows
  }
  if (on && stride == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) S[(i64)(part * R + r) * Dv + j] = s[r];
  }
}

// A verify window's accepted rows first..last replayed onto each layer's lane slot (which holds row
// first - 1's state): per element, the scan's own operations in its order (S ← e^g·S, then
// S ← S + k̂·δ as one fma), so the state has the bits T one-row steps leave. states, klogs, dlogs, glogs: per layer the arrays' addresses (Cache.logs);
// the log of row t at slot + (t-1)·stride. grid = (layers, Hv, ceil(DK·Dv / 256)), block = 256.
extern "C" __global__ void deltanet_keep(const unsigned long long* __restrict__ states,
                                         const unsigned long long* __restrict__ klogs,
                                         const unsigned long long* __restrict__ dlogs,
                                         const unsigned long long* __restrict__ glogs, int slot, int first, int last,
                                         int stride, int Hv, int DK, int Dv) {
  PDL_ENTRY;
  const int layer = blockIdx.x, h = blockIdx.y, e = blockIdx.z * 256 + threadIdx.x;
  if (e >= DK * Dv) return;
  const int d = e / Dv, j = e - d * Dv;
  float* S = (float*)states[layer] + ((i64)slot * Hv + h) * DK * Dv + e;
  const float* kl = (const float*)klogs[layer];
  const float* dl = (const float*)dlogs[layer];
  const float* gl = (const float*)glogs[layer];
  float s = *S;
  for (int t = first; t <= last; ++t) {
    const i64 at = ((i64)(t - 1) * stride + slot) * Hv + h;
    s = __fmul_rn(s, gl[at]);
    s = __fmaf_rn(kl[at * DK + d], dl[at * Dv + j], s);
  }
  *S = s;
}

// y = w ⊙ x·rsqrt(mean x² + eps) ⊙ silu(z) per (row, head) (gn_head): x [n, H, D] contiguous, z [n, H, D]
// with row stride ldz (heads contiguous), w [D], D <= 32·GN_PER_LANE; y [n, H, D]. z (the in-projection's,
// two or more launches back) and w are in registers before the wait, so only x's round trip follows
// it. grid = (n, H), block = 32.
extern "C" __global__ void gated_rmsnorm(const float* __restrict__ x, const float* __restrict__ z, i64 ldz,
                                         const float* __restrict__ w, float* __restrict__ y, int D, float eps) {
  const i64 i = blockIdx.x;
  const int h = blockIdx.y, H = gridDim.y, lane = threadIdx.x;
  float zv[GN_PER_LANE], wv[GN_PER_LANE];
  gn_load<GN_PER_LANE>(z + i * ldz + (i64)h * D, D, lane, zv);
  gn_load<GN_PER_LANE>(w, D, lane, wv);
  PDL_ENTRY;
  gn_head<GN_PER_LANE>(x + (i * H + h) * D, zv, wv, y + (i * H + h) * D, D, eps, lane);
}
