"""The array math of the DFlash2 drafter's ops, written once for numpy and CuPy (`xp`): both
backends run it as it is (the drafter's bits need not match across backends: drafts are verified).
"""
from __future__ import annotations

import numpy as np


def ring_mask(xp, ring_pos, first: int, B: int, window: int | None, causal: bool):
    """[B, R + B]: the keys each block row sees. Ring slots that hold a position before the block
    (within the row's window), then the block's rows (all of them, or up to the row when causal)."""
    rows = first + xp.arange(B)[:, None]
    ring = xp.broadcast_to((ring_pos[None, :] >= 0) & (ring_pos[None, :] < first), (B, len(ring_pos)))
    if window is not None:
        ring = ring & (ring_pos[None, :] > rows - window)
    own = xp.tri(B, dtype=bool) if causal else xp.ones((B, B), bool)
    return xp.concatenate([ring, own], axis=1)


def block_attention(xp, q, keys, values, mask):
    """Softmax attention of rows q [B, heads, hd] over keys, values [L, kv heads, hd] where mask [B, L]."""
    B, heads, hd = q.shape
    kvh = keys.shape[1]
    g = heads // kvh
    qq = q.reshape(B, kvh, g, hd).transpose(1, 0, 2, 3).reshape(kvh, B * g, hd)
    s = (qq @ keys.transpose(1, 2, 0)).reshape(kvh, B, g, -1) * xp.float32(hd ** -0.5)
    s = xp.where(mask[None, :, None, :], s, xp.float32(-np.inf))
    s = s - s.max(-1, keepdims=True)
    p = xp.exp(s)
    p /= p.sum(-1, keepdims=True)
    o = p.reshape(kvh, B * g, -1) @ values.transpose(1, 0, 2)
    return o.reshape(kvh, B, g, hd).transpose(1, 0, 2, 3).reshape(B, heads, hd)


def dynamic_conv(xp, x, dyn, base, group: int):
    """y_t = Σ_o (base[o] + dyn_t[o] per group of channels) · x_{t-o}, rows before the block zero."""
    B, H = x.shape
    taps = base.shape[0]
    dyn = xp.repeat(dyn.reshape(B, taps, H // group), group, axis=2)  # [B, taps, H]
    y = xp.zeros((B, H), xp.float32)
    for o in range(min(taps, B)):
        y[o:] += (base[o] + dyn[o:, o]) * x[:B - o]
    return y


def ranked(values: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (value, id) pairs, host arrays, largest first and equal values in id order."""
    order = np.lexsort((ids, -values), axis=-1)
    return np.take_along_axis(values, order, 1).astype(np.float32), np.take_along_axis(ids, order, 1).astype(np.int64)
