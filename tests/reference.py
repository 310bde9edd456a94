"""Textbook float64 pieces shared by the reference forwards of the model tests."""
import numpy as np


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q [T, heads, hd], k/v [T, kv_heads, hd] → [T, heads·hd]: GQA, causal softmax(q·kᵀ/√hd)·v."""
    return attention(q, k, v, np.tril(np.ones((len(q), len(k)), bool)))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """q [T, heads, hd], k/v [S, kv_heads, hd], mask [T, S] (which keys a row sees) → [T, heads·hd]."""
    T, heads, hd = q.shape
    k = np.repeat(k, heads // k.shape[1], axis=1)
    v = np.repeat(v, heads // v.shape[1], axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
    s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v).reshape(T, -1)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, theta: float, rotary_dim: int, start: int = 0) -> np.ndarray:
    """NeoX RoPE at positions start..start+T-1 on the first `rotary_dim` dims of x [T, heads, hd]."""
    half = rotary_dim // 2
    ang = np.arange(start, start + len(x))[:, None] * theta ** (-np.arange(half) * 2.0 / rotary_dim)
    a, b = x[..., :half], x[..., half:2 * half]
    cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., 2 * half:]], -1)
