"""Launchers of deltanet.cu, deltanet_chunk.cu and moe.cu (Qwen3.5 / 3.6), in the style of
`kernels.launch`: CuPy arrays in, CuPy arrays out, grid shapes and argument lists only. Row strides
are in elements.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import function
from . import launch as L

i32, i64, f32 = np.int32, np.int64, np.float32
SCAN_DK = (8, 16, 32, 64, 128, 256)  # key head dims deltanet_scan is instantiated for
SCAN_COLS = 32  # columns of the state per plain deltanet_scan block (its COLS): a head over Dv / 32 blocks
# The scan with the gated norm takes a whole head a block: COLS the first of these >= Dv (the norm's
# warp holds COLS / 32 values a lane, so COLS <= 32 x GN_PER_LANE) in G x COLS threads, at most
# SCAN_NORM_THREADS (a thread keeps DK / G state rows in registers: at 512, 128 registers, they spill)
SCAN_NORM_COLS = (32, 64, 128, 256)
SCAN_NORM_THREADS = 256
CONV_ROWS = 16  # prompt rows a conv1d_prompt thread computes: deltanet.cu's CONV_ROWS
CHUNK_DK = (8, 16, 32, 64, 128)  # key head dims of deltanet_chunk.cu's kernels (256 would pass 48 KB of shared memory)
DN_CHUNK = 64  # rows per chunk of deltanet_chunk.cu: its DN_C
DN_COLS = 32  # state columns per dn_chunk_state block: deltanet_chunk.cu's DN_COLS
CONV_WIDTHS = (4,)  # conv1d kernel sizes of the supported models (Qwen3.5 / 3.6: linear_conv_kernel_dim 4)
MOE_BITS = (0, 4, 8)  # moe_gemv: float32 experts (0) or affine 4/8-bit codes


# --- deltanet.cu ------------------------------------------------------------------------------
def conv1d_step(x, ldx: int, w, state, lanes, slots: int, out, C: int, K: int, rows: int, gates=None,
                window: int = 1, stride: int = 0):
    """The decode rows' conv, in windows of `window` rows per stream (row j's state to slot lane + j·stride);
    with gates = (a, lda, b, ldb, a_log, dt_bias, g, beta, Hv) their gates too, from one more block per stream."""
    f = function("deltanet.cu", "conv1d_step<%d>" % K)
    a, lda, b, ldb, a_log, dt_bias, g, beta, Hv = gates or (None, 0, None, 0, None, None, None, None, 0)
    f(((C + 255) // 256 + (gates is not None), rows // window), (256,),
      (x, i64(ldx), w, state, lanes, i32(slots), out, i32(C), L._ptr(a), i64(lda), L._ptr(b), i64(ldb), L._ptr(a_log),
       L._ptr(dt_bias), L._ptr(g), L._ptr(beta), i32(Hv), i32(window), i32(stride)))


def conv1d_prompt(x, ldx: int, w, state, slot: int, out, C: int, K: int, T: int):
    f = function("deltanet.cu", "conv1d_prompt<%d>" % K)
    f(((C + 255) // 256, (T + CONV_ROWS - 1) // CONV_ROWS), (256,), (x, i64(ldx), w, state, i32(slot), out, i32(C),
                                                                  i32(T)))


def deltanet_gates(a, lda: int, b, ldb: int, a_log, dt_bias, g, beta, Hv: int, rows: int):
    total = rows * Hv
    f = function("deltanet.cu", "deltanet_gates")
    f(((total + 255) // 256,), (256,), (a, i64(lda), b, i64(ldb), a_log, dt_bias, g, beta, i32(Hv), i64(total)))


def scan_split(DK: int) -> int:
    """Threads sharing one column of the state (each keeps DK/G rows in registers)."""
    return max(1, DK // 64)


def scan_norm_cols(DK: int, Dv: int) -> int | None:
    """The columns a block of the scan with the gated norm takes for these heads (all Dv of a head),
    or None where it has no build for them."""
    cols = next((c for c in SCAN_NORM_COLS if c >= Dv), None)
    if (DK not in SCAN_DK or cols is None or cols > 32 * L.GN_PER_LANE
            or scan_split(DK) * cols > SCAN_NORM_THREADS):
        return None
    return cols


def deltanet_scan(q, ldq: int, k, ldk: int, v, ldv: int, g, beta, state, lanes, slots: int, out, nseq: int, T: int,
                  stride: int, Hk: int, Hv: int, DK: int, Dv: int, qscale: float, logs: tuple = (), norm: tuple = ()):
    """T rows of each of nseq sequences (lanes[s·T]: sequence s's lane); stride > 0: a verify window, row
    0's state to the lane's slot and row t's update to `logs` (k̂, δ, e^g) at lane + (t-1)·stride; 0: the
    state after the last row to the lane's slot. norm = (z, ldz, w, eps): out is gated_rmsnorm(o, z, w,
    eps) with gated_rmsnorm's bits, a head a block (`scan_norm_cols`)."""
    if DK not in SCAN_DK:
        raise ValueError(f"deltanet_scan: key head dim {DK} is not one of {SCAN_DK}")
    if stride and len(logs) != 3:
        raise ValueError("deltanet_scan: a verify window needs its logs (k̂, δ, e^g)")
    G = scan_split(DK)
    cols = scan_norm_cols(DK, Dv) if norm else SCAN_COLS
    if cols is None:
        raise ValueError(f"deltanet_scan: no build with the gated norm for heads of {DK} x {Dv} (a head a block: "
                         f"Dv <= {SCAN_NORM_COLS[-1]}, {SCAN_NORM_THREADS} threads at most)")
    kl, dl, gl = logs if stride else (None, None, None)
    z, ldz, w, eps = norm or (None, 0, None, 0.0)
    f = function("deltanet.cu", "deltanet_scan<%d, %d, %d, %d>" % (DK, G, cols, bool(norm)))
    f((nseq, Hv, -(-Dv // cols)), (G * cols,),
      (q, i64(ldq), k, i64(ldk), v, i64(ldv), g, beta, state, lanes, i32(slots), out, i32(T), i32(stride),
       L._ptr(kl), L._ptr(dl), L._ptr(gl), i32(Hk), i32(Hv), i32(Dv), f32(qscale), L._ptr(z), i64(ldz), L._ptr(w),
       f32(eps)))


def deltanet_keep(tables, slot: int, first: int, last: int, stride: int, layers: int, Hv: int, DK: int, Dv: int):
    """Window rows first..last of each layer's log replayed onto its state at `slot`: tables = device
    uint64 arrays of the layers' state, k̂, δ and e^g addresses."""
    f = function("deltanet.cu", "deltanet_keep")
    f((layers, Hv, -(-(DK * Dv) // 256)), (256,), (*tables, i32(slot), i32(first), i32(last), i32(stride), i32(Hv),
                                                    i32(DK), i32(Dv)))


# --- deltanet_chunk.cu ------------------------------------------------------------------------
def deltanet_chunked(q, ldq: int, k, ldk: int, v, ldv: int, g, beta, state, slot: int, out, T: int, Hk: int,
                     Hv: int, DK: int, Dv: int, qscale: float):
    """One lane's T prompt rows in the chunked form (deltanet_chunk.cu): the norms, every chunk's
    products at once, then the chunks in order per (head, 32 state columns). Scratch from CuPy's pool:
    q̂, k̂ [T, Hk, DK] and per chunk and value head W [64, DK], U [64, Dv], P [64, 64], γ [64]."""
    import cupy
    if DK not in CHUNK_DK:
        raise ValueError(f"deltanet_chunked: key head dim {DK} is not one of {CHUNK_DK}")
    n = -(-T // DN_CHUNK) * Hv * DN_CHUNK  # rows of the per-head scratch
    qn, kn = cupy.empty(T * Hk * DK, cupy.float32), cupy.empty(T * Hk * DK, cupy.float32)
    W, U = cupy.empty(n * DK, cupy.float32), cupy.empty(n * Dv, cupy.float32)
    P, gm = cupy.empty(n * DN_CHUNK, cupy.float32), cupy.empty(n, cupy.float32)
    function("deltanet_chunk.cu", "dn_chunk_norm<%d>" % DK)((-(-T * Hk // 8),), (256,),
                                                           (q, i64(ldq), k, i64(ldk), qn, kn, i32(T), i32(Hk),
                                                            f32(qscale)))
    function("deltanet_chunk.cu", "dn_chunk_prep<%d>" % DK)((-(-T // DN_CHUNK), Hv), (256,),
                                                           (qn, kn, v, i64(ldv), g, beta, W, U, P, gm, i32(T),
                                                            i32(Hk), i32(Hv), i32(Dv)))
    function("deltanet_chunk.cu", "dn_chunk_state<%d>" % DK)((Hv, -(-Dv // DN_COLS)), (256,),
                                                            (qn, kn, W, U, P, gm, state, i32(slot), out, i32(T),
                                                             i32(Hk), i32(Hv), i32(Dv)))


def gated_rmsnorm(x, z, ldz: int, w, y, D: int, eps: float, rows: int, heads: int):
    if D > 32 * L.GN_PER_LANE:
        raise ValueError(f"gated_rmsnorm: head dim {D} is beyond the kernel's {32 * L.GN_PER_LANE}")
    f = function("deltanet.cu", "gated_rmsnorm")
    f((rows, heads), (32,), (x, z, i64(ldz), w, y, i32(D), f32(eps)))


# --- moe.cu ---------------------------------------------------------------------------------------
ROUTE_TOP_K = 31  # the most choices moe.cu's route_row makes (a warp: one lane a choice, one for the shared)
ROUTE_EXPERTS = 1024  # the most experts it routes over


def _route_fits(k: int, E: int, what: str) -> None:
    if k > ROUTE_TOP_K or E > ROUTE_EXPERTS:
        raise ValueError(f"{what}: top-{k} of {E} experts is beyond the kernel "
                         f"(k <= {ROUTE_TOP_K}, E <= {ROUTE_EXPERTS})")


def moe_route(logits, ld: int, E: int, k: int, experts, weights, rows: int, gate=None, ldg: int = 0):
    """experts, weights [rows, k] (or k + 1 with the shared expert's gate logits: choice k is expert E)."""
    _route_fits(k, E, "moe_route")
    f = function("moe.cu", "moe_route")
    f((rows,), (32,), (logits, i64(ld), i32(E), i32(k), L._ptr(gate), i64(ldg), experts, weights))


def moe_gemv(bits: int, W, scales, biases, st: int, experts, k: int, x, ldx: int, xj: bool, y, M: int, K: int,
             group: int, rows: int):
    """y [rows·k, M]: W is float32 [E, M, K] (bits 0) or uint32 codes [E, M, K·bits/32] with
    scales/biases [E, M, K/group] (st: 0 fp16, 1 bf16 as raw 16-bit, 2 fp32)."""
    f = function("moe.cu", "moe_gemv<%d>" % bits)
    null = np.uint64(0)
    f(((M + 7) // 8, rows * k), (256,), (W, null if scales is None else scales, null if biases is None else biases,
                                        i32(st), experts, i32(k), x, i64(ldx), i32(int(xj)), y, i32(M), i32(K),
                                        i32(group)))


class Slots(NamedTuple):
    """The (row, choice) ids grouped by expert (moe.cu moe_slots): Z slots of 2 + R ints each, R
    picked by `nt` from the id count and the expert count alone, so one table serves every product
    of the same routing."""
    table: object
    nk: int
    nt: int
    Z: int


def slot_rows(nt: int) -> int:
    """Ids a slot of `nt` n-tiles holds (qmv's x rows a block: 4 packed, or 8 per n-tile)."""
    return 8 * nt if nt else 4


def _slots(nk: int, E: int) -> Slots:
    """An empty slot table for nk ids over E experts: its shape from the counts alone."""
    import cupy
    nt = 0 if nk <= 4 * min(E, nk) else 2  # a schedule only: rows per expert slot
    R = slot_rows(nt)
    Z = -(-nk // R) + min(E, nk)
    return Slots(cupy.empty(Z * (2 + R), cupy.int32), nk, nt, Z)


def moe_slots(experts, E: int) -> Slots:
    s = _slots(experts.size, E)
    R = slot_rows(s.nt)
    function("moe.cu", "moe_slots")((1,), (1024,), (experts, i32(s.nk), i32(E), i32(R), s.table, i32(s.Z)))
    return s


ROUTE_SLOTS_ROWS = 32  # rows moe_route_slots routes (one warp each)
# its probabilities' shared bytes: with its 12 KB of static slot arrays, within the 48 KB a launch has without an opt-in
ROUTE_SLOTS_SMEM = 36 * 1024


def route_slots_fit(n: int, E: int) -> bool:
    """Whether moe_route_slots takes n rows of E logits."""
    return n <= ROUTE_SLOTS_ROWS and n * E * 4 <= ROUTE_SLOTS_SMEM and E <= ROUTE_EXPERTS


def moe_route_slots(logits, ld: int, E: int, k: int, experts, weights, rows: int, ES: int, gate=None,
                    ldg: int = 0) -> Slots:
    """moe_route and moe_slots (over ES experts) of decode rows in one launch (route_slots_fit)."""
    _route_fits(k, E, "moe_route_slots")
    if not route_slots_fit(rows, E):
        raise ValueError(f"moe_route_slots: {rows} rows of {E} logits is beyond the kernel (route_slots_fit)")
    s = _slots(experts.size, ES)
    f = function("moe.cu", "moe_route_slots")
    f((1,), (32 if rows == 1 else 1024,),
      (logits, i64(ld), i32(E), i32(k), L._ptr(gate), i64(ldg), experts, weights, i32(rows), i32(ES),
       i32(slot_rows(s.nt)), s.table, i32(s.Z)), shared_mem=rows * E * 4)
    return s


def qmv_experts(codes, sb, st: int, bits: int, group: int, M: int, K: int, Mp: int, slots: Slots, k: int, x,
                ldx: int, xj: bool, y, xm: int = 0, x2=None, ldx2: int = 0, nw=None, eps: float = 0.0,
                early: bool = False):
    """y[rj, :M] = f(x[rj // k or rj]) @ W_e^T for each (row, choice) rj = r·k + j, e = experts[r, j],
    over stacked repacked weights of Mp rows each, the ids grouped by `moe_slots`; f by xm: 0 x,
    1 silu(x)·x2, 2 rmsnorm(x)·nw. K in one segment: the slots already make blocks enough (the
    35B-A3B's decode step 2 % shorter at 1 row and 8 % at 8 than in qmv_split's segments, H100).
    early: the slots were written two or more launches back (the down product), so the blocks read
    them and their first weights before waiting for the launch ahead; built for down's inputs (xm 0, 1)."""
    if early and xm not in L.QMV_EARLY_INPUTS:
        raise ValueError("an early expert product takes x or silu(x)·x2 (the down product's), not a staged norm")
    mblocks = -(-M // 128)
    tiles = Mp // 16
    ecodes = tiles * L.padded_subgroups(K) * 32 * (2 if bits == 4 else 4)
    esb = tiles * (L.padded_subgroups(K) * 32 // group) * 16 * (2 if st == 2 else 1)
    f = function("gemv.cu", "qmv<%d, %d, %d, %d, %d, %d, 2>" % (bits, group // 32, slots.nt, xm, st, 2 if early else 1))
    f((mblocks, 1, slots.Z), (256,),
      (codes, sb, i32(st), x, L._ptr(x2), i64(ldx), i64(ldx2), L._ptr(nw), f32(eps), L.NULL, i64(0), y,
       i64(y.shape[1]), i32(slots.nk), i32(M), i32(Mp), i32(K), i32(L.padded_subgroups(K)), i32(K), L.NULL,
       L.NULL, L.NULL, slots.table, i32(1 if xj else k), i64(ecodes), i64(esb), L.NULL, L.NULL, L.NULL, L.NULL, L.NULL,
       L.NULL, L.NULL, i64(0), L.NULL, L.NULL, i64(0), L.NULL, i32(0)))


def moe_swiglu(gu, act, I: int, rows_k: int):
    f = function("moe.cu", "moe_swiglu")
    f((rows_k, (I + 255) // 256), (256,), (gu, act, i32(I)))


def moe_combine(y, weights, k: int, out, H: int, rows: int, shared=None, lds: int = 0, gate=None, ldg: int = 0):
    """out = Σ_j weights[:, j]·y[r·k + j] (+ sigmoid(gate)·shared where shared is given)."""
    f = function("moe.cu", "moe_combine")
    f((rows, (H + 255) // 256), (256,), (y, weights, i32(k), L._ptr(shared), i64(lds), L._ptr(gate), i64(ldg), out,
                                        i32(H)))


# --- what CI compiles ---------------------------------------------------------------------------
def variants() -> list[tuple[str, str]]:
    """Every (file, kernel name) the launchers above can ask `function` for, from their own tables."""
    deltanet = [f"{k}<{w}>" for k in ("conv1d_step", "conv1d_prompt") for w in CONV_WIDTHS]
    deltanet += ["deltanet_gates", "deltanet_keep", "gated_rmsnorm"]
    deltanet += ["deltanet_scan<%d, %d, %d, 0>" % (dk, scan_split(dk), SCAN_COLS) for dk in SCAN_DK]
    deltanet += ["deltanet_scan<%d, %d, %d, 1>" % (dk, scan_split(dk), c) for dk in SCAN_DK for c in SCAN_NORM_COLS
                 if scan_norm_cols(dk, c) == c]
    chunk = [f"{k}<{dk}>" for k in ("dn_chunk_norm", "dn_chunk_prep", "dn_chunk_state") for dk in CHUNK_DK]
    moe = ["moe_route", "moe_slots", "moe_route_slots", "moe_swiglu", "moe_combine"]
    moe += [f"moe_gemv<{b}>" for b in MOE_BITS]
    return ([("deltanet.cu", n) for n in deltanet] + [("deltanet_chunk.cu", n) for n in chunk]
            + [("moe.cu", n) for n in moe])
