"""The drafter ops of the CuPy backend (DFlash2's block over a stream's context ring), composed of
CuPy's own array ops (no kernels of ours): the math of `dflash2_math`, as the numpy backend runs
it. A block is a handful of rows, so these are small launches beside the target's forward."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import dflash2_math as dm
from .cupy_import import cupy


class DrafterOps:
    """Mixed into CupyBackend, which provides `_m` (a lazy value materialised)."""
    _m: Callable[[Any], Any]

    def _f32(self, x):
        return cupy.ascontiguousarray(self._m(x), dtype=cupy.float32)

    def ring_write(self, cache, layer: int, lane: int, k, v, positions) -> None:
        slots = cupy.asarray(np.asarray(positions, np.int64) % cache.ring_len)
        cache.ring_k[layer][lane, slots] = self._f32(k).astype(cupy.float16)
        cache.ring_v[layer][lane, slots] = self._f32(v).astype(cupy.float16)

    def ring_attention(self, q, k, v, cache, layer: int, lane: int, first: int, window: int | None, causal: bool):
        keys = cupy.concatenate([cache.ring_k[layer][lane].astype(cupy.float32), self._f32(k)])
        values = cupy.concatenate([cache.ring_v[layer][lane].astype(cupy.float32), self._f32(v)])
        q = self._f32(q)
        mask = dm.ring_mask(cupy, cache.ring_pos[lane], first, len(q), window, causal)
        return cupy.ascontiguousarray(dm.block_attention(cupy, q, keys, values, mask))

    def dynamic_conv(self, x, dyn, base, group: int):
        return dm.dynamic_conv(cupy, self._f32(x), self._f32(dyn), base, group)

    def top_k(self, x, k: int) -> tuple[np.ndarray, np.ndarray]:
        x = self._f32(x)
        k = min(k, x.shape[1])
        ids = cupy.argpartition(-x, k - 1, axis=1)[:, :k]
        values = cupy.take_along_axis(x, ids, 1)
        return dm.ranked(cupy.asnumpy(values), cupy.asnumpy(ids))
