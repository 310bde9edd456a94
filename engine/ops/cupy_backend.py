"""The GPU backend: the op set of `base.Backend` on CuPy, with kernels from kernels/.

Same models, cache and scheduler as the numpy reference. What differs is inside:

- Weights (`cupy_weights`): affine 4- and 8-bit weights stay quantized on the device, in the tile
  layout of the tensor-core GEMV; dense weights become float32.
- Lazy ops (`cupy_lazy`): q/k norm and RoPE are applied by the KV write and attention kernels as
  they load the heads; a row RMSNorm (with its residual add) and SiLU·up by the next product as it
  stages its input (qmv modes 2 and 1). This saves four launches a layer.
- Deferred K/V writes (`cupy_attention.AttentionOps`, mixed in): `kv_write` is held until the decode
  attention of the same layer and rows, which writes the new K/V itself; anything else that reads the
  cache writes it first.
- Exactness. One kernel per op for every row count: the GEMV computes every row with the same
  arithmetic (its K segments depend on the weight shape only) and reads each weight once for all
  rows; decode attention splits keys at absolute chunks of `kernels.launch.CHUNK` positions merged
  in a fixed tree; a prompt chunk's products (qgemm, or cuBLAS for chunks of 256+ rows on Hopper)
  hold one stream's rows at absolute chunk boundaries. KV bits match `encode_kv`.
- CUDA graphs (`cupy_graphs`): `decode_step` replays graphs captured per power-of-two batch size.
- Gated DeltaNet and MoE ops (`cupy_qwen3_5.Qwen35Ops`, mixed in), and the drafters' ops
  (`cupy_drafters.DrafterOps`: DFlash2's block, composed of CuPy array ops).

Work goes to two non-blocking CUDA streams, the one in use made current (`_use`) by every entry
point: the engine thread owns every GPU call. Decode steps and everything else run on `stream`, at
the device's highest priority; prompt chunks (`prompt_work`) on `prompt_stream`, at its lowest, so
that other streams' decode steps run while a long prompt is read, their blocks dispatched first.
Prompt work starts after the decode stream's work so far; decode work comes after it only from
`join_prompt` (an event wait on the device, no host stall). Scratch that both could touch is per
stream (qmv's counters) or prompt-only (the cuBLAS path's fp16 weights); CuPy's memory pool
reuses a freed block only on the stream it was allocated on. (Never `with stream:` here: leaving
such a block makes the stream below it on CuPy's stack current, the legacy stream, whatever
`use()` said before.)
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

import kernels.launch as K

from ..config import ModelConfig
from ..errors import BackendError, DeviceLostError
from ..kv.cache import Cache
from ..memory import gpu_free_bytes, is_unified
from ..rows import Rows
from ..settings import EngineSettings
from ..weights import Tensor
from . import cupy_graphs, cupy_weights
from .base import GraphStats, Kind
from .cupy_attention import AttentionOps
from .cupy_choice import ChoiceOps
from .cupy_drafters import DrafterOps
from .cupy_import import cupy
from .cupy_landing import DeviceLanding
from .cupy_lazy import Combined, Heads, Lazy, Normed, Product, Residual, SiluMul, aligned_rows, unit_rows
from .cupy_qwen3_5 import Qwen35Ops
from .cupy_weights import QWeight

log = logging.getLogger(__name__)

# cudaError_t / CUresult codes after which the context is unusable (the same numbers in both APIs):
# ECC uncorrectable, NVLink uncorrectable, illegal address, launch timeout, assert, hardware stack
# error, illegal instruction, misaligned address, invalid address space, invalid PC, launch failure.
STICKY_CUDA_ERRORS = frozenset({214, 220, 700, 702, 710, 714, 715, 716, 717, 718, 719})


class CupyBackend(AttentionOps, ChoiceOps, Qwen35Ops, DrafterOps):
    name = "cupy"
    kv_stores = ("bf16", "fp8")  # what the kernels of attention.cu read and write
    # Tensor-core products pay for big chunks (35B-A3B at 2,048: 11.6-11.9K tok/s at 512 rows, 13.7-14.0K at
    # 1,024, 14.5K at 2,048); past 1,024 a short prompt pays for padding and the prompt cache's granule grows.
    prompt_chunk = 1024

    def __init__(self):
        try:
            dev = cupy.cuda.Device()
            props = cupy.cuda.runtime.getDeviceProperties(dev.id)
        except Exception as e:
            raise BackendError(f"--backend cupy: no usable CUDA device ({e})") from None
        self.device = f"{props['name'].decode()} (sm_{dev.compute_capability})"
        self.unified_memory = is_unified(dev.attributes)  # GB10: the GPU's memory is the desktop's
        # fp16 prompt products of K.CUBLAS_MIN_ROWS+ rows: "cublas" (a dequantized copy and cuBLAS) or
        # "qgemm" (kernels/qgemm.cu); a public switch for tests and the bench's A/B.
        self.prompt_gemm = "qgemm"
        if K.cublas_prompt_products(dev.compute_capability, self.unified_memory):
            try:
                cupy.cuda.device.get_cublas_handle()
                self.prompt_gemm = "cublas"
            except Exception as e:  # a CUDA install without cuBLAS: qgemm does the same products
                log.warning("cuBLAS is not usable (%s); prompt products run on qgemm", e)
        self._w16 = None  # the cuBLAS path's fp16 weight copy, grown to the largest product
        # CUDA clamps priorities to the device's range: -100 is its highest, 0 its lowest.
        self.stream = cupy.cuda.Stream(non_blocking=True, priority=-100)
        self.prompt_stream = cupy.cuda.Stream(non_blocking=True, priority=0)
        self._cur = self.stream  # the stream entry points make current: prompt_stream inside prompt_work
        self._prompt_end = None  # an event after the prompt work launched last
        self._use()
        self._graphs = cupy_graphs.DecodeGraphs(self.stream)
        self._inv: dict[tuple, object] = {}
        self._rope: dict[tuple, tuple] = {}  # this forward's RoPE tables: (positions, cos/sin) by key
        self._uploads: list[tuple] = []
        self._pending_kv = None  # (cache, layer, k, v, tables, positions) of a deferred kv_write
        self._routed = None  # (experts, expert count, slots) of the last moe_route, for moe_experts
        self.graphs = True  # decode steps replay captured graphs (False: every step eagerly)
        self._landing: DeviceLanding | None = None
        self._slot_tables: dict[tuple, tuple] = {}  # copy_slots' device address tables
        self._keep_tables: dict[tuple, tuple] = {}  # deltanet_keep's
        self._chosen = None  # (logits, (params, positions), tokens, mode) a graph's step already chose

    def _use(self) -> None:
        """Make the stream in use current (cheap when it already is)."""
        if cupy.cuda.get_current_stream() is not self._cur:
            self._cur.use()

    def make_current(self) -> None:
        """For callers that create device arrays outside the op set (the bench's synthetic weights)."""
        self._use()

    # --- memory -------------------------------------------------------------------------
    def prepare(self, w: Tensor, kind: Kind = "linear"):
        self._use()
        return cupy_weights.prepare(w, kind, self.free_memory)

    def zeros(self, shape: tuple[int, ...], dtype: Any):
        self._use()
        return cupy.zeros(shape, dtype)

    def asarray(self, a):
        if isinstance(a, (cupy.ndarray, Lazy)):
            return a
        self._use()
        return cupy.asarray(a)

    def to_host(self, a) -> np.ndarray:
        self._use()
        self._flush_kv()
        if isinstance(a, Lazy):
            a = a.materialize()
        if isinstance(a, cupy.ndarray):
            return cupy.asnumpy(a, stream=self._cur)
        return np.asarray(a)

    def landing(self) -> DeviceLanding:
        if self._landing is None:  # its page-locked staging is made once and kept
            self._landing = DeviceLanding(self)
        return self._landing

    def free_memory(self) -> int:
        free, _total = cupy.cuda.runtime.memGetInfo()
        return int(gpu_free_bytes(self.unified_memory, free, cupy.get_default_memory_pool().free_bytes()))

    def synchronize(self) -> None:
        self._use()
        self._flush_kv()
        self.prompt_stream.synchronize()
        self.stream.synchronize()

    @contextmanager
    def prompt_work(self) -> Iterator[None]:
        self._use()
        self._flush_kv()
        before = cupy.cuda.Event(disable_timing=True)
        before.record(self.stream)
        self.prompt_stream.wait_event(before)
        self._cur = self.prompt_stream
        try:
            self._use()
            yield
            self._flush_kv()
        finally:
            self._cur = self.stream
            self._prompt_end = cupy.cuda.Event(disable_timing=True)
            self._prompt_end.record(self.prompt_stream)
            self._pending_kv = None  # a failed chunk's; its stream fails
            self._use()

    def prompt_pending(self) -> bool:
        return self._prompt_end is not None and not self._prompt_end.done

    def join_prompt(self) -> None:
        if self._prompt_end is not None:
            self.stream.wait_event(self._prompt_end)

    def mark(self):
        self._use()
        self._flush_kv()  # a deferred write belongs before the mark
        ev = cupy.cuda.Event()
        ev.record(self._cur)
        return ev

    def seconds(self, a, b) -> float:
        b.synchronize()
        return cupy.cuda.get_elapsed_time(a, b) / 1e3

    def copy_slots(self, src: list, dst: list, src_slots: list[int], dst_slots: list[int]) -> None:
        """One launch for every array (kernels/elementwise.cu `copy_slots`): a hybrid model's checkpoint
        of 8 lanes was ~180 CuPy copies a decode step. The arrays' address tables are uploaded once per
        set of arrays (a function of the addresses and slot sizes alone, so an entry never goes stale)."""
        self._use()
        if not len(src_slots) or not src:
            return
        key = tuple((a.data.ptr, b.data.ptr, a.size // a.shape[0]) for a, b in zip(src, dst))  # no views
        table = self._slot_tables.get(key)
        if table is None:
            for a, b in zip(src, dst):
                if a.dtype != cupy.float32 or b.dtype != cupy.float32 or a.size // a.shape[0] != b.size // b.shape[0] \
                        or not (a.flags.c_contiguous and b.flags.c_contiguous):
                    raise BackendError("copy_slots takes contiguous float32 arrays of equal slots")
            if len(self._slot_tables) > 32:
                self._slot_tables.clear()
            sizes = [n for _, _, n in key]
            table = self._slot_tables[key] = (
                cupy.asarray(np.array([a.data.ptr for a in src], np.uint64)),
                cupy.asarray(np.array([b.data.ptr for b in dst], np.uint64)),
                cupy.asarray(np.array(sizes, np.int64)), max(sizes))
        pairs = cupy.asarray(np.array([src_slots, dst_slots], np.int32))
        K.copy_slots(*table[:3], pairs[0], pairs[1], len(src_slots), len(src), table[3])

    def device_lost(self, error: BaseException) -> bool:
        """A sticky CUDA error (an illegal address, a failed launch, a trap...): the context is
        lost for this process; any other error is one computation's."""
        if isinstance(error, DeviceLostError):
            return True
        kinds = (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError)
        return isinstance(error, kinds) and getattr(error, "status", None) in STICKY_CUDA_ERRORS

    # --- helpers --------------------------------------------------------------------------
    def _m(self, x):
        return x.materialize() if isinstance(x, Lazy) else x

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

    def _rope_rows(self, pos, theta: float, rotary_dim: int):
        """RoPE's (cos, sin) [rows, half] at these rows' positions, made once per forward and shared by
        every layer's q and k (the float64 trigonometry was each attention block's)."""
        key = (id(pos), float(theta), int(rotary_dim))  # the entry holds pos: its id is not reused meanwhile
        hit = self._rope.get(key)
        if hit is not None:
            return hit[1]
        n, half = len(pos), rotary_dim // 2
        cs = cupy.empty((n, half, 2), cupy.float32)
        if n and half:
            K.rope_rows(pos, self._inv_freq(theta, rotary_dim), half, n, cs)
        self._rope[key] = (pos, cs)
        return cs

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
        if not aligned_rows(x):
            x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        return x

    def _heads(self, x):
        """(base view, s0, s1, norm, eps, cs, half) of a heads input, lazy or not."""
        if isinstance(x, Heads):
            s0, s1 = x.strides_el
            return x.x, s0, s1, x.norm, x.eps, x.cs, x.half
        x = self._m(x)
        if not unit_rows(x, 3):
            x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        return x, x.strides[0] // 4, x.strides[1] // 4, None, 0.0, None, 0

    # --- elementwise and norms ----------------------------------------------------------------
    def embed(self, table, ids):
        self._use()  # the first op of every forward
        self._rope = {}  # RoPE tables live for one forward (a captured one makes its own)
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
        if isinstance(x, Heads) and x.norm is None and x.cs is None:
            x = x.x
        if (isinstance(x, cupy.ndarray) and x.ndim == 3 and w.shape[0] == x.shape[-1] and unit_rows(x, 3)
                and x.shape[-1] <= 256):
            return Heads(self, x, norm=w, eps=float(eps))
        x = self._m(x)
        if x.ndim == 2:
            return Normed(self, self._rows2d(x), None, w, eps)
        shape = x.shape
        x2 = self._rows2d(x.reshape(-1, shape[-1]))
        y = cupy.empty(x2.shape, cupy.float32)
        if len(x2):
            K.rmsnorm(x2, x2.strides[0] // 4, None, 0, w, y, None, shape[-1], eps, len(x2))
        return y.reshape(shape)

    def add_rmsnorm(self, x, residual, w, eps: float):
        """(rmsnorm(x + residual) * w, x + residual), both pending until a product or an op needs them."""
        self._use()
        x = x if isinstance(x, (Product, Combined)) else self._rows2d(x)
        normed = Normed(self, x, self._rows2d(residual), w, eps)
        return normed, Residual(normed)

    def silu_mul(self, gate, up):
        g, u = self._m(gate), self._m(up)
        if g.ndim == 2 and unit_rows(g, 2) and unit_rows(u, 2) and g.shape == u.shape:
            return SiluMul(self, g, u)
        return self._gate(g, u, 0)

    def sigmoid_mul(self, x, gate):
        return self._gate(self._m(x), self._m(gate), 1)

    def _gate(self, a, b, mode: int):
        self._use()
        shape = a.shape
        a2 = a.reshape(-1, shape[-1]) if a.ndim != 2 else a
        b2 = b.reshape(-1, shape[-1]) if b.ndim != 2 else b
        if not unit_rows(a2, 2):
            a2 = cupy.ascontiguousarray(a2, dtype=cupy.float32)
        if not unit_rows(b2, 2):
            b2 = cupy.ascontiguousarray(b2, dtype=cupy.float32)
        n, J = a2.shape
        out = cupy.empty((n, J), cupy.float32)
        if n:
            K.gate_rows(a2, a2.strides[0] // 4, b2, b2.strides[0] // 4, out, J, mode, n)
        return out.reshape(shape)

    def rope(self, x, positions, theta: float, rotary_dim: int):
        pos = self._dev_i32(positions)
        cs = self._rope_rows(pos, theta, rotary_dim)
        if isinstance(x, Heads) and x.cs is None:
            return Heads(self, x.x, x.norm, x.eps, cs, rotary_dim // 2)
        x = self._m(x)
        if not unit_rows(x, 3):
            x = cupy.ascontiguousarray(x, dtype=cupy.float32)
        if x.shape[-1] > 1024:
            raise BackendError(f"head dim {x.shape[-1]} is beyond the kernels' 1024")
        return Heads(self, x, cs=cs, half=rotary_dim // 2)

    # --- matrix products -------------------------------------------------------------------------
    def linear(self, x, w, pad_to: int = 0, fp16: bool = False, feeds_norm: bool = False):
        """x [n, in] @ w^T. Every row has the same arithmetic whatever n is, so a prompt chunk needs
        no padding to `pad_to` rows: its rows come out as they would in any other batch. A pending
        RMSNorm or SiLU-gate input is computed by the product as it stages its input. feeds_norm: a
        4-16 row decode product is a `Product` until its norm's consumer (`_split_by_product`)."""
        self._use()
        if isinstance(w, QWeight):
            chunk = pad_to if pad_to and fp16 and w.bits == 4 else 0
            n = x.shape[0]
            if feeds_norm and not chunk and K.qmv_splits_out(n, w.M, w.K, w.group, w.group):
                return Product(lambda split_out: self._qlinear(x, w, 0, split_out), n, w.M, w.K, w.group)
            return self._qlinear(x, w, chunk)
        x = self._rows2d(x)
        n = x.shape[0]
        y = cupy.empty((n, w.M), cupy.float32)
        if n:
            K.dense_gemv(w.w, w.M, w.K, x, None, x.strides[0] // 4, 0, y, n)
        return y

    def _staged(self, x, w: "QWeight"):
        """(the x rows, the products' input-mode keywords): a pending RMSNorm (its residual's h written
        by the product) or SiLU gate is applied as the product stages its input."""
        if isinstance(x, Normed) and x.w.shape == (w.K,) and x.w.dtype == cupy.float32:
            res, c = x.res, x.x
            kw = dict(xm=2, nw=x.w, eps=x.eps, hout=None if x.h_ready else x.h, ldh=w.K)
            if x.shape[0]:
                x.h_ready = True
            if (isinstance(c, Combined) and res is not None and K.qmv_combines(x.shape[0], w.M, w.K, K.sm_count())
                    and aligned_rows(c.y)):  # h = res + the experts' combination, summed as it loads
                return res, dict(kw, x2=c.y, ldx2=c.y.strides[0] // 4, combine=(c.weights, c.k))
            return self._m(c), dict(kw, x2=res, ldx2=0 if res is None else res.strides[0] // 4)
        if isinstance(x, SiluMul) and all(aligned_rows(a) for a in (x.g, x.u)):
            return x.g, dict(xm=1, x2=x.u, ldx2=x.u.strides[0] // 4)
        return self._rows2d(x), {}

    def _qlinear(self, x, w: "QWeight", fp16_chunk: int = 0, split_out=None):
        """qmv, or with fp16_chunk a prompt chunk's product on tensor cores in fp16: qgemm (the same
        arithmetic for every row of every chunk of that size) or, from K.CUBLAS_MIN_ROWS rows where
        `prompt_gemm` says so, cuBLAS over a dequantized copy (a row's bits follow the chunk's row count)."""
        pieces = None if fp16_chunk else self._split_by_product(x, w)
        x, kw = self._staged(x, w)
        n = x.shape[0]
        y = cupy.empty((n, w.M), cupy.float32)
        if n >= K.CUBLAS_MIN_ROWS and fp16_chunk and self.prompt_gemm == "cublas":
            K.qgemm_cublas(w.codes, w.sb, w.st, w.group, w.M, w.K, x, x.strides[0] // 4, y, n, self._w16_for(w), **kw)
        elif n and fp16_chunk:
            K.qgemm(w.codes, w.sb, w.st, w.group, w.M, w.K, x, x.strides[0] // 4, y, n, fp16_chunk, **kw)
        elif n:
            K.qmv(w.codes, w.sb, w.st, w.bits, w.group, w.M, w.K, x, x.strides[0] // 4, y, n, **kw, pieces=pieces,
                  split_out=split_out)
        return y

    def _split_by_product(self, x, w: "QWeight"):
        """The split input (K.xsplit_buffers) of a product of `Normed` rows whose x is a `Product` not
        run yet, where this product would split its input once: that product runs now and writes it
        (and the residual's h) as it reduces its rows. None elsewhere."""
        p = x.x if isinstance(x, Normed) else None
        if (not isinstance(p, Product) or p.launched or x.res is None or x.h_ready or x.w.shape != (w.K,)
                or x.w.dtype != cupy.float32):
            return None
        n = x.shape[0]
        if not (K.qmv_splits_x(n, w.M, w.K, 2) and K.qmv_splits_out(n, p.M, p.K, p.group, w.group)):
            return None
        pieces = K.xsplit_buffers(n, w.K, w.group, 2)
        p.materialize((pieces, x.res, x.res.strides[0] // 4, x.w, x.h, w.K))
        x.h_ready = True
        return pieces

    def _w16_for(self, w: "QWeight"):
        need = w.M * K.padded_subgroups(w.K) * 32
        if self._w16 is None or self._w16.size < need:
            self._w16 = None  # the old copy goes back to the pool before the larger one is taken
            self._w16 = cupy.empty(need, cupy.uint16)
        return self._w16

    def concat(self, parts: list, axis: int = -1) -> "cupy.ndarray":
        """Concatenation along `axis` (column-wise by default: q, k, v kept apart by mixed formats)."""
        return cupy.concatenate([self._m(p) for p in parts], axis=axis)

    # --- CUDA-graph decode -------------------------------------------------------------------------
    def decode_step(self, model: Any, rows: Rows, cache: Cache):
        """One decode forward of `rows`: replayed from a captured graph (see cupy_graphs), or eagerly."""
        self._use()
        self._chosen = None
        if not self.graphs:
            return model.forward(rows, cache)
        mode = sampling = None
        if rows.choose is not None and cupy_graphs.samples(rows):
            mode, kmode, par = self._sampling_inputs(*rows.choose, model.cfg.vocab)
            sampling = kmode, par
        out, toks = self._graphs.step(model, rows, cache, sampling)
        if toks is not None:  # chosen inside the graph: `choose` of these logits copies them back
            self._chosen = (out, rows.choose, toks, mode)
        return out

    def warm_decode(self, model: Any, cache: Cache, width: int, streams: int,
                    shapes: list[tuple[int, bool, tuple]]) -> int:
        if not self.graphs:
            return 0
        return self._graphs.warm(model, cache, width, streams, shapes)

    def graph_stats(self) -> GraphStats:
        return self._graphs.stats()

    def graph_bytes(self, cfg: ModelConfig, settings: EngineSettings) -> int:
        return cupy_graphs.graph_bytes(cfg, settings) if self.graphs else 0
