// Shared helpers of Lanechat's kernels. No CUDA headers: NVRTC compiles these as they are, for the
// running device (sm_90 H200, sm_121 GB10). bf16 travels as raw 16-bit words, fp8 e4m3 as bytes.
//
// Exactness notes: where a kernel must reproduce the numpy reference bit for bit (embedding,
// RoPE, RMSNorm of heads, KV encoding) it uses the *_rn intrinsics, which the compiler never fuses
// into FMAs. Everywhere else the arithmetic only has to be the same for every row and batch.
#pragma once

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef long long i64;
typedef unsigned long long u64;

#define DEV __device__ __forceinline__
#define FULL_MASK 0xffffffffu

// Programmatic dependent launch (sm_90+; a no-op where the launch did not ask for it). A kernel a
// graph launches this way is resident before the one ahead of it ends. PDL_ENTRY waits for that
// kernel's writes, then lets the next kernel launch: at most two grids overlap, and every read of
// the previous kernel's outputs and every write still follows it. Every kernel runs it before its
// first such access (tests/test_kernels_pdl.py checks that each one has it). Only reads of what the
// kernel just before does not write may come first: weights, host-written tables, caches and states
// written two or more kernels back (the kernel before waited for those to finish before this one
// could launch).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#ifdef LANECHAT_TRACE
// bench --trace (kernels/trace.py): the first block stamps the time its wait returned, the launch
// ahead of it having ended, at the next slot of the host's buffer ([0] counts them).
extern "C" {
__device__ u64* lc_trace;
}
DEV void trace_stamp() {
  if ((threadIdx.x | threadIdx.y | threadIdx.z | blockIdx.x | blockIdx.y | blockIdx.z) == 0 && lc_trace) {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    lc_trace[1 + atomicAdd(lc_trace, 1ull)] = t;
  }
}
#else
DEV void trace_stamp() {}
#endif
#define PDL_ENTRY                                                                           \
  do {                                                                                      \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory"); \
    trace_stamp();                                                                          \
  } while (0)
#else
#define PDL_ENTRY ((void)0)
#endif

// A 128-byte line of global memory fetched into L2 ahead of its loads (no register waits for it).
DEV void l2_prefetch(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// --- 16-bit floats --------------------------------------------------------------------------
DEV float bf16_to_f32(u32 h) { return __uint_as_float((h & 0xffffu) << 16); }

// Round to nearest even, like ml_dtypes' float32 -> bfloat16.
DEV u16 f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return (u16)((u >> 16) | ((u & 0xffffu) ? 0x40u : 0u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

DEV float f16_to_f32(u32 h) {
  float f;
  unsigned short hs = (unsigned short)(h & 0xffffu);
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hs));
  return f;
}

// Two floats -> bf16x2 (lo in the low half), round to nearest even.
DEV u32 pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// x0, x1 as bf16 hi + lo (16 bits of mantissa between them): two MMAs give near-fp32 products.
DEV void split_bf16(float x0, float x1, u32& hi, u32& lo) {
  hi = pack_bf16x2(x0, x1);
  float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
  lo = pack_bf16x2(x0 - h0, x1 - h1);
}

// Two floats -> fp16x2 (lo in the low half), round to nearest even.
DEV u32 f16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// --- tensor cores: D[16x8] += A[16x16] B[16x8], bf16 (mma_bf16) or fp16 (mma_f16) in, fp32 accumulate
#define MMA_16816(NAME, T)                                                                         \
  DEV void NAME(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {                        \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0,%1,%2,%3}, "            \
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"                                        \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                  \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                          \
  }
MMA_16816(mma_bf16, "bf16")
MMA_16816(mma_f16, "f16")

DEV u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// 16 bytes global -> shared without registers; the zero-filling form copies `bytes` (0 or 16) and
// zeroes the rest (rows past a block's last).
DEV void cp_async16(u32 dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
DEV void cp_async16z(u32 dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
DEV void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
DEV void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
DEV void cp_async_commit_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

// Arrival at a reduction across blocks: `add` to *counter; true in every thread of the block that
// brings it to `last_at` + add. The barrier orders the block's writes before thread 0's atomic,
// whose release half publishes them all (release is cumulative; CUTLASS's split-K semaphore does
// the same) and whose acquire half lets the last block, after the barrier below, read the other
// blocks' writes (through L2: __ldcg). One acq_rel atomic a block, no sequentially consistent fence.
DEV bool arrive_last(int* counter, int add, int last_at, int* flag) {
  __syncthreads();
  if (threadIdx.x == 0) {
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;"
                 : "=r"(old) : "l"(counter), "r"(add) : "memory");
    *flag = old == last_at;
  }
  __syncthreads();
  return *flag;
}

// Four 8x8 b16 matrices from shared memory (lane i gives the address of row i % 8 of matrix i / 8);
// .trans hands each thread columns instead of rows.
DEV void ldsm4(u32* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
DEV void ldsm4t(u32* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// --- fp8 e4m3 (the "fn" variant: no infinities, max 448) -----------------------------------
DEV u8 f32_to_fp8(float f) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
  return (u8)(r & 0xffu);
}

DEV float fp8_to_f32(u32 v) {
  u32 s = (v & 0x80u) << 24, e = (v >> 3) & 0xfu, m = v & 7u;
  float r = e == 0u ? (float)m * 0.001953125f : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return __uint_as_float(__float_as_uint(r) | s);
}

// A stored K/V element (bf16 raw or fp8 byte) as float, before its fp8 scale.
template <int KV8>
DEV float kv_elem(const void* base, i64 i) {
  if (KV8) return fp8_to_f32(((const u8*)base)[i]);
  return bf16_to_f32(((const u16*)base)[i]);
}

// --- scales and biases of affine weights, stored as (scale, bias) pairs ---------------------
// ST: 0 = fp16 pair in one word, 1 = bf16 pair in one word, 2 = fp32 pair.
DEV void load_sb(const void* sb, int st, i64 idx, float& s, float& b) {
  if (st == 2) {
    float2 v = ((const float2*)sb)[idx];
    s = v.x; b = v.y;
  } else {
    u32 w = ((const u32*)sb)[idx];
    if (st == 0) { s = f16_to_f32(w); b = f16_to_f32(w >> 16); }
    else { s = bf16_to_f32(w); b = bf16_to_f32(w >> 16); }
  }
}

// --- warp reductions (butterflies: every lane ends with the same bits) ----------------------
DEV float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

// The DeltaNet's q/k L2-norm factors from a warp's partial square sums: rq = qscale / |q|, rk = 1 / |k|
// (eps 1e-6 under the root; the scan and the chunked prompt form share them, so their bits).
DEV void qk_norm_factors(float sq, float sk, float qscale, float& rq, float& rk) {
  sq = warp_sum(sq);
  sk = warp_sum(sk);
  rq = __fdiv_rn(qscale, __fsqrt_rn(__fadd_rn(sq, 1e-6f)));
  rk = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(sk, 1e-6f)));
}

DEV float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
  return v;
}

// The argmax order: a larger value wins, a tie goes to the lower index (numpy's argmax, and the
// stable top-k of the MoE router).
DEV bool argmax_beats(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// Each lane's (value, index) candidate -> the warp's best by `argmax_beats`, in every lane.
DEV void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(FULL_MASK, v, o);
    const int oi = __shfl_xor_sync(FULL_MASK, i, o);
    if (argmax_beats(ov, oi, v, i)) { v = ov; i = oi; }
  }
}

DEV float silu_mul_f(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// A position's flat cache slot through its row's page table (windows and pages alike).
DEV i64 slot_of(const int* __restrict__ tab, int p, int pt) { return (i64)tab[p / pt] * pt + (p % pt); }

// Row `row`'s (cos, sin) pairs of a [rows][half] RoPE table, or none.
DEV const float2* rope_row(const float2* __restrict__ cs, int row, int half) {
  return cs != nullptr ? cs + (i64)row * half : nullptr;
}

// --- one head vector, with the lazy per-head ops applied --------------------------------------
// One warp loads x[off .. off+D) into dst (shared memory), then optionally RMS-normalises it with
// nw (q/k norm) and applies NeoX RoPE on the first 2*half dims with the row's (cos, sin) pairs cs
// (rope_rows: float64 angles as numpy computes them, made once per forward, not once per block).
DEV void load_head(float* dst, const float* __restrict__ x, i64 off, int D,
                   const float* __restrict__ nw, float eps, const float2* __restrict__ cs, int half,
                   int lane) {
  for (int d = lane; d < D; d += 32) dst[d] = x[off + d];
  __syncwarp();
  if (nw != nullptr) {
    float ss = 0.0f;
    for (int d = lane; d < D; d += 32) ss = __fadd_rn(ss, __fmul_rn(dst[d], dst[d]));
    ss = warp_sum(ss);
    float r = __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)D), eps));
    __syncwarp();
    for (int d = lane; d < D; d += 32) dst[d] = __fmul_rn(__fdiv_rn(dst[d], r), nw[d]);
    __syncwarp();
  }
  if (cs != nullptr) {
    for (int i = lane; i < half; i += 32) {
      const float2 r = cs[i];
      const float c = r.x, s = r.y;
      float a = dst[i], b = dst[i + half];
      dst[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      dst[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    }
    __syncwarp();
  }
}
