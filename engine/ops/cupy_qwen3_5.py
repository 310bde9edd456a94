"""The Qwen3.5 / 3.6 part of the CuPy op set: Gated DeltaNet, gated RMSNorm and MoE, with the kernels
of kernels/deltanet.cu, kernels/deltanet_chunk.cu and kernels/moe.cu. Numpy twins: the "Qwen3.5 / Qwen3.6" section of
numpy_backend.NumpyBackend (same names, same arguments). Stacked expert weights are
`cupy_weights.QExperts` (qmv over rows grouped by expert) or `cupy_weights.ExpertWeight`.

Differences from the numpy twins, all within rounding: a prompt chunk runs the delta rule in the
chunked form like numpy (kernels/deltanet_chunk.cu, the same 64-row chunks; the products in fp32 in
the kernels' own summation orders; scratch of O(T·Hv·(Dk + Dv + 64)) floats a call from CuPy's pool;
a key head dim it has no kernel for, or another chunk size, takes the recurrent deltanet_scan);
decode rows and verify windows run the recurrent form, as numpy's step, the gated norm in the same
launch (gated_rmsnorm's bits); expert products accumulate in qmv's order over K in one segment
(numpy sums a prompt's experts in expert order). Every row has the same arithmetic whatever the
batch, as everywhere.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

import kernels.launch_qwen3_5 as KQ

from .cupy_import import cupy
from .cupy_lazy import Combined, Normed
from .cupy_weights import ExpertWeight, QExperts


class Qwen35Ops:
    """Mixed into CupyBackend, which provides these helpers."""
    _m: Callable[[Any], Any]  # a lazy value materialised, anything else as it is
    _dev_i32: Callable[[Any], Any]  # row metadata (host or device ints) as a device int32 array
    _use: Callable[[], None]  # the backend's stream made current
    _keep_tables: dict[tuple, tuple]  # deltanet_keep's device address tables

    # --- helpers ------------------------------------------------------------------------------
    def _q_rows(self, x, ndim: int):
        """A float32 device array whose rows may be strided but whose other axes are contiguous;
        returns (array, row stride in elements)."""
        x = self._m(x)
        if not isinstance(x, cupy.ndarray):
            x = cupy.asarray(x)
        ok = x.dtype == cupy.float32 and x.ndim == ndim and x.strides[0] % 4 == 0 and x.strides[0] >= 0
        if ok:
            want = 4
            for axis in range(ndim - 1, 0, -1):  # axes after the first: C-contiguous
                ok = ok and (x.strides[axis] == want or x.shape[axis] == 1)
                want *= x.shape[axis]
        if not ok:
            x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        return x, (x.strides[0] // 4 if x.shape[0] > 1 else int(np.prod(x.shape[1:])))

    @staticmethod
    def _q_f32(w):
        if w.dtype == cupy.float32 and w.flags.c_contiguous:
            return w
        return cupy.ascontiguousarray(w, dtype=cupy.float32)

    # --- Gated DeltaNet -------------------------------------------------------------------------
    def conv1d_prompt(self, x, w, conv_state, lane: int):
        x, ldx = self._q_rows(x, 2)
        T, C = x.shape
        out = cupy.empty((T, C), cupy.float32)
        if T:
            KQ.conv1d_prompt(x, ldx, self._q_f32(w), conv_state, int(lane), out, C, w.shape[1], T)
        return out

    def conv1d_step(self, x, w, conv_state, lanes, window: int = 1, stride: int = 0):
        """Every row of every window in one launch: a thread steps its channel through its stream's rows."""
        return self._conv_step(x, w, conv_state, lanes, None, window, stride)

    def conv1d_step_gates(self, x, w, conv_state, lanes, a, b, a_log, dt_bias, window: int = 1, stride: int = 0):
        """conv1d_step and deltanet_gates of decode rows in one launch (the gates' bits are deltanet_gates')."""
        a, lda = self._q_rows(a, 2)
        b, ldb = self._q_rows(b, 2)
        n, Hv = a.shape
        g = cupy.empty((n, Hv), cupy.float32)
        beta = cupy.empty((n, Hv), cupy.float32)
        gates = (a, lda, b, ldb, self._q_f32(a_log), self._q_f32(dt_bias), g, beta, Hv)
        return self._conv_step(x, w, conv_state, lanes, gates, window, stride), g, beta

    def _conv_step(self, x, w, conv_state, lanes, gates, window: int, stride: int):
        x, ldx = self._q_rows(x, 2)
        n, C = x.shape
        out = cupy.empty((n, C), cupy.float32)
        if n:
            KQ.conv1d_step(x, ldx, self._q_f32(w), conv_state, self._dev_i32(lanes), conv_state.shape[0], out, C,
                           w.shape[1], n, gates, window, stride)
        return out

    def deltanet_gates(self, a, b, a_log, dt_bias):
        a, lda = self._q_rows(a, 2)
        b, ldb = self._q_rows(b, 2)
        n, Hv = a.shape
        g = cupy.empty((n, Hv), cupy.float32)
        beta = cupy.empty((n, Hv), cupy.float32)
        if n:
            KQ.deltanet_gates(a, lda, b, ldb, self._q_f32(a_log), self._q_f32(dt_bias), g, beta, Hv, n)
        return g, beta

    def _qkv(self, q, k, v):
        """(q, ldq, k, ldk, v, ldv) as the DeltaNet kernels take them (row-strided float32), and the
        output [n, Hv, Dv]."""
        q, ldq = self._q_rows(q, 3)
        k, ldk = self._q_rows(k, 3)
        v, ldv = self._q_rows(v, 3)
        return (q, ldq, k, ldk, v, ldv), cupy.empty((len(q), v.shape[1], v.shape[2]), cupy.float32)

    def _scan(self, q, k, v, g, beta, state, lanes_dev, nseq: int, T: int, stride: int = 0, logs: tuple = (),
              norm: tuple = ()):
        (q, ldq, k, ldk, v, ldv), out = self._qkv(q, k, v)
        n, Hk, DK = q.shape
        Hv, Dv = v.shape[1], v.shape[2]
        if n:
            KQ.deltanet_scan(q, ldq, k, ldk, v, ldv, self._q_f32(g), self._q_f32(beta), state, lanes_dev,
                             state.shape[0], out, nseq, T, stride, Hk, Hv, DK, Dv, float(np.float32(DK ** -0.5)),
                             logs, norm)
        return out

    def deltanet_step(self, q, k, v, g, beta, state, lanes, window: int = 1, stride: int = 0, logs: tuple = ()):
        """One launch for every window: a block steps its stream's rows in order, the state in registers."""
        return self._step(q, k, v, g, beta, state, lanes, window, stride, logs)

    def _step(self, q, k, v, g, beta, state, lanes, window: int, stride: int, logs: tuple, norm: tuple = ()):
        """Decode rows in windows of `window` through the recurrent scan; norm: (z, ldz, w, eps) of the
        scan's build with the gated norm."""
        return self._scan(q, k, v, g, beta, state, self._dev_i32(lanes), len(q) // window, window,
                          stride if window > 1 else 0, logs, norm)

    def deltanet_step_norm(self, q, k, v, g, beta, state, lanes, z, w, eps: float, window: int = 1, stride: int = 0,
                           logs: tuple = ()):
        """deltanet_step and gated_rmsnorm in one launch where the scan has a build for the heads
        (KQ.scan_norm_cols: a head a block, the norm by gated_rmsnorm's own device function, so its
        bits); else the two ops."""
        if KQ.scan_norm_cols(q.shape[2], v.shape[2]) is None:
            return self.gated_rmsnorm(self.deltanet_step(q, k, v, g, beta, state, lanes, window, stride, logs), z, w,
                                      eps)
        z, ldz = self._q_rows(z, 3)
        return self._step(q, k, v, g, beta, state, lanes, window, stride, logs, (z, ldz, self._q_f32(w), float(eps)))

    def deltanet_keep(self, states: list, logs: list[tuple], lane: int, first: int, last: int, stride: int) -> None:
        """Every layer's replay in one launch (kernels/deltanet.cu `deltanet_keep`); the address tables
        are uploaded once per set of arrays."""
        self._use()
        if first < 1:
            raise ValueError(f"window row {first}: row 0's state is the lane's already (rows 1.. are logged)")
        if not states or last < first:
            return
        key = tuple(a.data.ptr for a in states) + tuple(a.data.ptr for lg in logs for a in lg)
        tables = self._keep_tables.get(key)
        if tables is None:
            cols = [states] + [[lg[i] for lg in logs] for i in range(3)]
            tables = tuple(cupy.asarray(np.array([a.data.ptr for a in c], np.uint64)) for c in cols)
            if len(self._keep_tables) > 8:
                self._keep_tables.clear()
            self._keep_tables[key] = tables
        _, Hv, DK, Dv = states[0].shape
        KQ.deltanet_keep(tables, lane, first, last, stride, len(states), Hv, DK, Dv)

    def deltanet_prompt(self, q, k, v, g, beta, state, lane: int, chunk: int = 64):
        """The chunked form (three launches, chunks in parallel but for the state's pass); key head dims
        outside KQ.CHUNK_DK or a chunk size other than KQ.DN_CHUNK: the recurrent form, explicitly."""
        DK = q.shape[2]
        if DK not in KQ.CHUNK_DK or chunk != KQ.DN_CHUNK:
            return self._scan(q, k, v, g, beta, state, cupy.asarray(np.array([lane], np.int32)), 1, len(q))
        (q, ldq, k, ldk, v, ldv), out = self._qkv(q, k, v)
        T, Hk, _ = q.shape
        Hv, Dv = v.shape[1], v.shape[2]
        if T:
            KQ.deltanet_chunked(q, ldq, k, ldk, v, ldv, self._q_f32(g), self._q_f32(beta), state, int(lane), out, T,
                                Hk, Hv, DK, Dv, float(np.float32(DK ** -0.5)))
        return out

    def gated_rmsnorm(self, x, z, w, eps: float):
        x = cupy.ascontiguousarray(self._m(x), dtype=cupy.float32)
        z, ldz = self._q_rows(z, 3)
        n, H, D = x.shape
        y = cupy.empty((n, H, D), cupy.float32)
        if n:
            KQ.gated_rmsnorm(x, z, ldz, self._q_f32(w), y, D, float(eps), n, H)
        return y

    # --- MoE ------------------------------------------------------------------------------------
    def moe_route(self, logits, top_k: int, shared_gate=None):
        """Up to KQ.route_slots_fit's rows (decode rows, a verify window) are routed and grouped by
        expert in one launch; the slots wait for moe_experts of these experts (`_routed`)."""
        x, ld = self._q_rows(logits, 2)
        n, E = x.shape
        gate, ldg = self._q_rows(shared_gate, 2) if shared_gate is not None else (None, 0)
        kk = top_k + (gate is not None)
        experts = cupy.empty((n, kk), cupy.int32)
        weights = cupy.empty((n, kk), cupy.float32)
        self._routed = None
        if n and KQ.route_slots_fit(n, E):
            ES = E + (gate is not None)  # the shared expert appended: stacked as expert E
            self._routed = (experts, ES, KQ.moe_route_slots(x, ld, E, top_k, experts, weights, n, ES, gate, ldg))
        elif n:
            KQ.moe_route(x, ld, E, top_k, experts, weights, n, gate, ldg)
        return experts, weights

    @staticmethod
    def _product(w, experts, slots, x, ldx: int, xj: bool, y, prompt: bool, xm: int = 0, x2=None, ldx2: int = 0,
                 nw=None, eps: float = 0.0, early: bool = False):
        """y[rj] = f(x[rj // k or rj]) @ W_e^T for each (row, choice) rj; f by xm: 0 x, 1 silu(x)·x2,
        2 rmsnorm(x)·nw (qmv's only). Each product takes its weight's own kernel (a GGUF file mixes
        layouts: Q4_K gate_up, Q6_K down); qmv's reads the ids grouped by expert from `slots`
        (KQ.moe_slots of these experts); early: those slots were written two or more launches back."""
        n, k = experts.shape
        if isinstance(w, QExperts):
            KQ.qmv_experts(w.codes, w.sb, w.st, w.bits, w.group, w.M, w.K, w.Mp, slots, k, x, ldx, xj, y,
                           xm=xm, x2=x2, ldx2=ldx2, nw=nw, eps=eps, early=early)
            return
        if xm == 1:
            act = cupy.empty((n * k, x2.shape[1]), cupy.float32)
            KQ.moe_swiglu(x, act, x2.shape[1], n * k)
            x, ldx = act, x2.shape[1]
        if isinstance(w, ExpertWeight):
            KQ.moe_gemv(w.bits, w.codes, w.scales, w.biases, w.st, experts, k, x, ldx, xj, y, w.M, w.K, w.group, n)
        else:
            E, M, K = w.shape
            KQ.moe_gemv(0, w, None, None, 0, experts, k, x, ldx, xj, y, M, K, 32, n)

    def moe_experts(self, x, gate_up, down, experts, weights, prompt: bool = False, shared=None, shared_gate=None):
        # decode rows' pending RMSNorm: the gate_up product stages it from h = x + res (the router's
        # product wrote h); a prompt chunk's rows are normed once (each expert slot would redo its rows:
        # 2,048-row prompts 5-8 % slower)
        norm = {}
        if not prompt and isinstance(x, Normed) and isinstance(gate_up, QExperts) and x.w.dtype == cupy.float32:
            norm = dict(xm=2, nw=x.w, eps=x.eps)
            x = x.residual()
        x, ldx = self._q_rows(x, 2)
        n, H = x.shape
        k = experts.shape[1]
        M1 = gate_up.shape[1]
        I = M1 // 2
        if n == 0:
            return cupy.empty((n, H), cupy.float32)
        routed, self._routed = self._routed, None
        given = experts
        experts = cupy.ascontiguousarray(experts, dtype=cupy.int32)
        weights = cupy.ascontiguousarray(self._q_f32(weights))
        # one grouping for both products: it depends on the ids and the expert count only (made with
        # the routing where moe_route made these ids for this many experts)
        slots = None
        if isinstance(gate_up, QExperts) or isinstance(down, QExperts):
            same = routed is not None and routed[0] is given and routed[1] == gate_up.shape[0]
            slots = routed[2] if same else KQ.moe_slots(experts, gate_up.shape[0])
        gu = cupy.empty((n * k, M1), cupy.float32)
        self._product(gate_up, experts, slots, x, ldx, False, gu, prompt, **norm)
        y = cupy.empty((n * k, H), cupy.float32)
        if isinstance(down, QExperts) and I % 4 != 0:  # qmv's x2 loads are 16-byte aligned
            act = cupy.empty((n * k, I), cupy.float32)
            KQ.moe_swiglu(gu, act, I, n * k)
            self._product(down, experts, slots, act, I, True, y, prompt, early=True)
        else:  # SwiGLU folded into the down product's input (qmv) or a kernel of its own (moe_gemv)
            self._product(down, experts, slots, gu, M1, True, y, prompt, xm=1, x2=gu[:, I:], ldx2=M1, early=True)
        if shared is None:  # decode rows: the next product may sum it as it stages its input
            combined = Combined(y, weights, k)
            return combined if not prompt else combined.materialize()
        out = cupy.empty((n, H), cupy.float32)
        s, lds = self._q_rows(shared, 2)
        gt, ldg = self._q_rows(shared_gate, 2)
        KQ.moe_combine(y, weights, k, out, H, n, s, lds, gt, ldg)
        return out
