"""Token choice: greedy argmax, or temperature/top-k/top-p keyed by (seed, absolute position).

The random number is a pure function of the seed and the position of the token being chosen, so
sampled output does not depend on batching, paging or interruptions.
"""
from __future__ import annotations

import numpy as np

from .settings import SamplingParams

_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """A number in [0, 1) for (seed, position): 53 random bits."""
    return (splitmix64(splitmix64(seed & _MASK) ^ (position & _MASK)) >> 11) / float(1 << 53)


def sample(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    """Choose the token at absolute `position` from one row of float32 logits. The weights stay
    unnormalised and are summed in order, as the GPU sampler (kernels/sampling.cu) sums them."""
    logits = np.asarray(logits, dtype=np.float64).ravel()
    if params.greedy:
        return int(np.argmax(logits))
    order = np.argsort(-logits, kind="stable")  # ties keep index order
    if params.top_k:
        order = order[: params.top_k]
    z = logits[order] / params.temperature
    cdf = np.cumsum(np.exp(z - z[0]))
    if params.top_p < 1.0:
        cdf = cdf[: int(np.searchsorted(cdf, params.top_p * cdf[-1]) + 1)]
    i = int(np.searchsorted(cdf, uniform(params.seed, position) * cdf[-1], side="right"))
    return int(order[min(i, len(cdf) - 1)])
