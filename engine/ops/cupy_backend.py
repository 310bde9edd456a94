"""The GPU backend: the op set of `numpy_backend.NumpyBackend` on CuPy, with kernels from kernels/.

Same models, KV store and scheduler as the numpy reference. What differs is inside:

- Weights. Affine 4- and 8-bit weights stay quantized on the device, repacked once into the tile
  layout of the tensor-core GEMV (`QWeight`); dense weights become float32 (`DenseWeight`).
- Lazy ops. `rope` (and an RMSNorm over the head dim) return a `_Heads` that the KV write and the
  attention kernels apply as they load the heads; `rmsnorm` / `add_rmsnorm` of rows return a
  `_Normed` and `silu_mul` a `_SiluMul` that the next `linear` computes as it stages its input
  (qmv modes 2 and 1). Any other consumer materialises them (`_m`). This saves four launches a
  layer.
- Exactness. One kernel per op for every row count: the GEMV computes every row with the same
  arithmetic (its K segments depend on the weight shape only) and reads each weight once for all
  rows; decode attention splits keys at absolute 256-position chunks merged in chunk order;
  prompt chunks use the same GEMV, so no GEMM ever mixes rows. KV bits match `encode_kv`.
- CUDA graphs. `decode_step` (called by the scheduler) pads a decode batch to the next power of two
  with rows that write to the scheduler's scratch page, copies tokens, positions, lanes and page
  tables into device buffers of that batch size, and replays the graph captured for it (the first
  step of a size runs eagerly, then captures).

All work goes to one non-blocking CUDA stream, made current (`_use`) by every entry point: the
engine thread owns every GPU call. (Never `with stream:` here: leaving such a block makes the
stream below it on CuPy's stack current, the legacy stream, whatever `use()` said before.)
"""
from __future__ import annotations

import sys
import weakref

import numpy as np

from ..errors import BackendError, PlanError
from ..memory import gpu_free_bytes, is_unified
from ..weights import Affine, dequantize
from .numpy_backend import KVCache

try:  # the import is only attempted when get_backend chose this backend
    import cupy
except Exception as e:  # pragma: no cover - get_backend reports why first
    raise BackendError(f"CuPy is not usable ({type(e).__name__}: {e})") from None

import kernels.launch as K

from .cupy_qwen3_5 import Qwen35Ops, prepare_experts  # Gated DeltaNet, gated RMSNorm, MoE

GIB = 1 << 30
MAX_GRAPH_ROWS = 256  # larger decode batches run eagerly
_SCALE_TYPES = {"float16": 0, "bfloat16": 1, "float32": 2}


# --- weights ----------------------------------------------------------------------------------
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
        self.st, self.sb = _pack_scales(w.scales, w.biases, self.Mp)

    @staticmethod
    def supports(w: Affine) -> bool:
        K_ = w.packed.shape[-1] * 32 // w.bits
        return w.packed.ndim == 2 and w.bits in K.QMV_BITS and w.group in K.QMV_GROUPS and K_ % w.group == 0

    def dequantize(self):
        out = cupy.empty((self.M, self.K), cupy.float32)
        K.dequant(self.codes, self.sb, self.st, self.bits, self.M, self.K, self.group, out)
        return out


def _raw16(a):
    """fp16/bf16 scales as raw uint16 on the device (CuPy has no bf16 dtype)."""
    if isinstance(a, cupy.ndarray):
        return a.view(cupy.uint16)
    return cupy.asarray(np.ascontiguousarray(a).view(np.uint16))


def _pack_scales(scales, biases, Mp: int):
    name = np.dtype(scales.dtype).name
    if name not in _SCALE_TYPES or np.dtype(biases.dtype).name != name:
        raise BackendError(f"affine scales of dtype {name} are not supported (fp16, bf16 or fp32)")
    st = _SCALE_TYPES[name]
    M, NG = scales.shape
    if st == 2:
        pair = cupy.stack([cupy.asarray(scales, dtype=cupy.float32), cupy.asarray(biases, dtype=cupy.float32)], -1)
        out = cupy.zeros((Mp, NG, 2), cupy.float32)
        out[:M] = pair
        out = out.reshape(Mp // 16, 16, NG, 2).transpose(0, 2, 1, 3)
    else:
        pair = _raw16(scales).astype(cupy.uint32) | (_raw16(biases).astype(cupy.uint32) << 16)
        out = cupy.zeros((Mp, NG), cupy.uint32)
        out[:M] = pair
        out = out.reshape(Mp // 16, 16, NG).transpose(0, 2, 1)
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


# --- lazy values ----------------------------------------------------------------------------------
class _Lazy:
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


class _Heads(_Lazy):
    """x [n, heads, D] (a view with unit dim stride) with an optional RMSNorm over D and RoPE pending."""

    def __init__(self, backend, x, norm=None, eps=0.0, pos=None, inv=None, half=0):
        self.b, self.x, self.norm, self.eps, self.pos, self.inv, self.half = backend, x, norm, eps, pos, inv, half
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
                K.heads_out(self.x, s0, s1, D, self.norm, self.eps, self.pos, self.inv, self.half, out, n, heads)
            self._out = out
        return self._out


class _SiluMul(_Lazy):
    """silu(g) * u for [n, J] views with unit column stride; `linear` fuses it into its input load."""

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


class _Normed(_Lazy):
    """rmsnorm(x [+ res]) * w of [n, H] rows, pending: a quantized `linear` stages it as its input
    (the norm's divisor applied to the product's rows). h = x + res, the next residual, is written by
    the first such product or by materialising."""

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
                x, r = self.x, self.res
                K.rmsnorm(x, x.strides[0] // 4, r, 0 if r is None else r.strides[0] // 4, self.w, y,
                          None if r is None else self.h, H, self.eps, n)
            self.h_ready, self._out = True, y
        return self._out

    def residual(self):
        if not self.h_ready:
            self.materialize()
        return self.h


class _Residual(_Lazy):
    """The h = x + res of an `add_rmsnorm`, as soon as something has written it."""

    def __init__(self, normed: _Normed):
        self.n = normed
        self.shape, self.dtype, self.ndim = normed.shape, normed.dtype, 2

    def materialize(self):
        return self.n.residual()


def _unit_rows(a, ndim: int) -> bool:
    """A float32 view whose last axis is contiguous and whose other strides are whole elements."""
    return (a.ndim == ndim and a.dtype == cupy.float32 and a.strides[-1] == 4
            and all(s % 4 == 0 and s >= 0 for s in a.strides))


def _aligned_rows(a) -> bool:
    """Rows the kernels may read 16 bytes at a time."""
    return _unit_rows(a, 2) and (a.strides[0] // 4) % 4 == 0 and a.data.ptr % 16 == 0


class _GraphEntry:
    def __init__(self, B: int, W: int):
        self.B, self.W = B, W
        self.host = np.zeros(B * (3 + W), np.int32)
        self.dev = cupy.zeros(B * (3 + W), cupy.int32)
        self.graph = None
        self.out = None
        self.failed = False

    def views(self):
        B, W, d = self.B, self.W, self.dev
        return d[:B], d[B:2 * B], d[2 * B:3 * B], d[3 * B:].reshape(B, W)


class CupyBackend(Qwen35Ops):
    name = "cupy"
    xp = cupy

    def __init__(self):
        try:
            dev = cupy.cuda.Device()
            props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        except Exception as e:
            raise BackendError(f"--backend cupy: no usable CUDA device ({e})") from None
        self.device = f"{props['name'].decode()} (sm_{dev.compute_capability})"
        self.unified_memory = is_unified(dev.attributes)  # GB10: the GPU's memory is the desktop's
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._use()
        self._graph_pool = cupy.cuda.MemoryPool()
        self._graphs: dict[int, dict] = {}
        self._inv: dict[tuple, object] = {}
        self._uploads: list[tuple] = []
        self._pending_kv = None  # (cache, layer, k, v, tables, positions) of a deferred kv_write
        self.graphs = True
        self.graph_failures: list[str] = []

    def _use(self) -> None:
        """Make this backend's stream the current one (cheap when it already is)."""
        if cupy.cuda.get_current_stream() is not self.stream:
            self.stream.use()

    # --- memory -------------------------------------------------------------------------
    def prepare(self, w, kind: str = "linear"):
        self._use()
        if kind == "experts":
            return prepare_experts(w)
        if isinstance(w, Affine):
            if kind in ("linear", "embed") and QWeight.supports(w):
                return self._checked(lambda: QWeight(w), w.nbytes)
            if kind in ("linear", "embed"):
                return self._checked(lambda: DenseWeight(self._host_or_dev_dequant(w)), 4 * int(np.prod(w.shape)))
            return cupy.asarray(self._host_or_dev_dequant(w), dtype=cupy.float32)
        a = w if isinstance(w, cupy.ndarray) else np.asarray(w)
        if kind in ("linear", "embed") and a.ndim == 2:
            return self._checked(lambda: DenseWeight(a if isinstance(a, cupy.ndarray) else a.astype(np.float32)),
                                 4 * a.size)
        return cupy.asarray(a if isinstance(a, cupy.ndarray) else a.astype(np.float32), dtype=cupy.float32)

    @staticmethod
    def _host_or_dev_dequant(w: Affine):
        if isinstance(w.packed, cupy.ndarray):
            w = Affine(cupy.asnumpy(w.packed), cupy.asnumpy(w.scales), cupy.asnumpy(w.biases), w.bits, w.group)
        return dequantize(w)

    def _checked(self, make, nbytes: int):
        if nbytes > self.free_memory():
            raise BackendError(f"the model's weights do not fit in GPU memory ({nbytes / GIB:.2f} GiB more needed, "
                               f"{self.free_memory() / GIB:.2f} GiB free); pick a smaller model or --backend numpy")
        return make()

    def kv_cache(self, layers, pages, page_tokens, kv_heads, head_dim, dtype) -> KVCache:
        per = head_dim * 2 if dtype == "bf16" else head_dim + 4
        need = layers * pages * page_tokens * kv_heads * per * 2
        free = self.free_memory()
        if need > free:
            raise PlanError(f"the KV cache needs {need / GIB:.2f} GiB but the GPU has {free / GIB:.2f} GiB free; "
                            "lower --memory-gib (or context or parallel), or use --kv-dtype fp8")
        self._use()
        return KVCache(cupy, layers, pages, page_tokens, kv_heads, head_dim, dtype)

    def asarray(self, a):
        if isinstance(a, (cupy.ndarray, _Lazy)):
            return a
        self._use()
        return cupy.asarray(a)

    def to_host(self, a) -> np.ndarray:
        self._use()
        self._flush_kv()
        if isinstance(a, _Lazy):
            a = a.materialize()
        if isinstance(a, cupy.ndarray):
            return cupy.asnumpy(a, stream=self.stream)
        return np.asarray(a)

    def free_memory(self) -> int:
        free, _total = cupy.cuda.runtime.memGetInfo()
        return int(gpu_free_bytes(self.unified_memory, free, cupy.get_default_memory_pool().free_bytes()))

    def synchronize(self) -> None:
        self._use()
        self._flush_kv()
        self.stream.synchronize()

    # --- helpers --------------------------------------------------------------------------
    def _m(self, x):
        return x.materialize() if isinstance(x, _Lazy) else x

    def _dev_i32(self, a):
        """Row metadata on the device: device arrays pass through; a host array is uploaded once
        per object (the same tables and positions serve every layer of a forward)."""
        if isinstance(a, cupy.ndarray):
            return a if a.dtype == cupy.int32 else a.astype(cupy.int32)
        for host, dev in self._uploads:
            if host is a:
                return dev
        dev = cupy.asarray(np.ascontiguousarray(a, dtype=np.int32))
        self._uploads = [(a, dev)] + self._uploads[:7]
        return dev

    def _inv_freq(self, theta: float, rotary_dim: int):
        key = (float(theta), int(rotary_dim))
        if key not in self._inv:
            half = rotary_dim // 2
            inv = 1.0 / (theta ** (np.arange(half, dtype=np.float64) * 2.0 / rotary_dim))
            self._inv[key] = cupy.asarray(inv)
        return self._inv[key]

    def _rows2d(self, x):
        """A [n, K] float32 device view usable by the kernels (16-byte aligned rows)."""
        x = self._m(x)
        if not isinstance(x, cupy.ndarray):
            x = cupy.asarray(x, dtype=cupy.float32)
        if not _aligned_rows(x):
            x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        return x

    def _heads(self, x):
        """(base view, s0, s1, norm, eps, pos, inv, half) of a heads input, lazy or not."""
        if isinstance(x, _Heads):
            s0, s1 = x.strides_el
            return x.x, s0, s1, x.norm, x.eps, x.pos, x.inv, x.half
        x = self._m(x)
        if not _unit_rows(x, 3):
            x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        return x, x.strides[0] // 4, x.strides[1] // 4, None, 0.0, None, None, 0

    # --- elementwise and norms ----------------------------------------------------------------
    def embed(self, table, ids):
        self._use()  # the first op of every forward
        ids = self._dev_i32(ids)
        n = len(ids)
        out = cupy.empty((n, table.K), cupy.float32)
        if n:
            if isinstance(table, QWeight):
                K.embed_q(ids, table.codes, table.sb, table.st, table.bits, table.K, table.group, out)
            else:
                K.embed_dense(ids, table.w, table.K, out)
        return out

    def rmsnorm(self, x, w, eps: float):
        self._use()
        if isinstance(x, _Heads) and x.norm is None and x.inv is None:
            x = x.x
        if (isinstance(x, cupy.ndarray) and x.ndim == 3 and w.shape[0] == x.shape[-1] and _unit_rows(x, 3)
                and x.shape[-1] <= 256):
            return _Heads(self, x, norm=w, eps=float(eps))
        x = self._m(x)
        if x.ndim == 2:
            return _Normed(self, self._rows2d(x), None, w, eps)
        shape = x.shape
        x2 = self._rows2d(x.reshape(-1, shape[-1]))
        y = cupy.empty(x2.shape, cupy.float32)
        if len(x2):
            K.rmsnorm(x2, x2.strides[0] // 4, None, 0, w, y, None, shape[-1], eps, len(x2))
        return y.reshape(shape)

    def add_rmsnorm(self, x, residual, w, eps: float):
        """(rmsnorm(x + residual) * w, x + residual), both pending until a product or an op needs them."""
        self._use()
        normed = _Normed(self, self._rows2d(x), self._rows2d(residual), w, eps)
        return normed, _Residual(normed)

    def silu_mul(self, gate, up):
        g, u = self._m(gate), self._m(up)
        if g.ndim == 2 and _unit_rows(g, 2) and _unit_rows(u, 2) and g.shape == u.shape:
            return _SiluMul(self, g, u)
        return self._gate(g, u, 0)

    def sigmoid_mul(self, x, gate):
        return self._gate(self._m(x), self._m(gate), 1)

    def _gate(self, a, b, mode: int):
        self._use()
        shape = a.shape
        a2 = a.reshape(-1, shape[-1]) if a.ndim != 2 else a
        b2 = b.reshape(-1, shape[-1]) if b.ndim != 2 else b
        if not _unit_rows(a2, 2):
            a2 = cupy.ascontiguousarray(a2, dtype=cupy.float32)
        if not _unit_rows(b2, 2):
            b2 = cupy.ascontiguousarray(b2, dtype=cupy.float32)
        n, J = a2.shape
        out = cupy.empty((n, J), cupy.float32)
        if n:
            K.gate_rows(a2, a2.strides[0] // 4, b2, b2.strides[0] // 4, out, J, mode, n)
        return out.reshape(shape)

    def rope(self, x, positions, theta: float, rotary_dim: int):
        pos = self._dev_i32(positions)
        inv = self._inv_freq(theta, rotary_dim)
        if isinstance(x, _Heads) and x.inv is None:
            return _Heads(self, x.x, x.norm, x.eps, pos, inv, rotary_dim // 2)
        x = self._m(x)
        if not _unit_rows(x, 3):
            x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        if x.shape[-1] > 1024:
            raise BackendError(f"head dim {x.shape[-1]} is beyond the kernels' 1024")
        return _Heads(self, x, pos=pos, inv=inv, half=rotary_dim // 2)

    # --- matrix products -------------------------------------------------------------------------
    def linear(self, x, w, pad_to: int = 0):
        """x [n, in] @ w^T. Every row has the same arithmetic whatever n is, so a prompt chunk needs
        no padding to `pad_to` rows: its rows come out as they would in any other batch. A pending
        RMSNorm or SiLU-gate input is computed by the product as it stages its input."""
        self._use()
        if isinstance(w, QWeight):
            return self._qlinear(x, w)
        x = self._rows2d(x)
        n = x.shape[0]
        y = cupy.empty((n, w.M), cupy.float32)
        if n:
            K.dense_gemv(w.w, w.M, w.K, x, None, x.strides[0] // 4, 0, y, n)
        return y

    def _qlinear(self, x, w: "QWeight"):
        if isinstance(x, _Normed) and x.w.shape == (w.K,) and x.w.dtype == cupy.float32:
            n = x.shape[0]
            y = cupy.empty((n, w.M), cupy.float32)
            if n:
                res = x.res
                hout = None if x.h_ready else x.h
                K.qmv(w.codes, w.sb, w.st, w.bits, w.group, w.M, w.K, x.x, x.x.strides[0] // 4, y, n, xm=2,
                      x2=res, ldx2=0 if res is None else res.strides[0] // 4, nw=x.w, eps=x.eps, hout=hout,
                      ldh=w.K)
                x.h_ready = True
            return y
        if isinstance(x, _SiluMul) and all(_aligned_rows(a) for a in (x.g, x.u)):
            n = x.shape[0]
            y = cupy.empty((n, w.M), cupy.float32)
            if n:
                K.qmv(w.codes, w.sb, w.st, w.bits, w.group, w.M, w.K, x.g, x.g.strides[0] // 4, y, n, xm=1,
                      x2=x.u, ldx2=x.u.strides[0] // 4)
            return y
        x = self._rows2d(x)
        n = x.shape[0]
        y = cupy.empty((n, w.M), cupy.float32)
        if n:
            K.qmv(w.codes, w.sb, w.st, w.bits, w.group, w.M, w.K, x, x.strides[0] // 4, y, n)
        return y

    def concat(self, parts: list) -> "cupy.ndarray":
        """Column-wise concatenation of [n, k_i] arrays (q, k, v kept apart by mixed formats)."""
        return cupy.concatenate(parts, axis=-1)

    # --- attention ---------------------------------------------------------------------------------
    def kv_write(self, cache: KVCache, layer: int, k, v, tables, positions) -> None:
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
        kb, ks0, ks1, knw, keps, _kpos, inv, half = self._heads(k)
        vb, vs0, vs1, *_ = self._heads(self._m(v))
        pos = self._dev_i32(positions)  # slots, and the RoPE positions of a lazy k (the same rows)
        tab = self._dev_i32(tables)
        n, KH, D = kb.shape
        if n == 0:
            return
        fp8 = cache.dtype == "fp8"
        K.kv_write(fp8, kb, ks0, ks1, knw, keps, inv, half, vb, vs0, vs1, pos, tab, cache.page_tokens, KH, D,
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

    def attention(self, q, cache: KVCache, layer: int, tables, positions, prompt: bool = False):
        self._use()
        pend = None if prompt else self._take_kv(cache, layer, tables, positions)
        if prompt:
            self._flush_kv()
        qb, qs0, qs1, qnw, qeps, _qpos, inv, half = self._heads(q)
        n, H, D = qb.shape
        KH = cache.k[layer].shape[2]
        G = H // KH
        out = cupy.empty((n, H, D), cupy.float32)
        if n == 0:
            return out
        if G > 16 or D > 256 or D % 16 or G * D > 4096 or K.decode_smem(cache.dtype == "fp8", G, D) > 96 * 1024:
            raise BackendError(f"attention of {H} heads over {KH} kv heads of dim {D} is beyond the kernels")
        pos = self._dev_i32(positions)  # lengths, and the RoPE positions of a lazy q (the same rows)
        tab = self._dev_i32(tables)
        fp8 = cache.dtype == "fp8"
        ksc = cache.k_scale[layer] if fp8 else None
        vsc = cache.v_scale[layer] if fp8 else None
        scale = float(np.float32(D ** -0.5))
        if prompt:
            K.attn_prompt(fp8, qb, qs0, qs1, qnw, qeps, inv, half, pos, tab, cache.page_tokens, cache.k[layer],
                          cache.v[layer], ksc, vsc, KH, G, D, scale, out, n)
            return out
        kn = vn = knw = None
        ks0 = ks1 = vs0 = vs1 = 0
        keps = 0.0
        if pend is not None:
            kn, ks0, ks1, knw, keps, _kpos, kinv, khalf = self._heads(pend[2])
            vn, vs0, vs1, *_ = self._heads(self._m(pend[3]))
            if (kinv is None) != (inv is None) or kn.shape[1] != KH or kn.shape[2] != D:
                self._pending_kv = pend  # a layout the fused write does not take: write it apart
                self._flush_kv()
                kn = vn = knw = None
            elif kinv is not None and (kinv is not inv or khalf != half):
                self._pending_kv = pend
                self._flush_kv()
                kn = vn = knw = None
        K.attn_decode(fp8, qb, qs0, qs1, qnw, qeps, inv, half, kn, ks0, ks1, knw, keps, vn, vs0, vs1, pos, tab,
                      cache.page_tokens, cache.k[layer], cache.v[layer], ksc, vsc, KH, G, D, scale, out, n)
        return out

    # --- heads ---------------------------------------------------------------------------------------
    def argmax(self, logits):
        self._use()
        x = self._rows2d(logits)
        n, V = x.shape
        out = cupy.empty(n, cupy.int32)
        if n:
            K.argmax(x, x.strides[0] // 4, V, out, n)
        return out

    def choose(self, logits, params: list, positions: list[int]) -> list[int]:
        """Tokens for rows of logits: greedy by the argmax kernel; sampled rows by
        `engine.sampling.sample` on the host, given only the candidates that can matter (with
        top_k, every logit >= the k-th largest, in index order: the same choice as the full row)."""
        from ..sampling import sample
        self._use()
        logits = self._rows2d(logits)
        out = [0] * len(params)
        greedy = [i for i, p in enumerate(params) if p.greedy]
        if greedy:
            am = self.to_host(self.argmax(logits))
            for i in greedy:
                out[i] = int(am[i])
        V = logits.shape[1]
        topk = [i for i, p in enumerate(params) if not p.greedy and 0 < p.top_k < V]
        if topk:
            sub = logits[cupy.asarray(np.array(topk, np.int64))]
            srt = cupy.sort(sub, axis=1)
            kth = srt[cupy.arange(len(topk)), cupy.asarray(np.array([V - params[i].top_k for i in topk]))]
            mask = sub >= kth[:, None]
            rr, cc = cupy.nonzero(mask)
            vals = sub[rr, cc]
            rr, cc, vals = self.to_host(rr), self.to_host(cc), self.to_host(vals)
            for j, i in enumerate(topk):
                sel = rr == j
                idx, v = cc[sel], vals[sel]
                out[i] = int(idx[sample(v, params[i], positions[i])])
        for i, p in enumerate(params):
            if not p.greedy and not (0 < p.top_k < V):
                out[i] = sample(self.to_host(logits[i]), p, positions[i])
        return out

    # --- CUDA-graph decode -------------------------------------------------------------------------
    def decode_step(self, model, rows, cache: KVCache, scratch_page: int):
        """One decode forward of `rows`, padded to a power-of-two batch and replayed from a graph."""
        n = len(rows)
        B = 1 << max(0, (n - 1).bit_length())
        if not self.graphs or B > MAX_GRAPH_ROWS:
            return model.forward(rows, cache)
        W = rows.tables.shape[1]
        per_cache = self._graphs.get(id(cache))
        if per_cache is None:
            per_cache = self._graphs[id(cache)] = {}
            weakref.finalize(cache, self._graphs.pop, id(cache), None)
        key = (id(model), B, W)
        entry = per_cache.get(key)
        if entry is None:
            entry = per_cache[key] = _GraphEntry(B, W)
        if entry.failed:
            return model.forward(rows, cache)
        h = entry.host
        h[:] = 0
        h[:n] = rows.tokens
        h[B:B + n] = rows.positions
        h[2 * B:2 * B + n] = rows.lanes
        h[2 * B + n:3 * B] = -1  # padding rows own no lane
        tab = h[3 * B:].reshape(B, W)
        tab[:n] = rows.tables
        tab[n:] = scratch_page
        self._use()
        entry.dev.set(h, stream=self.stream)
        if entry.graph is not None:
            entry.graph.launch(self.stream)
            return entry.out[:n]
        drows = self._device_rows(rows, entry)
        out = model.forward(drows, cache)  # eager: this step's answer (and every kernel loaded)
        self._capture(model, drows, cache, entry)
        return out[:n]

    @staticmethod
    def _device_rows(rows, entry: _GraphEntry):
        from ..rows import Rows
        B, W = entry.B, entry.W
        r = Rows(np.zeros(B, np.int32), np.zeros(B, np.int32), np.zeros((B, W), np.int32), np.zeros(B, np.int32),
                 False)
        r.tokens, r.positions, r.lanes, r.tables = entry.views()
        return r

    def _capture(self, model, drows, cache, entry: _GraphEntry) -> None:
        s = self.stream
        try:
            with cupy.cuda.using_allocator(self._graph_pool.malloc):
                s.begin_capture()
                try:
                    out = model.forward(drows, cache)
                finally:
                    graph = s.end_capture()
            entry.graph, entry.out = graph, out
        except Exception as e:  # capture is an optimisation: run eagerly from now on
            entry.failed = True
            self.graph_failures.append(f"{entry.B} rows: {type(e).__name__}: {e}")
            print(f"cupy backend: decode graph for {entry.B} rows not captured ({type(e).__name__}: {e}); "
                  "running eagerly", file=sys.stderr)
