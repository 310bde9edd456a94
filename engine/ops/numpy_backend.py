"""The reference backend: numpy on the CPU, float32 activations, batch-invariant by construction.

Decode rows are computed one at a time (BLAS takes other paths for one row and for many) and a
prompt chunk is always one GEMM of the same padded shape, so no row depends on its neighbours.
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

from ..weights import Affine, Tensor, dequantize

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
FP8_MAX = 448.0


class KVCache:
    """K and V of every attention layer on pages: [pages, page_tokens, kv_heads, head_dim].

    Windows and pool pages live in the same arrays; a page table turns a position into a row.
    fp8 keeps one fp32 scale per (token, head).
    """

    def __init__(self, xp, layers: int, pages: int, page_tokens: int, kv_heads: int, head_dim: int, dtype: str):
        self.page_tokens, self.dtype = page_tokens, dtype
        shape = (pages, page_tokens, kv_heads, head_dim)
        store = xp.uint16 if dtype == "bf16" else xp.uint8  # raw bits: same layout for numpy and CuPy
        self.k = [xp.zeros(shape, store) for _ in range(layers)]
        self.v = [xp.zeros(shape, store) for _ in range(layers)]
        if dtype == "fp8":
            self.k_scale = [xp.ones(shape[:3], xp.float32) for _ in range(layers)]
            self.v_scale = [xp.ones(shape[:3], xp.float32) for _ in range(layers)]

    def _arrays(self) -> list[list]:
        return [self.k, self.v] + ([self.k_scale, self.v_scale] if self.dtype == "fp8" else [])

    def read_rows(self, backend, rows: np.ndarray) -> list[tuple]:
        """Host copies of flat rows of every layer (a stream's snapshot)."""
        groups = self._arrays()
        return [tuple(backend.to_host(g[l].reshape(-1, *g[l].shape[2:])[rows]) for g in groups)
                for l in range(len(self.k))]

    def write_rows(self, backend, rows: np.ndarray, data: list[tuple]) -> None:
        for l, arrays in enumerate(data):
            for g, a in zip(self._arrays(), arrays):
                g[l].reshape(-1, *g[l].shape[2:])[rows] = backend.asarray(a)

    @property
    def nbytes(self) -> int:
        n = sum(a.nbytes for a in self.k + self.v)
        return n + (sum(a.nbytes for a in self.k_scale + self.v_scale) if self.dtype == "fp8" else 0)


def slots(tables: np.ndarray, positions: np.ndarray, page_tokens: int) -> np.ndarray:
    """Flat cache rows of (lane table, absolute position) pairs."""
    pages = tables[np.arange(len(positions)), positions // page_tokens]
    return pages.astype(np.int64) * page_tokens + positions % page_tokens


def encode_kv(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """float32 [n, heads, dim] → raw stored bits (+ per-head fp8 scales)."""
    if dtype == "bf16":
        return x.astype(BF16).view(np.uint16), None
    amax = np.abs(x).max(-1)
    scale = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1.0)).astype(np.float32)
    return (x / scale[..., None]).astype(FP8).view(np.uint8), scale


def decode_kv(raw: np.ndarray, scale: np.ndarray | None, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return raw.view(BF16).astype(np.float32)
    return raw.view(FP8).astype(np.float32) * scale[..., None]


class NumpyBackend:
    name = "numpy"
    device = "CPU"
    xp = np

    # --- memory -------------------------------------------------------------------------
    def prepare(self, w: Tensor, kind: str = "linear") -> np.ndarray:
        """Canonical weight → what the ops take: float32 here (dequantized once at load)."""
        return np.ascontiguousarray(dequantize(w))

    def kv_cache(self, layers, pages, page_tokens, kv_heads, head_dim, dtype) -> KVCache:
        return KVCache(np, layers, pages, page_tokens, kv_heads, head_dim, dtype)

    def asarray(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a)

    def to_host(self, a) -> np.ndarray:
        return np.asarray(a)

    def free_memory(self) -> int:
        """Bytes the OS could still give us (the KV budget's default is a fraction of this)."""
        try:
            with open("/proc/meminfo") as f:
                info = {l.split(":")[0]: int(l.split()[1]) * 1024 for l in f}
            return info.get("MemAvailable", 8 << 30)
        except OSError:
            return 8 << 30

    def synchronize(self) -> None:
        pass

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
    def linear(self, x: np.ndarray, w: np.ndarray, pad_to: int = 0) -> np.ndarray:
        """x [n, in] @ wᵀ. pad_to > 0: one GEMM of pad_to rows (a prompt chunk); 0: row by row."""
        if pad_to:
            xp = np.zeros((pad_to, x.shape[1]), np.float32)
            xp[: len(x)] = x
            return (xp @ w.T)[: len(x)]
        return np.stack([w @ row for row in x]) if len(x) else np.zeros((0, w.shape[0]), np.float32)

    # --- attention -----------------------------------------------------------------------
    def kv_write(self, cache: KVCache, layer: int, k: np.ndarray, v: np.ndarray, tables, positions) -> None:
        rows = slots(tables, positions, cache.page_tokens)
        for store, scales, x in ((cache.k, "k_scale", k), (cache.v, "v_scale", v)):
            raw, scale = encode_kv(x, cache.dtype)
            flat = store[layer].reshape(-1, *store[layer].shape[2:])
            flat[rows] = raw
            if scale is not None:
                getattr(cache, scales)[layer].reshape(-1, scale.shape[-1])[rows] = scale

    def _gather(self, cache: KVCache, layer: int, table: np.ndarray, length: int):
        pos = np.arange(length)
        rows = slots(np.broadcast_to(table, (length, table.shape[-1])), pos, cache.page_tokens)
        out = []
        for store, scales in ((cache.k, "k_scale"), (cache.v, "v_scale")):
            flat = store[layer].reshape(-1, *store[layer].shape[2:])
            sc = getattr(cache, scales)[layer].reshape(-1, flat.shape[1])[rows] if cache.dtype == "fp8" else None
            out.append(decode_kv(flat[rows], sc, cache.dtype))
        return out

    def attention(self, q: np.ndarray, cache: KVCache, layer: int, tables: np.ndarray, positions: np.ndarray,
                  prompt: bool = False) -> np.ndarray:
        """Causal attention of rows q [n, heads, hd] over their lanes' cached keys 0..position.

        prompt=True: all rows belong to one lane (a chunk) and are computed together; otherwise
        each row alone, so a decode row is the same whatever else is in the batch.
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

    # --- heads ----------------------------------------------------------------------------
    def logits_to_host(self, logits: np.ndarray) -> np.ndarray:
        return logits

    def argmax(self, logits: np.ndarray) -> np.ndarray:
        return np.argmax(logits, axis=-1)
