"""Lazy values of the CuPy backend: ops whose result the next kernel computes as it loads its input.

`rope` (and an RMSNorm over the head dim) return `Heads`, which the KV write and the attention
kernels apply as they load the heads; `rmsnorm` / `add_rmsnorm` of rows return `Normed` (and its
`Residual`) and `silu_mul` returns `SiluMul`, which the next quantized `linear` computes as it
stages its input (qmv modes 2 and 1); a MoE layer's decode rows return `Combined`, which the next
1-2 row product sums as it stages the following norm. Any other consumer materialises them, with
the same arithmetic. This saves four launches a layer (five after a MoE). A 4-16 row product that
feeds such a norm is a `Product` until then: where the next product splits its input once
(qmv_xsplit), it writes that split as it reduces its rows, one launch fewer.
"""
from __future__ import annotations

import kernels.launch as K
import kernels.launch_qwen3_5 as KQ

from .cupy_import import cupy


class Lazy:
    """Array-like until something needs the numbers: attributes and indexing materialise it."""

    def materialize(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    def __getitem__(self, idx):
        return self.materialize()[idx]

    def __len__(self):
        return self.shape[0]


class Heads(Lazy):
    """x [n, heads, D] (a view with unit dim stride) with an optional RMSNorm over D and RoPE pending
    (cs: the rows' (cos, sin) table from the backend's rope)."""

    def __init__(self, backend, x, norm=None, eps=0.0, cs=None, half=0):
        self.b, self.x, self.norm, self.eps, self.cs, self.half = backend, x, norm, eps, cs, half
        self.shape, self.dtype, self.ndim = x.shape, x.dtype, 3
        self._out = None

    @property
    def strides_el(self):
        return self.x.strides[0] // 4, self.x.strides[1] // 4

    def materialize(self):
        if self._out is None:
            n, heads, D = self.shape
            out = cupy.empty((n, heads, D), cupy.float32)
            if n:
                s0, s1 = self.strides_el
                K.heads_out(self.x, s0, s1, D, self.norm, self.eps, self.cs, self.half, out, n, heads)
            self._out = out
        return self._out


class SiluMul(Lazy):
    """silu(g) * u for [n, J] views with unit column stride; `linear` fuses it into its input staging."""

    def __init__(self, backend, g, u):
        self.b, self.g, self.u = backend, g, u
        self.shape, self.dtype, self.ndim = g.shape, g.dtype, 2
        self._out = None

    def materialize(self):
        if self._out is None:
            n, J = self.shape
            out = cupy.empty((n, J), cupy.float32)
            if n:
                K.gate_rows(self.g, self.g.strides[0] // 4, self.u, self.u.strides[0] // 4, out, J, 0, n)
            self._out = out
        return self._out


class Normed(Lazy):
    """rmsnorm(x [+ res]) * w of [n, H] rows, pending: a quantized `linear` (or the experts' gate_up)
    stages it as its input (the norm's divisor applied to the product's rows). h = x + res, the next
    residual, is written by the first such product or by materialising."""

    def __init__(self, backend, x, res, w, eps: float):
        self.b, self.x, self.res, self.w, self.eps = backend, x, res, w, float(eps)
        self.shape, self.dtype, self.ndim = x.shape, x.dtype, 2
        self.h = x if res is None else cupy.empty(x.shape, cupy.float32)
        self.h_ready = res is None
        self._out = None

    def materialize(self):
        if self._out is None:
            n, H = self.shape
            y = cupy.empty((n, H), cupy.float32)
            if n:
                x, r = self.x.materialize() if isinstance(self.x, Lazy) else self.x, self.res
                K.rmsnorm(x, x.strides[0] // 4, r, 0 if r is None else r.strides[0] // 4, self.w, y,
                          None if r is None else self.h, H, self.eps, n)
            self.h_ready, self._out = True, y
        return self._out

    def residual(self):
        if not self.h_ready:
            self.materialize()
        return self.h


class Combined(Lazy):
    """The experts' combination Σ_j weights[:, j]·y[r·k + j] of [n, H] rows, pending: a 1-2 row product
    staging rmsnorm(res + this) sums it as it loads its input (qmv's combine); anything else
    materialises it with moe_combine, the same bits."""

    def __init__(self, y, weights, k: int):
        self.y, self.weights, self.k = y, weights, k
        self.shape, self.dtype, self.ndim = (weights.shape[0], y.shape[1]), y.dtype, 2
        self._out = None

    @property
    def written(self) -> bool:
        """Whether moe_combine has written it (a product that summed it while staging does not)."""
        return self._out is not None

    def materialize(self):
        if self._out is None:
            n, H = self.shape
            self._out = cupy.empty((n, H), cupy.float32)
            KQ.moe_combine(self.y, self.weights, self.k, self._out, H, n)
        return self._out


class Product(Lazy):
    """A decode product (qmv, 4-16 rows, K in segments) whose one use is the x of an `add_rmsnorm`,
    not launched yet: `launch(split_out)` runs it, with split_out None or the next product's input
    split to write (launch.qmv's split_out)."""

    def __init__(self, launch, n: int, M: int, K: int, group: int):
        self.launch, self.M, self.K, self.group = launch, M, K, group
        self.shape, self.dtype, self.ndim = (n, M), cupy.dtype(cupy.float32), 2
        self._out = None

    @property
    def launched(self) -> bool:
        return self._out is not None

    def materialize(self, split_out=None):
        if self._out is None:
            self._out = self.launch(split_out)
        return self._out


class Residual(Lazy):
    """The h = x + res of an `add_rmsnorm`, as soon as something has written it."""

    def __init__(self, normed: Normed):
        self.n = normed
        self.shape, self.dtype, self.ndim = normed.shape, normed.dtype, 2

    def materialize(self):
        return self.n.residual()


def unit_rows(a, ndim: int) -> bool:
    """A float32 view whose last axis is contiguous and whose other strides are whole elements."""
    return (a.ndim == ndim and a.dtype == cupy.float32 and a.strides[-1] == 4
            and all(s % 4 == 0 and s >= 0 for s in a.strides))


def aligned_rows(a) -> bool:
    """Rows the kernels may read 16 bytes at a time."""
    return unit_rows(a, 2) and (a.strides[0] // 4) % 4 == 0 and a.data.ptr % 16 == 0
