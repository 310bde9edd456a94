"""The reference backend: numpy on the CPU, float32 activations, batch-invariant by construction.

Decode rows are computed one at a time (BLAS takes other paths for one row and for many) and a
prompt chunk is always one GEMM of the same padded shape, so no row depends on its neighbours.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DeviceLostError
from ..kv.cache import F32, decode_kv, encode_kv, slots
from ..kv.snapshots import HOST, HostLanding
from ..memory import system_free_bytes
from ..sampling import sample
from ..weights import Tensor, dequantize
from . import dflash2_math as dm
from .base import GraphStats, Kind

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..kv.cache import Cache
    from ..rows import Rows
    from ..settings import EngineSettings, SamplingParams


class NumpyBackend:
    name = "numpy"
    device = "CPU"
    kv_stores = ("bf16", "fp8", F32)
    unified_memory = False  # host memory, not a GPU's: the plan keeps its plain default budget
    prompt_chunk = 128  # numpy pads every chunk to its size, so a larger one costs a short prompt more

    # --- memory -------------------------------------------------------------------------
    def prepare(self, w: Tensor, kind: Kind = "linear") -> np.ndarray:
        """Canonical weight → what the ops take: float32 here (dequantized once at load)."""
        return np.ascontiguousarray(dequantize(w))

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.zeros(shape, dtype)

    def asarray(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a)

    def to_host(self, a) -> np.ndarray:
        return np.asarray(a)

    def mark(self) -> float:
        return time.perf_counter()  # numpy runs as it is called: the host clock is its queue

    def seconds(self, a: float, b: float) -> float:
        return b - a

    def copy_slots(self, src: list, dst: list, src_slots: list[int], dst_slots: list[int]) -> None:
        si, di = np.asarray(src_slots, np.int64), np.asarray(dst_slots, np.int64)
        for a, b in zip(src, dst):
            b[di] = a[si]

    def landing(self) -> HostLanding:
        return HOST

    def free_memory(self) -> int:
        """Bytes the OS could still give us (the KV budget's default is a fraction of this)."""
        return system_free_bytes()

    def synchronize(self) -> None:
        pass

    def device_lost(self, error: BaseException) -> bool:
        """Host memory is never lost; a DeviceLostError (raised by a fault hook) stands for one."""
        return isinstance(error, DeviceLostError)

    # --- elementwise and norms -------------------------------------------------------------
    def embed(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return table[np.asarray(ids)].astype(np.float32)

    def rmsnorm(self, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        return (x / np.sqrt(ms + np.float32(eps))) * w

    def add_rmsnorm(self, x: np.ndarray, residual: np.ndarray, w: np.ndarray, eps: float):
        """(norm(x + residual), x + residual): the residual stream and the next layer's input."""
        h = x + residual
        return self.rmsnorm(h, w, eps), h

    def silu_mul(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return gate / (np.float32(1.0) + np.exp(-gate)) * up

    def sigmoid_mul(self, x: np.ndarray, gate: np.ndarray) -> np.ndarray:
        return x / (np.float32(1.0) + np.exp(-gate))

    def rope(self, x: np.ndarray, positions: np.ndarray, theta: float, rotary_dim: int) -> np.ndarray:
        """NeoX RoPE on the first `rotary_dim` dims of every head: x [n, heads, head_dim]."""
        half = rotary_dim // 2
        inv = (1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / rotary_dim)))
        ang = positions.astype(np.float64)[:, None] * inv[None, :]
        cos = np.cos(ang).astype(np.float32)[:, None, :]
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        out = x.copy()
        a, b = x[..., :half], x[..., half:rotary_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rotary_dim] = b * cos + a * sin
        return out

    # --- matrix products -----------------------------------------------------------------
    def linear(self, x: np.ndarray, w: np.ndarray, pad_to: int = 0, fp16: bool = False,
               feeds_norm: bool = False) -> np.ndarray:
        """x [n, in] @ wᵀ. pad_to > 0: one GEMM of pad_to rows (a prompt chunk); 0: row by row. Always
        float32 (fp16 is the GPU's option)."""
        if pad_to:
            xp = np.zeros((pad_to, x.shape[1]), np.float32)
            xp[: len(x)] = x
            return (xp @ w.T)[: len(x)]
        # A one-row GEMM per row: far faster than OpenBLAS's gemv here, and the same for every batch.
        wt = w.T
        return np.concatenate([row[None] @ wt for row in x]) if len(x) else np.zeros((0, w.shape[0]), np.float32)

    def concat(self, parts: list[np.ndarray], axis: int = -1) -> np.ndarray:
        """Concatenation along `axis` (column-wise by default: [n, k_i] parts)."""
        return np.concatenate(parts, axis=axis)

    # --- attention -----------------------------------------------------------------------
    def kv_write(self, cache: Cache, layer: int, k: np.ndarray, v: np.ndarray, tables, positions) -> None:
        rows = slots(tables, positions, cache.page_tokens)
        for store, scales, x in ((cache.k, "k_scale", k), (cache.v, "v_scale", v)):
            raw, scale = encode_kv(x, cache.dtype)
            flat = store[layer].reshape(-1, *store[layer].shape[2:])
            flat[rows] = raw
            if scale is not None:
                getattr(cache, scales)[layer].reshape(-1, scale.shape[-1])[rows] = scale

    def _gather(self, cache: Cache, layer: int, table: np.ndarray, length: int):
        pos = np.arange(length)
        rows = slots(np.broadcast_to(table, (length, table.shape[-1])), pos, cache.page_tokens)
        out = []
        for store, scales in ((cache.k, "k_scale"), (cache.v, "v_scale")):
            flat = store[layer].reshape(-1, *store[layer].shape[2:])
            sc = getattr(cache, scales)[layer].reshape(-1, flat.shape[1])[rows] if cache.dtype == "fp8" else None
            out.append(decode_kv(flat[rows], sc, cache.dtype))
        return out

    def attention(self, q: np.ndarray, cache: Cache, layer: int, tables: np.ndarray, positions: np.ndarray,
                  prompt: bool = False, window: int = 1, fp16: bool = False) -> np.ndarray:
        """Causal attention of rows q [n, heads, hd] over their lanes' cached keys 0..position.

        prompt=True: all rows belong to one lane (a chunk) and are computed together; otherwise
        each row alone, so a decode row is the same whatever else is in the batch. K/V are in the
        cache before this runs, so rows of a verify window (`window` > 1) need nothing more.
        float32 whatever `fp16` says (fp16 is the GPU's option).
        """
        n, heads, hd = q.shape
        groups = [np.arange(n)] if prompt else [np.array([i]) for i in range(n)]
        out = np.empty_like(q)
        scale = np.float32(hd ** -0.5)
        for idx in groups:
            end = int(positions[idx].max()) + 1
            k, v = self._gather(cache, layer, tables[idx[0]], end)  # [L, kvh, hd]
            kvh = k.shape[1]
            g = heads // kvh
            qq = q[idx].reshape(len(idx), kvh, g, hd).transpose(1, 0, 2, 3).reshape(kvh, len(idx) * g, hd)
            s = (qq @ k.transpose(1, 2, 0)) * scale  # [kvh, rows·g, L]
            s = s.reshape(kvh, len(idx), g, end)
            mask = np.arange(end)[None, :] > positions[idx][:, None]  # [rows, L]
            s = np.where(mask[None, :, None, :], np.float32(-np.inf), s)
            s = s - s.max(-1, keepdims=True)
            p = np.exp(s)
            p /= p.sum(-1, keepdims=True)
            o = p.reshape(kvh, len(idx) * g, end) @ v.transpose(1, 0, 2)  # [kvh, rows·g, hd]
            out[idx] = o.reshape(kvh, len(idx), g, hd).transpose(1, 0, 2, 3).reshape(len(idx), heads, hd)
        return out

    # --- drafters (the math both backends share: dflash2_math) ------------------------------
    def ring_write(self, cache: Cache, layer: int, lane: int, k, v, positions) -> None:
        slots = np.asarray(positions) % cache.ring_len
        cache.ring_k[layer][lane, slots] = k
        cache.ring_v[layer][lane, slots] = v

    def ring_attention(self, q, k, v, cache: Cache, layer: int, lane: int, first: int, window: int | None,
                       causal: bool) -> np.ndarray:
        """One block's rows together: the ring's keys, then the block's, under one mask."""
        keys = np.concatenate([cache.ring_k[layer][lane].astype(np.float32), k])  # [R + B, kvh, hd]
        values = np.concatenate([cache.ring_v[layer][lane].astype(np.float32), v])
        mask = dm.ring_mask(np, cache.ring_pos[lane], first, len(q), window, causal)
        return dm.block_attention(np, q, keys, values, mask)

    def dynamic_conv(self, x, dyn, base, group: int) -> np.ndarray:
        return dm.dynamic_conv(np, x, dyn, base, group)

    def prompt_work(self) -> AbstractContextManager:
        return nullcontext()  # numpy computes as it is called: prompt work is done when it returns

    def prompt_pending(self) -> bool:
        return False

    def join_prompt(self) -> None:
        """Nothing to order: every op has finished when it returns."""

    def top_k(self, x, k: int) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(x, np.float32)
        k = min(k, x.shape[1])
        ids = np.argpartition(-x, k - 1, axis=1)[:, :k]
        return dm.ranked(np.take_along_axis(x, ids, 1), ids)

    # --- heads ----------------------------------------------------------------------------
    def decode_step(self, model: Any, rows: Rows, cache: Cache) -> np.ndarray:
        """One decode forward (no graphs here, so no padding rows and no use for the scratch page)."""
        if rows.fed is not None:
            fed = np.asarray(rows.fed, np.int32)
            rows.lanes = np.where((rows.tokens != 0) & np.isin(fed, rows.ends), -1, rows.lanes).astype(np.int32)
            rows.tokens = fed
        return model.forward(rows, cache)

    def choose(self, logits: np.ndarray, params: list[SamplingParams], positions: list[int]) -> list[int]:
        """A token per row: greedy by argmax, sampled rows keyed by (seed, absolute position)."""
        return [int(np.argmax(row)) if p.greedy else sample(row, p, pos)
                for row, p, pos in zip(logits, params, positions)]

    overlaps = False  # one thread computes in order: a step launched ahead would only wait

    def chosen(self, logits: np.ndarray, params: list[SamplingParams], positions: list[int]) -> list[int]:
        return self.choose(logits, params, positions)  # the host's tokens are their own handle

    def take(self, chosen: list[int]) -> list[int]:
        return list(chosen)

    def warm_decode(self, model: Any, cache: Cache, width: int, streams: int,
                    shapes: list[tuple[int, bool, tuple]]) -> int:
        return 0  # no graphs on the CPU: a decode step has nothing to prepare

    def graph_stats(self) -> GraphStats:
        return GraphStats()  # no graphs on the CPU

    def graph_bytes(self, cfg: ModelConfig, settings: EngineSettings) -> int:
        return 0

    # =====================================================================================
    # Qwen3.5 / Qwen3.6: Gated DeltaNet, gated RMSNorm, MoE.
    #
    # Conventions shared with the CuPy twins: float32 activations; recurrent state lives in
    # the cache's per-layer arrays, one slot per lane (plus one scratch slot), updated IN PLACE at the
    # slots named by `lanes` (decode rows) or `lane` (a prompt chunk): a slot is touched only by
    # its own lane's rows, so a stream never sees another's state. `lanes` is an int array (host
    # here; a device array inside a captured decode graph), like `tables`/`positions` for the
    # attention ops. The cache holds one slot more than there are lanes: a padding row
    # (lane -1) reads and writes that last, scratch slot (numpy's index -1 does just that).
    # Decode rows are computed one at a time; a prompt chunk as one piece of work for its lane.
    # =====================================================================================
    def conv1d_prompt(self, x: np.ndarray, w: np.ndarray, conv_state: np.ndarray, lane: int) -> np.ndarray:
        """Causal depthwise conv1d + SiLU over one lane's prompt chunk.

        x [T, C] pre-conv rows (in order), w [C, K] (w[:, K-1] on the current token),
        conv_state [slots, C, K-1] fp32: the lane's last K-1 pre-conv rows, oldest first; slot
        `lane` is replaced by the last K-1 rows of (state ++ x). Returns silu(y) [T, C] with
        y_t[c] = Σ_j w[c, j]·x_{t-K+1+j}[c], accumulated in j order (as `conv1d_step`).
        """
        T, C = x.shape
        K = w.shape[1]
        full = np.concatenate([conv_state[lane].T, x.astype(np.float32)], axis=0)  # [K-1+T, C]
        acc = w[:, 0] * full[0:T]
        for j in range(1, K):
            acc = acc + w[:, j] * full[j:j + T]
        conv_state[lane] = full[T:].T
        return acc / (np.float32(1.0) + np.exp(-acc))

    @staticmethod
    def _step_slots(lanes: np.ndarray, i: int, window: int, stride: int) -> tuple[int, int]:
        """(the slot row i steps from, the slot it writes): its lane's, or in a verify window (row
        j = i % window) from row j-1's slot (the row before it, already stepped) to lane + j·stride."""
        j = i % window
        dst = int(lanes[i]) + j * stride
        return (dst - stride if j else dst), dst

    def conv1d_step(self, x: np.ndarray, w: np.ndarray, conv_state: np.ndarray, lanes: np.ndarray, window: int = 1,
                    stride: int = 0) -> np.ndarray:
        """One decode row per lane (or per verify-window row): the causal conv1d + SiLU of
        `conv1d_prompt` for a single token.

        x [n, C], w [C, K], conv_state [slots, C, K-1] updated in place at rows' `lanes` [n] (window > 1:
        at their window slots, `Backend`'s verify windows).
        """
        n, C = x.shape
        K = w.shape[1]
        out = np.empty((n, C), np.float32)
        for i in range(n):
            src, dst = self._step_slots(lanes, i, window, stride)
            win = np.concatenate([conv_state[src], x[i].astype(np.float32)[:, None]], axis=1)  # [C, K]
            acc = w[:, 0] * win[:, 0]
            for j in range(1, K):
                acc = acc + w[:, j] * win[:, j]
            conv_state[dst] = win[:, 1:]
            out[i] = acc / (np.float32(1.0) + np.exp(-acc))
        return out

    def conv1d_step_gates(self, x: np.ndarray, w: np.ndarray, conv_state: np.ndarray, lanes: np.ndarray,
                          a: np.ndarray, b: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, window: int = 1,
                          stride: int = 0):
        """`conv1d_step` and `deltanet_gates` of decode rows: (out, g, β) (one launch on a GPU)."""
        return (self.conv1d_step(x, w, conv_state, lanes, window, stride),
                *self.deltanet_gates(a, b, a_log, dt_bias))

    def deltanet_gates(self, a: np.ndarray, b: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray):
        """(g, β) of Gated DeltaNet: g = −exp(A_log)·softplus(a + dt_bias) (log decay ≤ 0), β = sigmoid(b).

        a, b [n, Hv]; a_log, dt_bias [Hv]. fp32.
        """
        x = a.astype(np.float32) + dt_bias
        softplus = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))).astype(np.float32)
        g = -np.exp(a_log.astype(np.float32)) * softplus
        beta = np.float32(1.0) / (np.float32(1.0) + np.exp(-b.astype(np.float32)))
        return g.astype(np.float32), beta.astype(np.float32)

    @staticmethod
    def _qk_prepare(q: np.ndarray, k: np.ndarray, hv: int):
        """l2norm(q)·Dk^-½ and l2norm(k) (eps 1e-6 inside the root), key heads repeated to `hv` value heads."""
        def l2(x):
            return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True, dtype=np.float32) + np.float32(1e-6))
        rep = hv // q.shape[-2]
        q = l2(q.astype(np.float32)) * np.float32(q.shape[-1] ** -0.5)
        k = l2(k.astype(np.float32))
        if rep > 1:  # value head j reads key head j // rep
            q, k = np.repeat(q, rep, axis=-2), np.repeat(k, rep, axis=-2)
        return q, k

    def deltanet_step(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                      state: np.ndarray, lanes: np.ndarray, window: int = 1, stride: int = 0,
                      logs: tuple = ()) -> np.ndarray:
        """The Gated DeltaNet recurrence for one token per row (decode rows).

        q, k [n, Hk, Dk] raw (post-conv; l2-normalised and q scaled by Dk^-½ here), v [n, Hv, Dv],
        g, beta [n, Hv]; state [slots, Hv, Dk, Dv] fp32 updated in place at `lanes` [n]. In a verify
        window (window > 1) row 0 writes its state there and row j >= 1, which steps from row j-1's,
        writes its update to `logs` (k̂ [.., Hv, Dk], δ [.., Hv, Dv], e^g [.., Hv]) at log slot
        lane + (j-1)·stride (`Cache` docstring; `deltanet_keep` replays them).
        Per value head: S ← e^g·S; δ = β(v − Sᵀk); S ← S + k δᵀ; o = Sᵀq. Returns o [n, Hv, Dv].
        """
        n, hv, dv = v.shape
        qn, kn = self._qk_prepare(q, k, hv)
        out = np.empty((n, hv, dv), np.float32)
        S = None
        for i in range(n):
            j, lane = i % window, int(lanes[i])
            dec = np.exp(g[i])
            S = (state[lane] if j == 0 else S) * dec[:, None, None]
            m = np.einsum("hkv,hk->hv", S, kn[i])
            delta = beta[i][:, None] * (v[i].astype(np.float32) - m)
            S = S + kn[i][:, :, None] * delta[:, None, :]
            out[i] = np.einsum("hkv,hk->hv", S, qn[i])
            if j == 0:
                state[lane] = S
            else:
                at = (lane if lane >= 0 else len(state) - 1) + (j - 1) * stride
                logs[0][at], logs[1][at], logs[2][at] = kn[i], delta, dec
        return out

    def deltanet_step_norm(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                           state: np.ndarray, lanes: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float,
                           window: int = 1, stride: int = 0, logs: tuple = ()) -> np.ndarray:
        """`deltanet_step` then `gated_rmsnorm` of its output (one launch on a GPU)."""
        return self.gated_rmsnorm(self.deltanet_step(q, k, v, g, beta, state, lanes, window, stride, logs), z, w, eps)

    def deltanet_keep(self, states: list, logs: list[tuple], lane: int, first: int, last: int,
                      stride: int) -> None:
        """Window rows first..last (>= 1) of each layer's log applied to its lane slot, which holds row
        first - 1's state, with `deltanet_step`'s operations: the state after row `last`, the same bits."""
        if first < 1:
            raise ValueError(f"window row {first}: row 0's state is the lane's already (rows 1.. are logged)")
        if last < first:
            return
        for state, (kl, dl, gl) in zip(states, logs):
            S = state[lane]
            for j in range(first, last + 1):
                at = lane + (j - 1) * stride
                S = S * gl[at][:, None, None]
                S = S + kl[at][:, :, None] * dl[at][:, None, :]
            state[lane] = S

    def deltanet_prompt(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
                        state: np.ndarray, lane: int, chunk: int = 64) -> np.ndarray:
        """The chunked (WY / UT-transform) form of `deltanet_step` over one lane's prompt rows.

        Same arguments as `deltanet_step` with T rows of one lane; state slot `lane` is the initial
        state and receives the final one. Rows are cut into chunks of `chunk` from row 0 (the
        caller starts prompt chunks at absolute multiples of its chunk size, so the cut is a
        function of absolute positions); the last chunk is zero-padded (β = 0, g = 0: no effect).
        Per chunk, with γ = cumsum(g), Γ_ij = e^{γi−γj} (i ≥ j), L = strictly-lower(diag(β)KKᵀ ⊙ Γ),
        T = (I+L)⁻¹ by forward substitution, U = T·diag(β)V, W = T·diag(β e^γ)K:
        V′ = U − W S; O = diag(e^γ) Q S + (QKᵀ ⊙ Γ) V′; S ← e^{γ_C} S + (diag(e^{γ_C−γ}) K)ᵀ V′.
        Returns o [T, Hv, Dv].
        """
        T, hv, dv = v.shape
        qn, kn = self._qk_prepare(q, k, hv)
        pad = (-T) % chunk
        def tr(x):  # [T, H, ...] → [H, T, ...]
            return np.ascontiguousarray(np.swapaxes(x, 0, 1))
        qh, kh, vh = (tr(np.pad(x.astype(np.float32), ((0, pad), (0, 0), (0, 0)))) for x in (qn, kn, v))
        gh = tr(np.pad(g.astype(np.float32), ((0, pad), (0, 0))))
        bh = tr(np.pad(beta.astype(np.float32), ((0, pad), (0, 0))))
        S = state[lane].astype(np.float32)
        out = np.empty((hv, T + pad, dv), np.float32)
        lower = np.tril(np.ones((chunk, chunk), bool))
        strict = np.tril(np.ones((chunk, chunk), bool), -1)
        eye = np.eye(chunk, dtype=np.float32)
        for c0 in range(0, T + pad, chunk):
            sl = slice(c0, c0 + chunk)
            Q, K, V, G, B = qh[:, sl], kh[:, sl], vh[:, sl], gh[:, sl], bh[:, sl]
            gam = np.cumsum(G, axis=1, dtype=np.float32)  # [H, C]
            diff = gam[:, :, None] - gam[:, None, :]
            Gam = np.exp(np.where(lower, diff, np.float32(-np.inf))).astype(np.float32)  # [H, C, C]
            kb = K * B[:, :, None]
            A = -np.where(strict, (kb @ np.swapaxes(K, 1, 2)) * Gam, np.float32(0.0))
            for i in range(1, chunk):  # (I + L)⁻¹ by forward substitution, row by row
                A[:, i, :i] = A[:, i, :i] + np.einsum("hm,hmj->hj", A[:, i, :i], A[:, :i, :i])
            Tm = A + eye
            U = Tm @ (V * B[:, :, None])
            W = Tm @ (kb * np.exp(gam)[:, :, None])
            Vn = U - W @ S
            attn = (Q @ np.swapaxes(K, 1, 2)) * Gam
            out[:, sl] = (Q * np.exp(gam)[:, :, None]) @ S + attn @ Vn
            last = gam[:, -1]
            S = S * np.exp(last)[:, None, None] + np.swapaxes(K * np.exp(last[:, None] - gam)[:, :, None], 1, 2) @ Vn
        state[lane] = S
        return np.ascontiguousarray(np.swapaxes(out[:, :T], 0, 1))

    def gated_rmsnorm(self, x: np.ndarray, z: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
        """DeltaNet output norm per head: w ⊙ (x·rsqrt(mean x² + eps)) ⊙ silu(z); x, z [n, H, D], w [D] as is."""
        ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
        z = z.astype(np.float32)
        return (x / np.sqrt(ms + np.float32(eps))) * w * (z / (np.float32(1.0) + np.exp(-z)))

    def moe_route(self, logits: np.ndarray, top_k: int, shared_gate: np.ndarray | None = None):
        """Router: softmax (fp32) over all experts, top-k, renormalised. logits [n, E] →
        (experts int32 [n, k] by descending weight, lowest id first on ties; weights fp32 [n, k]).
        With the shared expert's gate logits [n, 1]: one more choice, expert E under sigmoid(gate)."""
        x = logits.astype(np.float32)
        p = np.exp(x - x.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        idx = np.argsort(-p, axis=-1, kind="stable")[:, :top_k].astype(np.int32)
        w = np.take_along_axis(p, idx, axis=-1)
        w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
        if shared_gate is None:
            return idx, w
        g = np.asarray(shared_gate, np.float32).reshape(-1, 1)
        sg = (np.float32(1.0) / (np.float32(1.0) + np.exp(-g))).astype(np.float32)
        return np.concatenate([idx, np.full_like(idx[:, :1], x.shape[1])], 1), np.concatenate([w, sg], 1)

    def moe_experts(self, x: np.ndarray, gate_up: np.ndarray, down: np.ndarray, experts: np.ndarray,
                    weights: np.ndarray, prompt: bool = False, shared: np.ndarray | None = None,
                    shared_gate: np.ndarray | None = None) -> np.ndarray:
        """Σ_j weights[:, j] · down_e(silu(gate_e x) ⊙ up_e x) over each row's experts e = experts[:, j],
        then, where `shared` [n, H] is given, + sigmoid(shared_gate)·shared (its scalar gate logit [n, 1]).

        x [n, H]; gate_up [E, 2I, H] (first I rows gate), down [E, H, I]; experts, weights [n, k].
        Decode rows (prompt=False): expert GEMVs row by row, summed in top-k order. A prompt chunk
        (prompt=True, one lane): a grouped GEMM per expert over the rows routed to it, summed in
        expert order — a function of the chunk's own rows only.
        """
        n, H = x.shape
        I = down.shape[-1]
        out = np.zeros((n, H), np.float32)
        if not prompt:
            for i in range(n):
                for j in range(experts.shape[1]):
                    e = int(experts[i, j])
                    gu = gate_up[e] @ x[i]
                    a = gu[:I] / (np.float32(1.0) + np.exp(-gu[:I])) * gu[I:]
                    out[i] += weights[i, j] * (down[e] @ a)
        else:
            for e in np.unique(experts):
                r, j = np.nonzero(experts == e)
                gu = x[r] @ gate_up[e].T
                a = gu[:, :I] / (np.float32(1.0) + np.exp(-gu[:, :I])) * gu[:, I:]
                out[r] += weights[r, j][:, None] * (a @ down[e].T)
        if shared is None:
            return out
        return out + shared / (np.float32(1.0) + np.exp(-shared_gate.astype(np.float32)))

