"""Weights on the GPU: what `CupyBackend.prepare` makes of a canonical tensor.

Affine 4- and 8-bit matrices stay quantized, repacked once into the tile layout of the tensor-core
GEMV (`QWeight`, and `QExperts` for stacked experts); expert layouts qmv does not take stay as
stored (`ExpertWeight`, for moe.cu's moe_gemv); anything else becomes float32 (`DenseWeight` for
products, plain arrays for norms and conv kernels).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

import kernels.launch as K

from ..errors import BackendError
from ..weights import Affine, Tensor, dequantize
from .base import Kind
from .cupy_import import cupy

GIB = 1 << 30
# The ST argument of the kernels (common.cuh load_sb, moe.cu moe_sb): how scales and biases are stored.
SCALE_TYPES = {"float16": 0, "bfloat16": 1, "float32": 2}


def raw16(a) -> "cupy.ndarray":
    """fp16/bf16 values (host ml_dtypes or already on the device) → their raw 16 bits on the device."""
    if isinstance(a, cupy.ndarray):
        return cupy.ascontiguousarray(a).view(cupy.uint16)
    return cupy.asarray(np.ascontiguousarray(a).view(np.uint16))


class QWeight:
    """Affine-quantized [M, K] weight in qmv's tile layout (see kernels/gemv.cu)."""

    def __init__(self, w: Affine):
        if w.packed.ndim != 2:
            raise BackendError("stacked (expert) affine weights are not supported by the CuPy GEMV yet")
        M, words = w.packed.shape
        self.bits, self.group, self.M = w.bits, w.group, M
        self.K = words * 32 // w.bits
        self.shape = (self.M, self.K)
        self.nbytes = int(w.packed.nbytes + w.scales.nbytes + w.biases.nbytes)  # what a product reads
        self.Mp = -(-M // K.TM_ROWS) * K.TM_ROWS
        self.codes = K.repack(cupy.ascontiguousarray(cupy.asarray(w.packed, dtype=cupy.uint32)), w.bits, M, self.K,
                              self.Mp)
        self.st, self.sb = _pack_scales(w.scales, w.biases, self.Mp, K.padded_subgroups(self.K) * 32 // w.group)

    @staticmethod
    def supports(w: Affine) -> bool:
        K_ = w.packed.shape[-1] * 32 // w.bits
        return w.packed.ndim == 2 and w.bits in K.QMV_BITS and w.group in K.QMV_GROUPS and K_ % w.group == 0

    def dequantize(self):
        out = cupy.empty((self.M, self.K), cupy.float32)
        K.dequant(self.codes, self.sb, self.st, self.bits, self.M, self.K, self.group, out)
        return out


def _pack_scales(scales, biases, Mp: int, NGp: int):
    """(scale type, pairs [Mp/16][NGp][16]): zero pairs past the real rows and groups."""
    name = np.dtype(scales.dtype).name
    if name not in SCALE_TYPES or np.dtype(biases.dtype).name != name:
        raise BackendError(f"affine scales of dtype {name} are not supported (fp16, bf16 or fp32)")
    st = SCALE_TYPES[name]
    M, NG = scales.shape
    if st == 2:
        pair = cupy.stack([cupy.asarray(scales, dtype=cupy.float32), cupy.asarray(biases, dtype=cupy.float32)], -1)
        out = cupy.zeros((Mp, NGp, 2), cupy.float32)
        out[:M, :NG] = pair
        out = out.reshape(Mp // 16, 16, NGp, 2).transpose(0, 2, 1, 3)
    else:
        pair = raw16(scales).astype(cupy.uint32) | (raw16(biases).astype(cupy.uint32) << 16)
        out = cupy.zeros((Mp, NGp), cupy.uint32)
        out[:M, :NG] = pair
        out = out.reshape(Mp // 16, 16, NGp).transpose(0, 2, 1)
    return st, cupy.ascontiguousarray(out)


class DenseWeight:
    """A float32 [M, K] weight (non-quantized checkpoints, or formats the GEMV does not take)."""

    def __init__(self, w):
        self.w = cupy.ascontiguousarray(cupy.asarray(w, dtype=cupy.float32))
        self.M, self.K = self.w.shape
        self.shape = (self.M, self.K)
        self.nbytes = int(self.w.nbytes)

    def dequantize(self):
        return self.w


class QExperts:
    """Stacked affine expert weights [E, M, K] in qmv's tile layout, expert after expert, each padded
    to Mp rows (kernels/gemv.cu, EX 1)."""

    def __init__(self, w: Affine):
        self.bits, self.group = w.bits, w.group
        self.E, self.M, words = w.packed.shape
        self.K = words * 32 // w.bits
        self.shape = (self.E, self.M, self.K)
        self.nbytes = int(w.packed.nbytes + w.scales.nbytes + w.biases.nbytes)
        self.Mp = -(-self.M // K.TM_ROWS) * K.TM_ROWS
        E, M, Mp = self.E, self.M, self.Mp
        packed = cupy.asarray(w.packed, dtype=cupy.uint32)
        NGp = K.padded_subgroups(self.K) * 32 // w.group
        if Mp == M:  # whole padded tiles: the stacked matrix's layout is each expert's in turn
            self.codes = K.repack(cupy.ascontiguousarray(packed.reshape(E * M, words)), w.bits, E * M, self.K, E * M)
            self.st, self.sb = _pack_scales(w.scales.reshape(E * M, -1), w.biases.reshape(E * M, -1), E * M, NGp)
        else:
            self.codes = cupy.concatenate([K.repack(cupy.ascontiguousarray(packed[e]), w.bits, M, self.K, Mp)
                                           for e in range(E)])
            pairs = [_pack_scales(w.scales[e], w.biases[e], Mp, NGp) for e in range(E)]
            self.st, self.sb = pairs[0][0], cupy.concatenate([sb.reshape(-1) for _, sb in pairs])

    @staticmethod
    def supports(w) -> bool:
        if not (isinstance(w, Affine) and w.packed.ndim == 3):
            return False
        K_ = w.packed.shape[-1] * 32 // w.bits
        dt = np.dtype(w.scales.dtype)
        return (w.bits in K.QMV_BITS and w.group in K.QMV_GROUPS and K_ % w.group == 0
                and dt.name in SCALE_TYPES and np.dtype(w.biases.dtype) == dt)

    def dequantize(self):
        out = cupy.empty(self.shape, cupy.float32)
        nc, ns = self.codes.size // self.E, self.sb.size // self.E
        for e in range(self.E):
            K.dequant(self.codes[e * nc:(e + 1) * nc], self.sb.reshape(-1)[e * ns:(e + 1) * ns], self.st, self.bits,
                      self.M, self.K, self.group, out[e])
        return out


class ExpertWeight:
    """Stacked affine expert weights [E, M, K] on the device as stored: uint32 codes, scales, biases
    (the layouts qmv does not take: GGUF blocks of 16, for instance)."""

    def __init__(self, w: Affine):
        self.bits, self.group = w.bits, w.group
        self.E, self.M, words = w.packed.shape
        self.K = words * 32 // w.bits
        self.shape = (self.E, self.M, self.K)
        self.codes = cupy.ascontiguousarray(cupy.asarray(w.packed, dtype=cupy.uint32))
        self.st = SCALE_TYPES[np.dtype(w.scales.dtype).name]
        if self.st == 2:
            self.scales = cupy.ascontiguousarray(cupy.asarray(w.scales, dtype=cupy.float32))
            self.biases = cupy.ascontiguousarray(cupy.asarray(w.biases, dtype=cupy.float32))
        else:
            self.scales, self.biases = raw16(w.scales), raw16(w.biases)
        self.nbytes = int(self.codes.nbytes + self.scales.nbytes + self.biases.nbytes)

    @staticmethod
    def supports(w) -> bool:
        if not (isinstance(w, Affine) and w.packed.ndim == 3 and w.bits in (4, 8)):
            return False
        K = w.packed.shape[-1] * 32 // w.bits
        return (np.dtype(w.scales.dtype).name in SCALE_TYPES and np.dtype(w.biases.dtype) == np.dtype(w.scales.dtype)
                and K % w.group == 0 and w.group % (32 // w.bits) == 0)

    def dequantize(self):
        host = Affine(cupy.asnumpy(self.codes), cupy.asnumpy(self.scales), cupy.asnumpy(self.biases), self.bits,
                      self.group)
        if self.st != 2:
            import ml_dtypes
            dt = np.float16 if self.st == 0 else ml_dtypes.bfloat16
            host = Affine(host.packed, host.scales.view(dt), host.biases.view(dt), self.bits, self.group)
        return cupy.asarray(dequantize(host))


def prepare_experts(w):
    """Stacked expert weights → QExperts (qmv's layout), ExpertWeight (other affine 4/8-bit) or a
    float32 [E, M, K] device array."""
    if QExperts.supports(w):
        return QExperts(w)
    if ExpertWeight.supports(w):
        return ExpertWeight(w)
    if isinstance(w, cupy.ndarray):
        return cupy.ascontiguousarray(w, dtype=cupy.float32)
    return cupy.asarray(np.ascontiguousarray(dequantize(w)))  # float32 on the host first (bf16 included)


def prepare(w: Tensor, kind: Kind, free_memory: Callable[[], int]):
    """A canonical weight (host, or affine codes already on the device) → what the CuPy ops take."""
    if kind == "experts":
        return prepare_experts(w)
    if isinstance(w, Affine):
        if kind in ("linear", "embed") and QWeight.supports(w):
            return _checked(lambda: QWeight(w), w.nbytes, free_memory)
        if kind in ("linear", "embed"):
            return _checked(lambda: DenseWeight(_host_or_dev_dequant(w)), 4 * int(np.prod(w.shape)), free_memory)
        return cupy.asarray(_host_or_dev_dequant(w), dtype=cupy.float32)
    a = w if isinstance(w, cupy.ndarray) else np.asarray(w)
    if kind in ("linear", "embed") and a.ndim == 2:
        return _checked(lambda: DenseWeight(a if isinstance(a, cupy.ndarray) else a.astype(np.float32)),
                        4 * a.size, free_memory)
    return cupy.asarray(a if isinstance(a, cupy.ndarray) else a.astype(np.float32), dtype=cupy.float32)


def _host_or_dev_dequant(w: Affine):
    if isinstance(w.packed, cupy.ndarray):
        w = Affine(cupy.asnumpy(w.packed), cupy.asnumpy(w.scales), cupy.asnumpy(w.biases), w.bits, w.group)
    return dequantize(w)


def _checked(make, nbytes: int, free_memory: Callable[[], int]):
    free = free_memory()
    if nbytes > free:
        raise BackendError(f"the model's weights do not fit in GPU memory ({nbytes / GIB:.2f} GiB more needed, "
                           f"{free / GIB:.2f} GiB free); pick a smaller model or --backend numpy")
    return make()
