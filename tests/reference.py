"""Textbook float64 pieces shared by the reference forwards of the model tests."""
import numpy as np


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """q [T, heads, hd], k/v [T, kv_heads, hd] → [T, heads·hd]: GQA, causal softmax(q·kᵀ/√hd)·v."""
    T, heads, hd = q.shape
    k = np.repeat(k, heads // k.shape[1], axis=1)
    v = np.repeat(v, heads // v.shape[1], axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", p, v).reshape(T, -1)
