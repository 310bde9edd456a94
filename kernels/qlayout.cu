// The repacked weight layout of gemv.cu (its header describes it): repacking canonical MLX-style
// packed words at load, reading single codes back (embedding rows, full dequantization), and random
// words for synthetic weights.
#include "common.cuh"

// --- load-time repacking of canonical MLX-style packed words --------------------------------
extern "C" __global__ void repack4(const u32* __restrict__ src, int M, int K, int Sp, u32* __restrict__ dst,
                                   i64 total) {
  PDL_ENTRY;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int S = K / 32, Sp2 = Sp / 2;
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

extern "C" __global__ void repack8(const u32* __restrict__ src, int M, int K, int Sp, u32* __restrict__ dst,
                                   i64 total) {
  PDL_ENTRY;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int S = K / 32;
  const int e = (int)(idx & 3), lane = (int)((idx >> 2) & 31);
  const i64 rest = idx >> 7;
  const int s = (int)(rest % Sp);
  const i64 T = rest / Sp;
  const int g = lane >> 2, t = lane & 3, half = e >> 1, st = e & 1;
  const i64 m = T * 16 + g + 8 * half;
  u32 out = 0u;
  if (m < M && s < S) {
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
DEV u32 code_at(const u32* __restrict__ codes, i64 m, int k, int Sp) {
  const i64 T = m / 16;
  const int r = (int)(m % 16), g = r & 7, half = r >> 3;
  const int s = k / 32, t = (k % 32) / 8, j = k % 8;
  const int lane = g * 4 + t;
  if (BITS == 4) {
    const u32 w = codes[((T * (Sp / 2) + s / 2) * 32 + lane) * 4 + (s & 1) * 2 + half];
    const int p = (j >> 1) + 4 * (j & 1);
    return (w >> (4 * p)) & 0xfu;
  }
  const int st = j >> 2, jj = j & 3;
  const u32 w = codes[((T * Sp + s) * 32 + lane) * 4 + half * 2 + st];
  const int lp = (jj >> 1) + 4 * (jj & 1);
  return ((w >> (4 * lp)) & 0xfu) | (((w >> (4 * (lp + 2))) & 0xfu) << 4);
}

// Embedding rows of an affine table: out[n, k] = q * s + b in float32, exactly as numpy.
// grid = (n, ceil(K / 256)), block = 256.
template <int BITS>
__global__ void embed_q(const int* __restrict__ ids, const u32* __restrict__ codes, const void* __restrict__ sb,
                        int st_, int K, int Sp, int NG, int G, float* __restrict__ out) {
  PDL_ENTRY;
  const int k = blockIdx.y * 256 + threadIdx.x;
  if (k >= K) return;
  const i64 m = ids[blockIdx.x];
  const u32 q = code_at<BITS>(codes, m, k, Sp);
  float s, b;
  load_sb(sb, st_, ((m / 16) * NG + k / G) * 16 + (m % 16), s, b);
  out[(i64)blockIdx.x * K + k] = __fadd_rn(__fmul_rn((float)q, s), b);
}

extern "C" __global__ void embed_dense(const int* __restrict__ ids, const float* __restrict__ table, int K,
                                       float* __restrict__ out) {
  PDL_ENTRY;
  const int k = blockIdx.y * 256 + threadIdx.x;
  if (k >= K) return;
  out[(i64)blockIdx.x * K + k] = table[(i64)ids[blockIdx.x] * K + k];
}

// Full dequantization (tests and the rare consumer that wants a float matrix).
template <int BITS>
__global__ void dequant(const u32* __restrict__ codes, const void* __restrict__ sb, int st_, int M, int K, int Sp, int NG,
                        int G, float* __restrict__ out) {
  PDL_ENTRY;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (i64)M * K) return;
  const i64 m = idx / K;
  const int k = (int)(idx % K);
  const u32 q = code_at<BITS>(codes, m, k, Sp);
  float s, b;
  load_sb(sb, st_, ((m / 16) * NG + k / G) * 16 + (m % 16), s, b);
  out[idx] = __fadd_rn(__fmul_rn((float)q, s), b);
}

// Random words for synthetic weights (splitmix64 of seed and index): no host round trip.
extern "C" __global__ void fill_random_u32(u32* __restrict__ out, i64 n, u64 seed) {
  PDL_ENTRY;
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  u64 z = seed + 0x9E3779B97F4A7C15ull * (u64)(i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  out[i] = (u32)(z >> 16);
}
