"""The attention part of the CuPy op set: K/V writes and attention over the paged cache, with the
kernels of kernels/attention.cu and kernels/attn_prompt.cu. Numpy twins: `kv_write` and `attention`
of numpy_backend.NumpyBackend (same arguments).

A decode step's K/V write is deferred: the decode attention of the same layer and rows writes the new
K/V itself (the block that owns each row's position); anything else that reads the cache first
writes them with `kv_write`'s kernel. KV bits match `kv.cache.encode_kv` either way.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

import kernels.launch as K

from ..errors import BackendError
from ..kv.cache import Cache
from .cupy_import import cupy


class AttentionOps:
    """Mixed into CupyBackend, which provides these helpers."""
    _m: Callable[[Any], Any]  # a lazy value materialised, anything else as it is
    _dev_i32: Callable[[Any], Any]  # row metadata (host or device ints) as a device int32 array
    _use: Callable[[], None]  # the backend's stream made current
    _heads: Callable[[Any], tuple]  # q/k/v heads with their pending norm and RoPE (cupy_lazy.Heads)
    _pending_kv: tuple | None  # (cache, layer, k, v, tables, positions) of a deferred kv_write

    def kv_write(self, cache: Cache, layer: int, k, v, tables, positions) -> None:
        """Deferred: the decode attention of the same layer and rows writes them as it runs (the block
        that owns each row's position); anything else that reads the cache first writes them here."""
        self._flush_kv()
        self._pending_kv = (cache, layer, k, v, tables, positions)

    def _flush_kv(self) -> None:
        if self._pending_kv is None:
            return
        cache, layer, k, v, tables, positions = self._pending_kv
        self._pending_kv = None
        self._use()
        kb, ks0, ks1, knw, keps, cs, half = self._heads(k)
        vb, vs0, vs1, *_ = self._heads(self._m(v))
        pos = self._dev_i32(positions)  # the slots
        tab = self._dev_i32(tables)
        n, KH, D = kb.shape
        if n == 0:
            return
        fp8 = cache.dtype == "fp8"
        K.kv_write(fp8, kb, ks0, ks1, knw, keps, cs, half, vb, vs0, vs1, pos, tab, cache.page_tokens, KH, D,
                   cache.k[layer], cache.v[layer], cache.k_scale[layer] if fp8 else None,
                   cache.v_scale[layer] if fp8 else None, n)

    def _take_kv(self, cache, layer: int, tables, positions):
        """The pending K/V write of exactly these rows of this layer, handed to the decode attention."""
        p = self._pending_kv
        if p is not None and p[0] is cache and p[1] == layer and p[4] is tables and p[5] is positions:
            self._pending_kv = None
            return p
        self._flush_kv()
        return None

    def attention(self, q, cache: Cache, layer: int, tables, positions, prompt: bool = False, window: int = 1,
                  fp16: bool = False):
        """Decode rows write their new K/V inside the attention kernel (the block owning the row's
        position), which rows of a verify window (window > 1) cannot wait for: row j reads rows
        0..j-1 of its window. So those write every row's K/V first and attend over the cache."""
        self._use()
        apart = prompt or window > 1
        pend = None if apart else self._take_kv(cache, layer, tables, positions)
        if apart:
            self._flush_kv()
        qb, qs0, qs1, qnw, qeps, cs, half = self._heads(q)
        n, H, D = qb.shape
        KH = cache.k[layer].shape[2]
        G = H // KH
        out = cupy.empty((n, H, D), cupy.float32)
        if n == 0:
            return out
        if G > 16 or D > 256 or D % 16 or G * D > 4096 or K.decode_smem(cache.dtype == "fp8", G, D) > 96 * 1024:
            raise BackendError(f"attention of {H} heads over {KH} kv heads of dim {D} is beyond the kernels")
        pos = self._dev_i32(positions)  # the rows' lengths
        tab = self._dev_i32(tables)
        fp8 = cache.dtype == "fp8"
        ksc = cache.k_scale[layer] if fp8 else None
        vsc = cache.v_scale[layer] if fp8 else None
        scale = float(np.float32(D ** -0.5))
        if prompt:  # key splits up to the last row's position (device rows: up to the lane's end)
            last = int(positions.max()) if isinstance(positions, np.ndarray) else tab.shape[1] * cache.page_tokens - 1
            K.attn_prompt(fp8, qb, qs0, qs1, qnw, qeps, cs, half, pos, tab, cache.page_tokens, cache.k[layer],
                          cache.v[layer], ksc, vsc, KH, G, D, scale, out, n, last, fp16)
            return out
        kn = vn = knw = None
        ks0 = ks1 = vs0 = vs1 = 0
        keps = 0.0
        if pend is not None:
            kn, ks0, ks1, knw, keps, kcs, khalf = self._heads(pend[2])
            vn, vs0, vs1, *_ = self._heads(self._m(pend[3]))
            if ((kcs is None) != (cs is None) or kn.shape[1] != KH or kn.shape[2] != D
                    or (kcs is not None and (kcs is not cs or khalf != half))):
                self._pending_kv = pend  # a layout or RoPE the fused write does not take: write it apart
                self._flush_kv()
                kn = vn = knw = None
        K.attn_decode(fp8, qb, qs0, qs1, qnw, qeps, cs, half, kn, ks0, ks1, knw, keps, vn, vs0, vs1, pos, tab,
                      cache.page_tokens, cache.k[layer], cache.v[layer], ksc, vsc, KH, G, D, scale, out, n)
        return out
