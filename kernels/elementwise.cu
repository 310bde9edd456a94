// Norms, activations and head materialisation. One block per row where a row reduces.
#include "common.cuh"

// Sum over a block of 256 threads in a fixed order: lane butterflies, then warps 0..7 in order.
DEV float block_sum256(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < 8; ++w) s += red[w];
  __syncthreads();
  return s;
}

// y = (x [+ res]) / sqrt(mean((x [+ res])^2) + eps) * w; with res, h = x + res is written too.
// grid = rows, block = 256.
extern "C" __global__ void __launch_bounds__(256) rmsnorm_rows(const float* __restrict__ x, i64 ldx,
                                                               const float* __restrict__ res, i64 ldr,
                                                               const float* __restrict__ w, float* __restrict__ y,
                                                               float* __restrict__ h, int H, float eps) {
  PDL_ENTRY;
  __shared__ float red[8];
  const i64 row = blockIdx.x;
  const float* xr = x + row * ldx;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < H; i += 256) {
    float v = xr[i];
    if (res != nullptr) {
      v = __fadd_rn(v, res[row * ldr + i]);
      h[row * H + i] = v;
    }
    ss = __fadd_rn(ss, __fmul_rn(v, v));
  }
  ss = block_sum256(ss, red);
  const float r = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)H), eps));
  for (int i = threadIdx.x; i < H; i += 256) {
    const float v = res != nullptr ? h[row * H + i] : xr[i];
    y[row * H + i] = __fmul_rn(__fdiv_rn(v, r), w[i]);
  }
}

// out[n, j] = silu(g[n, j]) * u[n, j] (mode 0) or x * sigmoid(gate) (mode 1). grid = (n, ceil(J/256)).
extern "C" __global__ void gate_rows(const float* __restrict__ a, i64 lda, const float* __restrict__ b, i64 ldb,
                                     float* __restrict__ out, int J, int mode) {
  PDL_ENTRY;
  const int j = blockIdx.y * 256 + threadIdx.x;
  if (j >= J) return;
  const i64 n = blockIdx.x;
  const float av = a[n * lda + j], bv = b[n * ldb + j];
  out[n * J + j] = mode == 0 ? silu_mul_f(av, bv) : __fdiv_rn(av, __fadd_rn(1.0f, expf(-bv)));
}

// RoPE's (cos, sin) of n rows: cs[row][i] = (float)cos / sin of (double)pos[row] * inv[i], numpy's
// float64 angle and functions rounded to float once. grid = ceil(n * half / 256), block = 256.
extern "C" __global__ void rope_rows(const int* __restrict__ pos, const double* __restrict__ inv, int half, int n,
                                     float2* __restrict__ cs) {
  PDL_ENTRY;
  const i64 e = (i64)blockIdx.x * 256 + threadIdx.x;
  if (e >= (i64)n * half) return;
  const int row = (int)(e / half), i = (int)(e % half);
  const double ang = (double)pos[row] * inv[i];
  cs[e] = make_float2((float)cos(ang), (float)sin(ang));
}

// Heads with their lazy ops (q/k norm, RoPE) written out: out [n, heads, D] contiguous.
// grid = (n, heads), block = 32.
extern "C" __global__ void heads_out(const float* __restrict__ x, i64 s0, i64 s1, int D,
                                     const float* __restrict__ nw, float eps, const float2* __restrict__ cs,
                                     int half, float* __restrict__ out) {
  PDL_ENTRY;
  __shared__ float buf[1024];
  const int row = blockIdx.x, head = blockIdx.y, heads = gridDim.y, lane = threadIdx.x;
  load_head(buf, x, (i64)row * s0 + (i64)head * s1, D, nw, eps, rope_row(cs, row, half), half, lane);
  for (int d = lane; d < D; d += 32) out[((i64)row * heads + head) * D + d] = buf[d];
}

// dst[a] slot dslot[j] = src[a] slot sslot[j] for every array a of a table and slot pair j (floats, size[a] a
// slot): the recurrent slots of many layers set aside or put back in one launch, not one copy an array.
// grid = (blocks a slot, pairs, arrays), block = 256.
extern "C" __global__ void __launch_bounds__(256) copy_slots(const u64* __restrict__ src, const u64* __restrict__ dst,
                                                            const i64* __restrict__ size, const int* __restrict__ sslot,
                                                            const int* __restrict__ dslot) {
  PDL_ENTRY;
  const int j = blockIdx.y, a = blockIdx.z;
  const i64 n = size[a], step = (i64)gridDim.x * 256;
  const float* s = (const float*)src[a] + sslot[j] * n;
  float* d = (float*)dst[a] + dslot[j] * n;
  if ((n & 3) == 0) {  // whole float4s (slots of a multiple of 4 floats are 16-byte aligned)
    for (i64 i = (i64)blockIdx.x * 256 + threadIdx.x; i < n >> 2; i += step) ((float4*)d)[i] = ((const float4*)s)[i];
  } else {
    for (i64 i = (i64)blockIdx.x * 256 + threadIdx.x; i < n; i += step) d[i] = s[i];
  }
}

// The tokens one decode graph chose fed into the next one's inputs d (tokens [B], positions [B], lanes
// [B], ...): a row flagged in its token slot whose token ends its stream (one of ends[0..ne)) gets lane
// -1, so it steps no recurrent state past the stream's end (run-ahead decode). grid = ceil(n / 256).
extern "C" __global__ void __launch_bounds__(256) feed_rows(const int* __restrict__ fed, int* __restrict__ d,
                                                           int B, int n, const int* __restrict__ ends, int ne) {
  PDL_ENTRY;
  const int i = blockIdx.x * 256 + threadIdx.x;
  if (i >= n) return;
  const int t = fed[i];
  bool end = false;
  if (d[i] != 0)
    for (int e = 0; e < ne; ++e) end |= t == ends[e];
  d[i] = t;
  if (end) d[2 * B + i] = -1;
}
