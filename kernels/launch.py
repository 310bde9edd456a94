"""Launchers: grid shapes and argument lists of the kernels in this folder. CuPy arrays in, CuPy
arrays out; no semantics beyond the kernels' own (the backend in engine/ops/cupy_backend.py keeps
those). Scalars go as fixed-width numpy types, null pointers as 0.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import function

CHUNK = 64  # absolute key positions per decode-attention block: the one value (attention.cu gets -DCHUNK)
GROUP = 16  # chunks merged together before the groups are: the one value (attention.cu gets -DGROUP)
# NVRTC options per source file (kernels.file_options): the constants above, compiled in.
QG_STAGES = 3  # qgemm's cp.async pipeline depth: the one value (qgemm.cu gets -DQG_STAGES)
GN_PER_LANE = 8  # gated_rmsnorm's values a lane: heads up to 32 x this (deltanet.cu gets -DGN_PER_LANE)
FILE_OPTIONS = {"attention.cu": ("-DCHUNK=%d" % CHUNK, "-DGROUP=%d" % GROUP),
                "qgemm.cu": ("-DQG_STAGES=%d" % QG_STAGES,),
                "deltanet.cu": ("-DGN_PER_LANE=%d" % GN_PER_LANE,)}
NULL = np.uint64(0)

i32, i64, f32 = np.int32, np.int64, np.float32


def _ptr(a):
    return NULL if a is None else a


# --- gemv.cu --------------------------------------------------------------------------------
def padded_subgroups(K: int) -> int:
    """Sp: K's 32-input subgroups rounded up to whole qmv batches (gemv.cu)."""
    return -(-(K // 32) // 16) * 16


def repack(packed, bits: int, M: int, K: int, Mp: int):
    """Canonical uint32 codes [M, K*bits/32] -> the tile layout of qmv (rows padded to Mp, inputs
    to padded_subgroups(K) x 32, zero codes in the padding)."""
    import cupy
    Sp = padded_subgroups(K)
    total = (Mp // 16) * Sp * 32 * (2 if bits == 4 else 4)
    out = cupy.empty(total, cupy.uint32)
    f = function("qlayout.cu", "repack4" if bits == 4 else "repack8")
    f(((total + 255) // 256,), (256,), (packed, i32(M), i32(K), i32(Sp), out, i64(total)))
    return out


TM_ROWS = 64  # weights pad to a multiple of this many rows (whole 16-row tiles, aligned scale blocks)
QMV_BATCH = 512  # inputs a segment holds a whole number of
QMV_BITS = (4, 8)  # code widths of qmv, embed_q and dequant
QMV_GROUPS = (32, 64, 128)  # quantization group sizes qmv takes (whole 32-wide subgroups)
QMV_TILES = (0, 1, 2, 4)  # 8-row n-tiles per block (0: up to 4 rows packed), picked by row count in qmv()
QMV_SCALES = (0, 1, 2)  # scale types: fp16, bf16, fp32 pairs
QMV_INPUTS = (0, 1, 2)  # xm: x, silu(x) * x2, rmsnorm(x [+ x2]) * nw (the expert builds too: down, gate_up)
QMV_EXPERT_TILES = (0, 2)  # expert products: up to 4 rows an expert packed, or 16
QMV_COMBINE_ROWS = 2  # the most rows whose products sum the experts' combination as they stage (XM 3)
QMV_EARLY_INPUTS = (0, 1)  # xm of the early expert builds (EX 2: down's inputs, never a staged norm)
_counters = {}


QMV_BLOCKS = 264  # blocks a product's segments aim for: 2 an SM of an H200 (a constant, not the device's)


def qmv_split(M: int, K: int) -> tuple[int, int]:
    """(KS inputs per segment, P segments) of an [M, K] weight: the most segments that keep its blocks
    (128 rows x one segment) within QMV_BLOCKS, from the shape alone, so a row's bits never depend on
    the row count or the device. A second wave or a reduction costs more than a block's length: the
    8B's gate_up (224 row blocks) runs 20.6 µs as one segment, 23.7 as two (H200)."""
    nbat = -(-K // QMV_BATCH)
    P = max(1, min(nbat, QMV_BLOCKS // -(-M // 128)))
    KS = -(-nbat // P) * QMV_BATCH
    return KS, -(-K // KS)


@lru_cache(maxsize=None)
def sm_count() -> int:
    import cupy
    return int(cupy.cuda.Device().attributes["MultiProcessorCount"])


def qmv_min_blocks(blocks: int, sms: int) -> int:
    """qmv's blocks an SM, 2 or 3: 3 where it takes fewer waves of `sms` SMs (the 27B's 272-block
    gate_up: 2 waves at 2 an SM on an H200's 132, 1 at 3), else 2 (a block runs faster at 128
    registers than at 85). Registers only: the bits are the same."""
    waves = [-(-blocks // (sms * m)) for m in (2, 3)]
    return 3 if waves[1] < waves[0] else 2


def qmv_counters(n: int):
    """Zeroed arrival counters of the reductions across blocks (qmv segments, attention chunks): the
    last block of each reduction resets its own, so one array serves every launch of the stream
    (one array a stream: launches of two streams may run at once)."""
    import cupy
    key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr)
    c = _counters.get(key)
    if c is None or c.size < n:
        c = _counters[key] = cupy.zeros(max(n, 1 << 16), cupy.int32)
    return c


def qmv_splits_x(nrows: int, M: int, K: int, xm: int) -> bool:
    """Whether qmv splits x once for all its blocks (qmv_xsplit) rather than in every block: 4+ rows
    where the blocks stage much (not the 8B's o, 32 row blocks x 4,096, nor the 27B's in_proj)."""
    return nrows >= 4 and (xm == 1 or -(-M // 128) * K >= 3 << 18)


def qmv_splits_out(nrows: int, M: int, K: int, group: int, group2: int) -> bool:
    """Whether qmv can write the split input of a norm-staged next product (`split_out`): the last
    block of each 128 columns has the reduced rows, so K must be in 2+ segments; 4-16 rows (where the
    next product splits its input once, and that block's serial split stays short; measured at 8);
    the next product's groups the same size."""
    return 4 <= nrows <= 16 and qmv_split(M, K)[1] > 1 and group == group2 and M % 8 == 0


def qmv_combines(nrows: int, M: int, K: int, sms: int) -> bool:
    """Whether qmv's blocks sum the experts' combination as they stage a norm's input (`combine`, the XM 3
    builds): 1-2 rows (each block loads every expert row of its inputs), where the grid stages little
    (not an lm_head's) and runs 2 blocks an SM on `sms` SMs (at 3 the staging's rows spill)."""
    mblocks, P = -(-M // 128), qmv_split(M, K)[1]
    return nrows <= QMV_COMBINE_ROWS and mblocks * K < 3 << 18 and qmv_min_blocks(mblocks * P, sms) == 2


def qmv(codes, sb, st: int, bits: int, group: int, M: int, K: int, x, ldx: int, y, nrows: int, xm: int = 0,
        x2=None, ldx2: int = 0, nw=None, eps: float = 0.0, hout=None, ldh: int = 0, min_blocks: int = 0,
        split_x: bool | None = None, pieces=None, split_out=None, combine=None):
    """y[:nrows, :M] = f(x) @ W^T for repacked W, with f by xm: 0 x; 1 silu(x) * x2;
    2 rmsnorm(x [+ x2]) * nw (h = x + x2 written to hout when given). min_blocks: 2 or 3 blocks an SM
    where both are compiled (4-bit, up to 8 rows), 0 for the one with fewer waves (qmv_min_blocks).
    split_x: f(x) split once by qmv_xsplit or staged by every block (the same bits); None picks by shape.
    pieces: f(x) already split (xsplit_buffers, written by a product's split_out). split_out: (pieces,
    res, ldres, nw2, h, ldh2): also write the next product's input split, rmsnorm(y + res) * nw2 with
    h = y + res to h, as qmv_xsplit would (qmv_splits_out says where it can). combine: (weights
    [nrows, k], k) with xm 2: x2 is the experts' rows [nrows·k, ldx2] and a row's x2 their combination,
    moe_combine's (qmv_combines says where)."""
    nt = 0 if nrows <= 4 else (1 if nrows <= 8 else (2 if nrows <= 16 else 4))  # 0: up to 4 rows packed
    R = 8 * nt if nt else 4
    KS, P = qmv_split(M, K)
    if split_out is not None and not qmv_splits_out(nrows, M, K, group, group):
        raise ValueError(f"qmv cannot split its output for {nrows} rows of [{M}, {K}]")
    if combine is not None and (xm != 2 or x2 is None or pieces is not None or split_x or min_blocks == 3
                                or not qmv_combines(nrows, M, K, sm_count())):
        raise ValueError(f"qmv cannot stage the experts' combination for {nrows} rows of [{M}, {K}]")
    import cupy
    Mp = -(-M // TM_ROWS) * TM_ROWS
    mblocks, slices = -(-M // 128), -(-nrows // R)
    if P > 1:
        part = cupy.empty(slices * P * R * Mp, cupy.float32)
        sspart = cupy.empty(slices * mblocks * P * R, cupy.float32) if xm == 2 else None
        counters = qmv_counters(slices * mblocks)
    else:
        part = sspart = counters = None
    minb = (min_blocks or qmv_min_blocks(mblocks * P * slices, sm_count())) if bits == 4 and nt <= 1 else 2
    Sp = padded_subgroups(K)
    xs = sx = sq = None
    if pieces is not None:
        xs, sx, sq = pieces
        hout = None
    elif combine is None and (split_x if split_x is not None else qmv_splits_x(nrows, M, K, xm)):
        xs, sx, sq = qmv_xsplit(x, ldx, nrows, K, group, xm, x2, ldx2, nw, hout, ldh)
        hout = None
    (xo, sxo, sqo), res, ldres, nw2, h2, ldh2 = split_out or ((None, None, None), None, 0, None, None, 0)
    kxm = 3 if combine is not None else xm  # the build that sums the combination as it stages
    f = function("gemv.cu", "qmv<%d, %d, %d, %d, %d, 0, %d>" % (bits, group // 32, nt, kxm, st, minb))
    f((mblocks, P, slices), (256,),
      (codes, sb, i32(st), x, _ptr(x2), i64(ldx), i64(ldx2), _ptr(nw), f32(eps), _ptr(hout), i64(ldh), y,
       i64(y.shape[1]), i32(nrows), i32(M), i32(Mp), i32(K), i32(Sp), i32(KS), _ptr(part),
       _ptr(sspart), _ptr(counters), NULL, i32(1), i64(0), i64(0), _ptr(xs), _ptr(sx), _ptr(sq),
       _ptr(xo), _ptr(sxo), _ptr(sqo), _ptr(res), i64(ldres), _ptr(nw2), _ptr(h2), i64(ldh2),
       *((NULL, i32(0)) if combine is None else (combine[0], i32(combine[1])))))


def xsplit_buffers(nrows: int, K: int, group: int, xm: int):
    """(pieces, group sums, sums of squares or None) for nrows split rows of K inputs (qmv_xsplit's)."""
    import cupy
    Sp = padded_subgroups(K)
    return (cupy.empty(nrows * 2 * Sp * 4 * 4, cupy.uint32), cupy.empty(nrows * Sp // (group // 32), cupy.float32),
            cupy.empty(nrows * Sp // 2, cupy.float32) if xm == 2 else None)


def qmv_xsplit(x, ldx: int, nrows: int, K: int, group: int, xm: int, x2=None, ldx2: int = 0, nw=None, hout=None,
               ldh: int = 0):
    """x's rows as qmv stages them, once for all its blocks: (bf16 hi/lo pieces, group sums, 64-input
    sums of squares or None); h = x + x2 goes to hout here (xm 2)."""
    Sp = padded_subgroups(K)
    xs, sx, sq = xsplit_buffers(nrows, K, group, xm)
    f = function("gemv.cu", "qmv_xsplit<%d, %d>" % (xm, group // 32))
    f((-(-Sp // 64), nrows), (256,), (x, _ptr(x2), i64(ldx), i64(ldx2), _ptr(nw), _ptr(hout), i64(ldh), i32(K), i32(Sp),
                                  xs, sx, _ptr(sq)))
    return xs, sx, sq


# --- qgemm.cu --------------------------------------------------------------------------------
QG_ROWS = 128  # x rows and weight rows of a qgemm block (QG_BN, QG_BM)
QG_BLOCKS = 128  # blocks a product's segments aim to fill (a constant: bits never depend on the device)
QG_SCALE_WORDS = {0: 1, 1: 1, 2: 2}  # words of a (scale, bias) pair by scale type


def qgemm_split(M: int, K: int, chunk: int) -> tuple[int, int]:
    """(KB 64-input stages per segment, P segments) of an [M, K] weight for prompt chunks of `chunk`
    rows: from the shapes and the chunk setting alone, never the row count of one chunk."""
    kbl = padded_subgroups(K) // 2
    blocks = -(-M // QG_ROWS) * -(-chunk // QG_ROWS)
    P = max(1, min(kbl // 8, QG_BLOCKS // blocks))
    KB = -(-kbl // P)
    return KB, -(-kbl // KB)


def qgemm_smem(group: int, st: int) -> int:
    ng = 2 if group == 32 else 1
    return QG_STAGES * (QG_ROWS * 64 * 2 + 8 * 32 * 16 + 8 * ng * 16 * QG_SCALE_WORDS[st] * 4)


def _qgemm_stage(x, ldx: int, K: int, nrows: int, xm: int, x2, ldx2: int, nw, eps: float, hout, ldh: int):
    """(xs, rf): the x rows staged once as fp16 with power-of-two scales, and the row factors."""
    import cupy
    Sp = padded_subgroups(K)
    xs = cupy.empty((nrows, Sp * 16), cupy.uint32)
    rf = cupy.empty((nrows, 2), cupy.float32)
    function("qgemm.cu", "qgemm_stage<%d>" % xm)(
        (nrows,), (256,), (x, i64(ldx), _ptr(x2), i64(ldx2), _ptr(nw), f32(eps), _ptr(hout), i64(ldh), i32(K),
                           i32(Sp * 32), xs, rf))
    return xs, rf


def _qgemm_scale(part, P: int, nrows: int, M: int, rf, y):
    function("qgemm.cu", "qgemm_reduce")((-(-M // 256), nrows), (256,),
                                         (part, i32(P), i32(nrows), i32(M), rf, y, i64(y.shape[1])))


def qgemm(codes, sb, st: int, group: int, M: int, K: int, x, ldx: int, y, nrows: int, chunk: int, xm: int = 0,
          x2=None, ldx2: int = 0, nw=None, eps: float = 0.0, hout=None, ldh: int = 0):
    """y[:nrows, :M] = f(x) @ W^T for repacked 4-bit W on tensor cores (prompt chunks of `chunk`
    rows), with f by xm as in qmv; x staged once as fp16 rows with power-of-two scales."""
    import cupy
    xs, rf = _qgemm_stage(x, ldx, K, nrows, xm, x2, ldx2, nw, eps, hout, ldh)
    KB, P = qgemm_split(M, K, chunk)
    part = cupy.empty(P * nrows * M, cupy.float32) if P > 1 else None
    f = function("qgemm.cu", "qgemm<%d, %d>" % (group // 32, st))
    smem = qgemm_smem(group, st)
    f.allow_smem(smem)
    f((-(-M // QG_ROWS), -(-nrows // QG_ROWS), P), (256,),
      (codes, sb, xs, rf, y, i64(y.shape[1]), _ptr(part), i32(nrows), i32(M), i32(padded_subgroups(K)), i32(KB)),
      shared_mem=smem)
    if P > 1:
        _qgemm_scale(part, P, nrows, M, rf, y)


# Prompt products through cuBLAS: the weight dequantized to fp16 (qgemm's rounding) and a library GEMM
# with fp32 sums. Its kernels' split of K follows the row count, so a row's bits depend on the row and
# the chunk's row count -- a function of the prompt, as prompt chunks start at fixed multiples.
# Fewer rows read the weight once through qgemm: below ~256 rows the fp16 copy and cuBLAS's fixed cost
# lose on small products (H200, per product: 35B-A3B in_proj at 128 rows 57 µs against 109).
CUBLAS_MIN_ROWS = 256


def cublas_prompt_products(capability: str, integrated: bool) -> bool:
    """Whether prompt products go through cuBLAS: on discrete Hopper / datacenter Blackwell, whose
    cuBLAS runs wgmma / tcgen05 kernels at ~3x qgemm's mma.sync (docs/perf-notes.md); elsewhere the
    fp16 copy of each weight costs more than it saves (a GB10's 273 GB/s, GeForce's fp32 sums)."""
    return not integrated and capability[:-1] in ("9", "10")


def qgemm_dequant(codes, sb, st: int, group: int, M: int, K: int, w16):
    """w16[:M * Kp] (fp16 as uint16, rows of Kp = padded_subgroups(K) * 32) = the 4-bit weight as
    qgemm rounds it."""
    Sp = padded_subgroups(K)
    words = -(-M // 16) * Sp * 32 * 2
    function("qgemm.cu", "qgemm_dequant<%d, %d>" % (group // 32, st))(
        ((words + 255) // 256,), (256,), (codes, sb, i32(M), i32(Sp), i64(words), w16))


def qgemm_cublas(codes, sb, st: int, group: int, M: int, K: int, x, ldx: int, y, nrows: int, w16, xm: int = 0,
                 x2=None, ldx2: int = 0, nw=None, eps: float = 0.0, hout=None, ldh: int = 0):
    """qgemm's product (the same staging, weights and row factors) as dequantization into `w16` (at
    least M x Kp fp16) and cuBLAS gemmEx (fp16 in, fp32 sums)."""
    import cupy
    from cupy.cuda import cublas
    xs, rf = _qgemm_stage(x, ldx, K, nrows, xm, x2, ldx2, nw, eps, hout, ldh)
    qgemm_dequant(codes, sb, st, group, M, K, w16)
    Kp = padded_subgroups(K) * 32
    part = cupy.empty((nrows, M), cupy.float32)
    h = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(h, cupy.cuda.get_current_stream().ptr)
    cublas.setPointerMode(h, cublas.CUBLAS_POINTER_MODE_HOST)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    # column-major: part^T [M, n] = W [M, K] (row-major [M, Kp], op T) @ xs^T [K, n] (row-major [n, Kp])
    cublas.gemmEx(h, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, M, nrows, K, one.ctypes.data, w16.data.ptr, _R16F, Kp,
                  xs.data.ptr, _R16F, Kp, zero.ctypes.data, part.data.ptr, _R32F, M, cublas.CUBLAS_COMPUTE_32F,
                  _GEMM_DEFAULT)
    _qgemm_scale(part, 1, nrows, M, rf, y)


_R16F, _R32F, _GEMM_DEFAULT = 2, 0, -1  # cudaDataType CUDA_R_16F / CUDA_R_32F, CUBLAS_GEMM_DEFAULT


def dense_gemv(W, M: int, K: int, x, x2, ldx: int, xm: int, y, nrows: int):
    f = function("gemv.cu", "dense_gemv")
    f(((M + 7) // 8,), (256,), (W, i32(M), i32(K), x, _ptr(x2), i64(ldx), i32(xm), y, i64(y.shape[1]), i32(nrows)))


def embed_q(ids, codes, sb, st: int, bits: int, K: int, group: int, out):
    n = len(ids)
    f = function("qlayout.cu", "embed_q<%d>" % bits)
    Sp = padded_subgroups(K)
    f((n, (K + 255) // 256), (256,), (ids, codes, sb, i32(st), i32(K), i32(Sp), i32(Sp * 32 // group), i32(group),
                                      out))


def embed_dense(ids, table, K: int, out):
    f = function("qlayout.cu", "embed_dense")
    f((len(ids), (K + 255) // 256), (256,), (ids, table, i32(K), out))


def dequant(codes, sb, st: int, bits: int, M: int, K: int, group: int, out):
    f = function("qlayout.cu", "dequant<%d>" % bits)
    total = M * K
    Sp = padded_subgroups(K)
    f(((total + 255) // 256,), (256,), (codes, sb, i32(st), i32(M), i32(K), i32(Sp), i32(Sp * 32 // group),
                                       i32(group), out))


def fill_random_u32(out, seed: int):
    f = function("qlayout.cu", "fill_random_u32")
    n = out.size
    f(((n + 255) // 256,), (256,), (out, i64(n), np.uint64(seed & ((1 << 64) - 1))))


# --- elementwise.cu ------------------------------------------------------------------------------
def rmsnorm(x, ldx: int, res, ldr: int, w, y, h, H: int, eps: float, rows: int):
    f = function("elementwise.cu", "rmsnorm_rows")
    f((rows,), (256,), (x, i64(ldx), _ptr(res), i64(ldr), w, y, _ptr(h), i32(H), f32(eps)))


def gate_rows(a, lda: int, b, ldb: int, out, J: int, mode: int, rows: int):
    f = function("elementwise.cu", "gate_rows")
    f((rows, (J + 255) // 256), (256,), (a, i64(lda), b, i64(ldb), out, i32(J), i32(mode)))


def rope_rows(pos, inv, half: int, rows: int, out):
    """out [rows, half] float2: RoPE's (cos, sin) at each row's position, for every kernel of a forward."""
    f = function("elementwise.cu", "rope_rows")
    f((max(1, -(-rows * half // 256)),), (256,), (pos, inv, i32(half), i32(rows), out))


def heads_out(x, s0: int, s1: int, D: int, nw, eps: float, cs, half: int, out, rows: int, heads: int):
    f = function("elementwise.cu", "heads_out")
    f((rows, heads), (32,), (x, i64(s0), i64(s1), i32(D), _ptr(nw), f32(eps), _ptr(cs), i32(half), out))


def copy_slots(src, dst, sizes, sslots, dslots, pairs: int, arrays: int, largest: int):
    """Slot pairs of every array of a table copied in one launch: src, dst device tables of the arrays'
    addresses (uint64), sizes their floats a slot (int64), sslots/dslots the pairs (int32)."""
    f = function("elementwise.cu", "copy_slots")
    blocks = max(1, min(64, -(-largest // (4 * 256 * 4))))  # about four float4s a thread of the largest
    f((blocks, pairs, arrays), (256,), (src, dst, sizes, sslots, dslots))


def feed_rows(fed, d, B: int, n: int, ends, ne: int):
    """A decode graph's chosen tokens fed into the next graph's inputs d (tokens, positions, lanes, ...):
    rows flagged in d's token slots whose fed token is one of `ends` get lane -1 (elementwise.cu)."""
    f = function("elementwise.cu", "feed_rows")
    f((max(1, -(-n // 256)),), (256,), (fed, d, i32(B), i32(n), ends, i32(ne)))


SAMPLE_MAX_K = 1024  # the largest top-k the device sampler takes (sampling.cu's cdf array)


def sample(x, ldx: int, V: int, mode, par, out, rows: int):
    """out[r] = the token of row r: mode -1 argmax, else top-k = mode with par (T, top_p, u)."""
    f = function("sampling.cu", "sample_rows")
    f((rows,), (1024,), (x, i64(ldx), i32(V), mode, par, out))


# --- attention.cu --------------------------------------------------------------------------------
def kv_write(kv8: bool, k, ks0: int, ks1: int, knw, keps: float, cs, half: int, v, vs0: int, vs1: int,
             positions, tables, pt: int, KH: int, D: int, kc, vc, ksc, vsc, rows: int):
    f = function("attention.cu", "kv_write<%d>" % int(kv8))
    f((rows, KH), (64,), (k, i64(ks0), i64(ks1), _ptr(knw), f32(keps), _ptr(cs), i32(half), v, i64(vs0), i64(vs1),
                         positions, tables, i32(tables.shape[1]), i32(pt), i32(KH), i32(D), kc, vc, _ptr(ksc),
                         _ptr(vsc)))


def decode_chunks(table_width: int, page_tokens: int) -> int:
    return -(-(table_width * page_tokens) // CHUNK)


def decode_smem(kv8: bool, G: int, D: int, st: int = 1) -> int:
    """Dynamic shared bytes of attn_decode: st stages of bf16 K and V tiles of a chunk (fp8 decoded
    into them) and their fp8 scales, q, scores, new heads; pitches padded for conflict-free fragment
    loads."""
    return (st * 2 * CHUNK * (D // 2 + 4) + G * (D + 8) + G * (CHUNK + 8) + st * 2 * CHUNK + 2 * D) * 4


def decode_stages(kv8: bool, G: int, D: int, units: int) -> int:
    """Two tile stages for launches of few (kv head, row) pairs, where they fit: a long row's chunks
    then run as few blocks that load the next chunk during this one's products. Many pairs fill the
    GPU with one-chunk, one-stage blocks, three an SM, which measured faster (docs/perf-notes.md)."""
    return 2 if units <= 8 and decode_smem(kv8, G, D, 2) <= smem_optin() else 1


@lru_cache(maxsize=None)
def decode_resident(kv8: bool, G: int, D: int, st: int) -> int:
    """attn_decode blocks the device holds at once: its SMs x the blocks an SM fits (dynamic shared
    memory plus 2 KB for what a block reserves and its static arrays; the kernel's launch bound)."""
    import cupy
    attrs = cupy.cuda.Device().attributes
    per_sm = attrs["MaxSharedMemoryPerMultiprocessor"] // (decode_smem(kv8, G, D, st) + 2048)
    return attrs["MultiProcessorCount"] * max(1, min(3 if st == 1 else 2, per_sm))


def attn_decode(kv8: bool, q, qs0: int, qs1: int, qnw, qeps: float, cs, half: int, kn, ks0: int, ks1: int, knw,
                keps: float, vn, vs0: int, vs1: int, positions, tables, pt: int, kc, vc, ksc, vsc, KH: int, G: int,
                D: int, scale: float, out, rows: int, resident: int | None = None, stages: int | None = None):
    """Decode attention of `rows` rows; with kn/vn, the rows' new K/V are written to the cache first.
    D a multiple of 16 (whole MMA steps) up to 256, G up to 16 (the backend checks both). `resident`
    (the blocks a wave holds, for chunks_per_block) and `stages` shape the launch only (benches and
    tests compare them): a row's bits are the same under any."""
    import cupy
    nch = decode_chunks(tables.shape[1], pt)
    gmax = -(-nch // GROUP)
    H = KH * G
    part = cupy.empty(rows * H * nch * (D + 2), cupy.float32) if nch > 1 else None
    gpart = cupy.empty(rows * H * gmax * (D + 2), cupy.float32) if gmax > 1 else None
    counters = qmv_counters(rows * KH * (gmax + 1))
    st = stages or decode_stages(kv8, G, D, rows * KH)
    resident = resident or decode_resident(kv8, G, D, st)
    f = function("attention.cu", "attn_decode<%d, %d>" % (int(kv8), st))
    smem = decode_smem(kv8, G, D, st)
    f.allow_smem(smem)
    f((KH, rows, nch), (256,), (q, i64(qs0), i64(qs1), _ptr(qnw), f32(qeps), _ptr(cs), i32(half), _ptr(kn), i64(ks0),
                               i64(ks1), _ptr(knw), f32(keps), _ptr(vn), i64(vs0), i64(vs1), positions, tables,
                               i32(tables.shape[1]), i32(pt), kc, vc, _ptr(ksc), _ptr(vsc), i32(KH), i32(G), i32(D),
                               f32(scale), _ptr(part), _ptr(gpart), i32(nch), i32(resident), counters, out),
      shared_mem=smem)


# --- attn_prompt.cu ------------------------------------------------------------------------------
# attn_prompt's shapes (DT padded head dim, BK keys per tile, NW warps of 16 query vectors): the first
# of the narrowest DT that covers the head dim and fits the device's shared memory (8 warps share a
# K/V tile where they fit). The shape changes no bits: a query's arithmetic is its own.
PROMPT_SHAPES = ((64, 64, 4), (128, 32, 8), (128, 32, 4), (256, 32, 8), (256, 32, 4), (256, 16, 4), (256, 16, 2))
DEVICE_SMEM = (227 * 1024, 99 * 1024)  # opt-in shared bytes a block gets on an H200 and a GB10: the shapes CI compiles
PROMPT_SPLIT = 4096  # keys per split of a prompt row's attention (absolute positions: a multiple of every BK)


def prompt_smem(DT: int, BK: int, NW: int, kv8: bool, f16: bool) -> int:
    """Bytes of attn_prompt's tiles: queries (hi and lo; fp16: one), key and value tiles (bf16 ones
    double-buffered), a scratch vector a warp, fp8 scales."""
    return ((1 if f16 else 2) * 16 * NW + (2 if kv8 else 4) * BK) * (DT + 8) * 2 + NW * DT * 4 + 2 * BK * 4


@lru_cache(maxsize=None)
def smem_optin() -> int:
    """Dynamic shared bytes one block may have on this device (227 KB on an H200, 99 KB on a GB10)."""
    import cupy
    return int(cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


@lru_cache(maxsize=None)
def prompt_shape(D: int, limit: int, kv8: bool = False, f16: bool = False) -> tuple[int, int, int, int]:
    """(DT, BK, NW, dynamic shared bytes) of attn_prompt for head dim D (<= 256) within `limit` bytes."""
    fits = [sh for sh in PROMPT_SHAPES if D <= sh[0] and prompt_smem(*sh, kv8, f16) <= limit]
    DT = min(sh[0] for sh in fits)
    DT, BK, NW = next(sh for sh in fits if sh[0] == DT)
    return DT, BK, NW, prompt_smem(DT, BK, NW, kv8, f16)


def attn_prompt(kv8: bool, q, qs0: int, qs1: int, qnw, qeps: float, cs, half: int, positions, tables, pt: int,
                kc, vc, ksc, vsc, KH: int, G: int, D: int, scale: float, out, rows: int, maxpos: int,
                f16: bool = False):
    """Prompt attention of `rows` rows reaching at most position `maxpos`: key splits of PROMPT_SPLIT
    positions over the grid, merged per row. f16: single fp16 operands (the fp16 prefill precision)."""
    import cupy
    DT, BK, NW, smem = prompt_shape(D, smem_optin(), kv8, f16)
    f = function("attn_prompt.cu", "attn_prompt<%d, %d, %d, %d, %d>" % (int(kv8), DT, BK, NW, int(f16)))
    f.allow_smem(smem)
    QR, S, H = 16 * NW // G, maxpos // PROMPT_SPLIT + 1, KH * G
    part = cupy.empty(rows * H * S * (D + 2), cupy.float32)
    f(((rows + QR - 1) // QR, KH, S), (32 * NW,), (q, i64(qs0), i64(qs1), _ptr(qnw), f32(qeps), _ptr(cs), i32(half),
                                                 positions, tables, i32(pt), kc, vc, _ptr(ksc), _ptr(vsc), i32(KH),
                                                 i32(G), i32(D), f32(scale), i32(rows), i32(PROMPT_SPLIT), part),
      shared_mem=smem)
    function("attn_prompt.cu", "attn_prompt_merge")((rows, H), (256,), (part, positions, i32(S), i32(PROMPT_SPLIT),
                                                                     i32(H), i32(D), out))


# --- what CI compiles ---------------------------------------------------------------------------
def variants() -> list[tuple[str, str]]:
    """Every (file, kernel name) the launchers above can ask `function` for, from their own tables."""
    gemv = ["dense_gemv"]
    layout = ["repack4", "repack8", "embed_dense", "fill_random_u32"] + [
        f"{k}<{bits}>" for k in ("embed_q", "dequant") for bits in QMV_BITS]
    gemv += ["qmv<%d, %d, %d, %d, %d, 0, %d>" % (bits, group // 32, nt, xm, st, minb)
             for bits in QMV_BITS for group in QMV_GROUPS for nt in QMV_TILES for xm in QMV_INPUTS
             for st in QMV_SCALES for minb in ((2, 3) if bits == 4 and nt <= 1 else (2,))]
    gemv += ["qmv<%d, %d, 0, 3, %d, 0, 2>" % (bits, group // 32, st)  # the staged combination
             for bits in QMV_BITS for group in QMV_GROUPS for st in QMV_SCALES]
    gemv += ["qmv_xsplit<%d, %d>" % (xm, group // 32) for xm in QMV_INPUTS for group in QMV_GROUPS]
    gemv += ["qmv<%d, %d, %d, %d, %d, %d, 2>" % (bits, group // 32, nt, xm, st, ex)
             for bits in QMV_BITS for group in QMV_GROUPS for nt in QMV_EXPERT_TILES for xm in QMV_INPUTS
             for st in QMV_SCALES for ex in ((1, 2) if xm in QMV_EARLY_INPUTS else (1,))]  # launch_qwen3_5.qmv_experts
    qgemm = ["%s<%d, %d>" % (k, group // 32, st) for k in ("qgemm", "qgemm_dequant") for group in QMV_GROUPS
             for st in QMV_SCALES]
    qgemm += ["qgemm_stage<%d>" % xm for xm in QMV_INPUTS] + ["qgemm_reduce"]
    elementwise = ["rmsnorm_rows", "gate_rows", "rope_rows", "heads_out", "copy_slots", "feed_rows"]
    attention = ([f"kv_write<{kv8}>" for kv8 in (0, 1)]
                 + [f"attn_decode<{kv8}, {st}>" for kv8 in (0, 1) for st in (1, 2)])
    prompt = sorted({"attn_prompt<%d, %d, %d, %d, %d>" % (kv8, *prompt_shape(D, limit, kv8, f16)[:3], f16)
                     for kv8 in (0, 1) for f16 in (0, 1) for limit in DEVICE_SMEM for D in (64, 128, 256)})
    prompt += ["attn_prompt_merge"]
    return ([("gemv.cu", n) for n in dict.fromkeys(gemv)] + [("qlayout.cu", n) for n in layout]
            + [("elementwise.cu", n) for n in elementwise]
            + [("qgemm.cu", n) for n in qgemm]
            + [("attention.cu", n) for n in attention] + [("attn_prompt.cu", n) for n in prompt]
            + [("sampling.cu", "sample_rows"), ("timing.cu", "spin")])
