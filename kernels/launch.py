"""Launchers: grid shapes and argument lists of the kernels in this folder. CuPy arrays in, CuPy
arrays out; no semantics beyond the kernels' own (the backend in engine/ops/cupy_backend.py keeps
those). Scalars go as fixed-width numpy types, null pointers as 0.
"""
from __future__ import annotations

import os

import numpy as np

from . import function

CHUNK = 256  # absolute key positions per decode-attention chunk (attention.cu)
NULL = np.uint64(0)

i32, i64, f32 = np.int32, np.int64, np.float32


def _ptr(a):
    return NULL if a is None else a


# --- gemv.cu --------------------------------------------------------------------------------
def repack(packed, bits: int, M: int, K: int, Mp: int):
    """Canonical uint32 codes [M, K*bits/32] -> the tile layout of qgemv (rows padded to Mp)."""
    import cupy
    wpl = 2 if bits == 4 else 4
    total = (Mp // 16) * (K // 32) * 32 * wpl
    out = cupy.empty(total, cupy.uint32)
    f = function("gemv.cu", "repack4" if bits == 4 else "repack8")
    f(((total + 255) // 256,), (256,), (packed, i32(M), i32(K), out, i64(total)))
    return out


# Schedules of qgemv by n-tiles per launch: (TM 16-row tiles per block, DSUB subgroups per load batch,
# PF software pipelining). They change only the schedule, never an element's arithmetic. The best
# measured on the H200 (docs/perf-notes.md): the pipelined variants need ~220 registers and lose
# occupancy.
QGEMV_SCHEDULE = {1: (2, 8, 0), 2: (2, 4, 0), 4: (2, 2, 0)}
if os.environ.get("LANECHAT_QGEMV_SCHEDULE"):  # "1:2,8,1;4:2,2,0" (tuning runs)
    for item in os.environ["LANECHAT_QGEMV_SCHEDULE"].split(";"):
        k, v = item.split(":")
        QGEMV_SCHEDULE[int(k)] = tuple(int(a) for a in v.split(","))
TM_ROWS = 64  # weights pad to a multiple of this many rows: any TM up to 4 stays inside the codes


def qgemv_variant(bits: int, sub: int, nt: int) -> tuple[int, int, int, int, int, int]:
    """(BITS, SUB, TM, NT, DSUB, PF): whole groups per batch, fewer subgroups for 8-bit codes."""
    tm, dsub, pf = QGEMV_SCHEDULE[nt]
    if bits == 8:
        dsub = max(1, dsub // 2)
    dsub = max(dsub, sub)
    dsub -= dsub % sub
    return bits, sub, tm, nt, dsub, pf


def qgemv(codes, sb, st: int, bits: int, group: int, M: int, K: int, x, x2, ldx: int, xm: int, y, nrows: int):
    """y[:nrows, :M] = x @ W^T for repacked W (x2: silu(x) * x2 when xm = 1)."""
    nt = 1 if nrows <= 8 else (2 if nrows <= 16 else 4)
    v = qgemv_variant(bits, group // 32, nt)
    f = function("gemv.cu", "qgemv<%d, %d, %d, %d, %d, %d>" % v)
    slices = -(-nrows // (nt * 8))
    Mp = -(-M // TM_ROWS) * TM_ROWS
    f((slices, Mp // (16 * v[2])), (256,),
      (codes, sb, i32(st), x, _ptr(x2), i64(ldx), i32(xm), y, i64(y.shape[1]), i32(nrows), i32(M), i32(K // 32),
       i32(K // group)))


def dense_gemv(W, M: int, K: int, x, x2, ldx: int, xm: int, y, nrows: int):
    f = function("gemv.cu", "dense_gemv")
    f(((M + 7) // 8,), (256,), (W, i32(M), i32(K), x, _ptr(x2), i64(ldx), i32(xm), y, i64(y.shape[1]), i32(nrows)))


def embed_q(ids, codes, sb, st: int, bits: int, K: int, group: int, out):
    n = len(ids)
    f = function("gemv.cu", "embed_q<%d>" % bits)
    f((n, (K + 255) // 256), (256,), (ids, codes, sb, i32(st), i32(K), i32(K // group), i32(group), out))


def embed_dense(ids, table, K: int, out):
    f = function("gemv.cu", "embed_dense")
    f((len(ids), (K + 255) // 256), (256,), (ids, table, i32(K), out))


def dequant(codes, sb, st: int, bits: int, M: int, K: int, group: int, out):
    f = function("gemv.cu", "dequant<%d>" % bits)
    total = M * K
    f(((total + 255) // 256,), (256,), (codes, sb, i32(st), i32(M), i32(K), i32(K // group), i32(group), out))


def fill_random_u32(out, seed: int):
    f = function("gemv.cu", "fill_random_u32")
    n = out.size
    f(((n + 255) // 256,), (256,), (out, i64(n), np.uint64(seed & ((1 << 64) - 1))))


# --- elementwise.cu ------------------------------------------------------------------------------
def rmsnorm(x, ldx: int, res, ldr: int, w, y, h, H: int, eps: float, rows: int):
    f = function("elementwise.cu", "rmsnorm_rows")
    f((rows,), (256,), (x, i64(ldx), _ptr(res), i64(ldr), w, y, _ptr(h), i32(H), f32(eps)))


def gate_rows(a, lda: int, b, ldb: int, out, J: int, mode: int, rows: int):
    f = function("elementwise.cu", "gate_rows")
    f((rows, (J + 255) // 256), (256,), (a, i64(lda), b, i64(ldb), out, i32(J), i32(mode)))


def heads_out(x, s0: int, s1: int, D: int, nw, eps: float, pos, inv, half: int, out, rows: int, heads: int):
    f = function("elementwise.cu", "heads_out")
    f((rows, heads), (32,), (x, i64(s0), i64(s1), i32(D), _ptr(nw), f32(eps), _ptr(pos), _ptr(inv), i32(half), out))


def argmax(x, ldx: int, V: int, out, rows: int):
    f = function("elementwise.cu", "argmax_rows")
    f((rows,), (1024,), (x, i64(ldx), i32(V), out))


# --- attention.cu --------------------------------------------------------------------------------
def kv_write(kv8: bool, k, ks0: int, ks1: int, knw, keps: float, inv, half: int, v, vs0: int, vs1: int,
             positions, tables, pt: int, KH: int, D: int, kc, vc, ksc, vsc, rows: int):
    f = function("attention.cu", "kv_write<%d>" % int(kv8))
    f((rows, KH), (64,), (k, i64(ks0), i64(ks1), _ptr(knw), f32(keps), _ptr(inv), i32(half), v, i64(vs0), i64(vs1),
                         positions, tables, i32(tables.shape[1]), i32(pt), i32(KH), i32(D), kc, vc, _ptr(ksc),
                         _ptr(vsc)))


def decode_chunks(table_width: int, page_tokens: int) -> int:
    return -(-(table_width * page_tokens) // CHUNK)


def decode_tiles(kv8: bool, G: int, D: int) -> tuple[int, int]:
    """(keys per shared tile, dynamic shared bytes) of attn_decode; the bytes must stay <= 48 KB."""
    kt = 64 if D <= 128 else 32
    row_words = D // 4 if kv8 else D // 2
    return kt, (G * D + G * CHUNK) * 4 + CHUNK * 8 + CHUNK * 4 + kt * (row_words + 1) * 4


def attn_decode(kv8: bool, q, qs0: int, qs1: int, qnw, qeps: float, inv, half: int, positions, tables, pt: int,
                kc, vc, ksc, vsc, KH: int, G: int, D: int, scale: float, part, nch: int, counters, out, rows: int):
    f = function("attention.cu", "attn_decode<%d>" % int(kv8))
    kt, smem = decode_tiles(kv8, G, D)
    f((nch, KH, rows), (128,), (q, i64(qs0), i64(qs1), _ptr(qnw), f32(qeps), _ptr(inv), i32(half), positions, tables,
                               i32(tables.shape[1]), i32(pt), kc, vc, _ptr(ksc), _ptr(vsc), i32(KH), i32(G), i32(D),
                               f32(scale), part, i32(nch), counters, i32(kt), out), shared_mem=smem)


def prompt_tiles(G: int, D: int) -> tuple[int, int, int]:
    """(QR rows per block, KT keys per tile, dynamic shared bytes) of attn_prompt: <= 48 KB."""
    QR = max(1, min(8, 4096 // (G * D)))
    KT = max(8, min(32, 2048 // D))
    QV = QR * G
    smem = (QV * D + KT * (D + 1) + KT * D + QV * KT + 3 * QV) * 4
    return QR, KT, smem


def attn_prompt(kv8: bool, q, qs0: int, qs1: int, qnw, qeps: float, inv, half: int, positions, tables, pt: int,
                kc, vc, ksc, vsc, KH: int, G: int, D: int, scale: float, out, rows: int):
    f = function("attention.cu", "attn_prompt<%d>" % int(kv8))
    QR, KT, smem = prompt_tiles(G, D)
    f(((rows + QR - 1) // QR, KH), (256,), (q, i64(qs0), i64(qs1), _ptr(qnw), f32(qeps), _ptr(inv), i32(half),
                                           positions, tables, i32(pt), kc, vc, _ptr(ksc), _ptr(vsc), i32(KH), i32(G),
                                           i32(D), f32(scale), i32(rows), i32(QR), i32(KT), out), shared_mem=smem)
