"""Token choice on the CuPy backend: rows of logits to tokens with kernels/sampling.cu (argmax, or
top-k sampling keyed by uniform(seed, position): `engine.sampling.sample`'s choice), and the tokens a
decode graph already chose (`chosen` / `take`: the handle that run-ahead feeds to the next step).
Numpy twins: `choose`, `chosen` and `take` of numpy_backend.NumpyBackend.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

import kernels.launch as K

from ..sampling import sample, uniform
from ..settings import SamplingParams
from . import cupy_graphs
from .cupy_import import cupy


class ChoiceOps:
    """Mixed into CupyBackend, which provides these helpers."""
    _use: Callable[[], None]  # the backend's stream made current
    _rows2d: Callable[[Any], Any]  # logits as a 2-D device array of rows
    to_host: Callable[[Any], np.ndarray]
    stream: Any  # the backend's decode stream
    graphs: bool  # decode steps replay captured graphs
    _chosen: tuple | None  # (logits, (params, positions), tokens, mode) a graph's step already chose

    def choose(self, logits, params: list[SamplingParams], positions: list[int]) -> list[int]:
        """Tokens for rows of logits, chosen on the device (kernels/sampling.cu: argmax, or top-k
        sampling keyed by uniform(seed, position)) with one copy back; a row the kernel cannot take
        (no top-k, or k beyond its room) by `sample` on the host."""
        self._use()
        chosen, self._chosen = self._chosen, None
        if chosen is not None and chosen[0] is logits and chosen[1] == (params, positions):
            return self._finish_choice(logits, params, positions, chosen[2], chosen[3])
        logits = self._rows2d(logits)
        n, V = logits.shape
        if not n:
            return []
        mode, kmode, par = self._sampling_inputs(params, positions, V)
        out = cupy.empty(n, cupy.int32)
        K.sample(logits, logits.strides[0] // 4, V, cupy.asarray(kmode), cupy.asarray(par), out, n)
        return self._finish_choice(logits, params, positions, out, mode)

    @staticmethod
    def _sampling_inputs(params: list[SamplingParams], positions: list[int],
                         V: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mode, the kernel's mode, parameters) per row: mode -1 greedy, top-k, or 0 for rows the host
        samples (no top-k, or k beyond the kernel's room), which the kernel runs on its cheap greedy path;
        parameters (temperature, top_p, uniform(seed, position))."""
        kmax = min(K.SAMPLE_MAX_K, V - 1)
        mode = np.array([-1 if p.greedy else (p.top_k if 0 < p.top_k <= kmax else 0) for p in params], np.int32)
        par = np.array([(p.temperature, p.top_p, uniform(p.seed, pos)) for p, pos in zip(params, positions)],
                       np.float64).reshape(len(params), 3)
        return mode, np.where(mode == 0, -1, mode).astype(np.int32), par

    def _finish_choice(self, logits, params: list[SamplingParams], positions: list[int], out, mode) -> list[int]:
        """The kernel's tokens (`out` back in one copy); the rows it could not take (mode 0) sampled on
        the host."""
        toks = self.to_host(out[:len(params)]).tolist()
        host = [i for i, p in enumerate(params) if mode[i] == 0]
        if host:
            logits = self._rows2d(logits)
        for i in host:
            toks[i] = sample(self.to_host(logits[i]), params[i], positions[i])
        return toks

    @property
    def overlaps(self) -> bool:
        return self.graphs

    def chosen(self, logits, params: list[SamplingParams], positions: list[int]):
        c = self._chosen
        if c is None or c[0] is not logits or c[1] != (params, positions) or (c[3] == 0).any():
            return None
        self._chosen = None
        return cupy_graphs.Chosen(c[2], self.stream, params, positions)

    def take(self, chosen) -> list[int]:
        return chosen.tokens()
