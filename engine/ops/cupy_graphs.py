"""CUDA-graph decode: decode steps replayed from graphs captured per (model, batch size, table width,
verify window, hidden states wanted and which).

A decode batch is padded to the next power of two of streams (each `Rows.window` rows: k + 1 in a
verify window, so a drafter's k gives one more shape per batch size) with rows that write to the
cache's scratch page and scratch state slot; tokens, positions, lanes and page tables are copied into
device buffers of that batch size, and the graph captured for it replays. A plain step's graph ends
with the sampling kernel (its mode and parameters are inputs too), so the step's tokens need no
launch of their own, only the copy back (`Chosen`: into page-locked memory, waited for alone, so a
step fed those tokens on the device can be queued first: the scheduler's run-ahead). The engine captures every
size up to its streams at start (`warm`); a size first met in a step runs eagerly, then captures.
A graph holds the addresses of one cache's arrays, so graphs are kept per cache object and die with
it. Their intermediates come from one memory pool of their own.

Ownership of `GraphEntry.out` and `.tokens`: the entry owns them (the captured graph's logits and
tokens); `step` returns views of them, which the next replay of the same graph overwrites. The scheduler
chooses its tokens from the logits before the next decode step, so nothing outlives that.
"""
from __future__ import annotations

import sys
import weakref
from contextlib import nullcontext

import numpy as np

import kernels.launch as K
from kernels import trace

from ..config import ModelConfig
from ..errors import BackendError
from ..kv.cache import Cache
from ..rows import Rows
from ..settings import EngineSettings
from .base import GraphStats
from .cupy_import import cupy, cupyx
from .cupy_lazy import Lazy

MAX_GRAPH_ROWS = 256  # larger decode batches run eagerly


class GraphEntry:
    """One captured decode graph and its input buffers: tokens, positions, lanes and page tables as
    int32; a sampling graph (plain rows) also the sampling kernel's mode and (T, top_p, u) per row."""

    def __init__(self, B: int, W: int, sampled: bool):
        self.B, self.W, self.sampled = B, W, sampled
        self.mode_at = B * (3 + W)  # int32 offsets: the sampling modes after the page tables, then the
        self.par_at = (self.mode_at + B + 1) // 2 * 2  # float64 parameters, 8-byte aligned
        # page-locked, so the copy up never waits for the steps queued before it; two, taken in turn,
        # so a step filled while the one before is queued never rewrites the buffer it still reads;
        # each with the event of its last copy up (a state replay queues many steps unread)
        self.hosts = [cupyx.zeros_pinned(self.par_at + 6 * B, np.int32) for _ in range(2)]
        self.copied = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
        self.dev = cupy.zeros(self.hosts[0].size, cupy.int32)
        self.graph = None
        self.out = None
        self.tokens = None  # a sampling graph's chosen tokens [B]
        self.failed = False
        self.names: list[str] = []  # its launches in order (bench --trace)

    def views(self):
        B, W, d = self.B, self.W, self.dev
        return d[:B], d[B:2 * B], d[2 * B:3 * B], d[3 * B:self.mode_at].reshape(B, W)

    def sampling_views(self):
        B, d = self.B, self.dev
        return d[self.mode_at:self.mode_at + B], d[self.par_at:self.par_at + 6 * B].view(cupy.float64)

    def next_host(self) -> np.ndarray:
        """The input buffer to fill next, once its last copy up has run."""
        self.hosts.reverse()
        self.copied.reverse()
        self.copied[0].synchronize()
        return self.hosts[0]

    def upload(self, stream) -> None:
        """Copy the buffer `next_host` gave up to the device, on `stream`."""
        self.dev.set(self.hosts[0], stream=stream)
        self.copied[0].record(stream)


class Chosen:
    """The tokens a sampling graph chose for its first n rows: `device` (the graph's, valid until its
    next replay) and their copy back into page-locked memory, begun at once and waited for alone."""

    def __init__(self, device, stream, params: list, positions: list[int]):
        self.device, self.params, self.positions = device, params, positions
        self.host = cupyx.empty_pinned(device.size, np.int32)
        cupy.cuda.runtime.memcpyAsync(self.host.ctypes.data, device.data.ptr, device.nbytes,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        self.done = cupy.cuda.Event(disable_timing=True)
        self.done.record(stream)

    def tokens(self) -> list[int]:
        self.done.synchronize()
        return self.host.tolist()


class DecodeGraphs:
    """The captured decode graphs of one backend (one CUDA stream), per cache."""

    def __init__(self, stream):
        self.stream = stream
        self.pool = cupy.cuda.MemoryPool()
        self._per_cache: weakref.WeakKeyDictionary[Cache, dict] = weakref.WeakKeyDictionary()
        self.failures: list[str] = []
        self._end_ids: dict[tuple[int, ...], cupy.ndarray] = {}  # a tokenizer's end tokens, uploaded once

    def _ends(self, ends: tuple[int, ...]):
        if ends not in self._end_ids:
            self._end_ids[ends] = cupy.asarray(np.array(ends or (-1,), np.int32))
        return self._end_ids[ends]

    def step(self, model, rows: Rows, cache: Cache, sampling: tuple[np.ndarray, np.ndarray] | None = None):
        """One decode forward of `rows`, padded to a power-of-two batch and replayed from a graph:
        (logits, tokens). With `sampling` (the sampling kernel's mode and parameters per row) a plain
        step's graph also chooses the rows' tokens (device int32 [n]); else, or when the step ran
        eagerly, tokens is None. `rows.fed` (a `Chosen` of this shape's graph) gives the tokens."""
        n = len(rows)
        B = padded_rows(n // rows.window, rows.window)
        W = rows.tables.shape[1]
        per_cache = self._per_cache.setdefault(cache, {})
        key = _key(model, rows, B)
        entry = per_cache.get(key)
        if rows.fed is not None and (entry is None or entry.graph is None):
            raise BackendError("a decode step fed device-chosen tokens replays its shape's captured graph")
        if B > MAX_GRAPH_ROWS:
            return model.forward(rows, cache), None
        if entry is None:
            entry = per_cache[key] = GraphEntry(B, W, samples(rows))
        if entry.failed:
            return model.forward(rows, cache), None
        self._fill(entry, rows, cache, sampling)
        if rows.fed is not None:  # after the fill, whose token slots hold the rows' end flags; on the
            # current stream, `stream` (the backend's decode_step made it so: a `with` would leave another)
            K.feed_rows(rows.fed.device, entry.dev, B, n, self._ends(rows.ends), len(rows.ends))
        if entry.graph is not None:
            # an untraced replay builds no label
            traced = trace.replay(_label(B, rows.window), entry.names, self.stream) if trace.active() else nullcontext()
            with traced:
                entry.graph.launch(self.stream)
            toks = entry.tokens[:n] if sampling is not None and entry.tokens is not None else None
            return _rows(entry.out, n), toks
        drows = self._device_rows(entry, rows)
        out = model.forward(drows, cache)  # eager: this step's answer (and every kernel loaded)
        self._capture(model, drows, cache, entry)
        return _rows(out, n), None

    def warm(self, model, cache: Cache, width: int, streams: int, shapes: list[tuple[int, bool, tuple]]) -> int:
        """Capture now the graph of every padded batch size up to `streams` for each decode shape
        (window, hidden, taps) the scheduler uses, so that no stream waits for a capture when another
        tab joins: one eager pass of scratch rows (every kernel loaded), then the capture. Returns the
        graphs captured; a size that fails to capture runs eagerly, as in `step`."""
        per_cache = self._per_cache.setdefault(cache, {})
        done = 0
        for window, hidden, taps in shapes:
            like = Rows(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros((0, width), np.int32),
                        np.zeros(0, np.int32), False, window=window, hidden=hidden, taps=taps)
            B = window
            while B <= min(MAX_GRAPH_ROWS, padded_rows(streams, window)):
                key = _key(model, like, B)
                if key not in per_cache:
                    entry = per_cache[key] = GraphEntry(B, width, samples(like))
                    self._fill(entry, like, cache, None)
                    drows = self._device_rows(entry, like)
                    model.forward(drows, cache)
                    self._capture(model, drows, cache, entry)
                    done += entry.graph is not None
                B *= 2
        return done

    def _fill(self, entry: GraphEntry, rows: Rows, cache: Cache, sampling) -> None:
        """The graph's input buffers: `rows`, then padding rows on the scratch page and state slot;
        the sampling kernel's modes and parameters where given (padding rows take its greedy path)."""
        B, W, n, h = entry.B, entry.W, len(rows), entry.next_host()
        h[:] = 0
        h[:n] = rows.tokens
        h[B:B + n] = rows.positions
        h[2 * B:2 * B + n] = rows.lanes
        h[2 * B + n:3 * B] = -1  # padding rows own no lane
        tab = h[3 * B:entry.mode_at].reshape(B, W)
        tab[:n] = rows.tables
        tab[n:] = cache.scratch_page
        mode = h[entry.mode_at:entry.mode_at + B]
        mode[:] = -1
        if sampling is not None:
            mode[:n] = sampling[0]
            h[entry.par_at:entry.par_at + 6 * n] = sampling[1].reshape(-1).view(np.int32)
        entry.upload(self.stream)

    def stats(self) -> GraphStats:
        captured = sum(1 for per in self._per_cache.values() for e in per.values() if e.graph is not None)
        return GraphStats(captured, list(self.failures), int(self.pool.total_bytes()))

    @staticmethod
    def _device_rows(entry: GraphEntry, like: Rows) -> Rows:
        B, W = entry.B, entry.W
        r = Rows(np.zeros(B, np.int32), np.zeros(B, np.int32), np.zeros((B, W), np.int32), np.zeros(B, np.int32),
                 False, window=like.window, hidden=like.hidden, taps=like.taps)
        r.tokens, r.positions, r.lanes, r.tables = entry.views()
        return r

    def _capture(self, model, drows: Rows, cache: Cache, entry: GraphEntry) -> None:
        s = self.stream
        try:
            with cupy.cuda.using_allocator(self.pool.malloc), trace.capture() as names:
                s.begin_capture()
                try:
                    out = model.forward(drows, cache)
                    if isinstance(out, tuple):  # a drafter's hidden states: computed inside the graph
                        out = tuple(o.materialize() if isinstance(o, Lazy) else o for o in out)
                    elif isinstance(out, Lazy):
                        out = out.materialize()
                    tokens = _sample(out, entry) if entry.sampled else None
                finally:
                    graph = s.end_capture()
            entry.graph, entry.out, entry.tokens, entry.names = graph, out, tokens, names
        except Exception as e:  # capture is an optimisation: run eagerly from now on
            entry.failed = True
            self.failures.append(f"{entry.B} rows: {type(e).__name__}: {e}")
            print(f"cupy backend: decode graph for {entry.B} rows not captured ({type(e).__name__}: {e}); "
                  "running eagerly", file=sys.stderr)


def padded_rows(streams: int, window: int) -> int:
    """Rows of the graph that serves `streams` streams: the next power of two of them, in windows."""
    return (1 << max(0, (streams - 1).bit_length())) * window


def samples(rows: Rows) -> bool:
    """Plain decode rows' graphs choose their tokens too; verify windows' and drafters' do not."""
    return rows.window == 1 and not rows.hidden


def _sample(logits, entry: GraphEntry):
    """The sampling kernel on a graph's logits, from the entry's sampling buffers: tokens [B]."""
    mode, par = entry.sampling_views()
    logits = cupy.ascontiguousarray(logits, dtype=cupy.float32)  # unit-stride rows (the head's are: no copy)
    tokens = cupy.empty(entry.B, cupy.int32)
    K.sample(logits, logits.strides[0] // 4, logits.shape[1], mode, par, tokens, entry.B)
    return tokens


def _key(model, rows: Rows, B: int) -> tuple:
    """A graph's identity within one cache: the model, its rows and page-table width, the rows' shape."""
    return id(model), B, rows.tables.shape[1], rows.window, rows.hidden, rows.taps


def _label(B: int, window: int) -> str:
    """A graph's name in `bench --trace`."""
    return f"{B} row{'s' if B > 1 else ''}" + (f" in windows of {window}" if window > 1 else "")


def _rows(out, n: int):
    """The first n rows of a graph's output (logits, or logits and hidden states)."""
    return tuple(o[:n] for o in out) if isinstance(out, tuple) else out[:n]


def graph_bytes(cfg: ModelConfig, settings: EngineSettings) -> int:
    """What the decode graphs of these settings keep, estimated from the shapes (float32 activations):
    the logits [B, vocab] of every captured batch size B (powers of two up to the streams), and the
    largest graph's intermediates of one layer: activations, the attention partials (the bulk at
    long contexts) and the widest product's segment partials. A drafter adds the verify windows'
    graphs: k + 1 rows per stream."""
    window = settings.draft_tokens + 1 if settings.drafter != "none" else 1
    streams = padded_rows(settings.parallel, 1)
    top = min(streams * window, MAX_GRAPH_ROWS)
    kept = (2 * streams - 1) * cfg.vocab * 4 * (1 + (window if window > 1 else 0))  # 1 + 2 + ... streams
    width = -(-settings.context // settings.page_tokens)
    chunks = K.decode_chunks(width, settings.page_tokens)
    q = cfg.heads * cfg.head_dim * (2 if cfg.attn_output_gate else 1)
    kv = 2 * cfg.kv_heads * cfg.head_dim
    mlp = max(cfg.intermediate, cfg.top_k * cfg.expert_intermediate + cfg.shared_intermediate)
    linear = cfg.conv_channels + 2 * cfg.lin_v_heads * cfg.lin_v_dim if cfg.linear_layers else 0
    attention = cfg.heads * (chunks + -(-chunks // K.GROUP)) * (cfg.head_dim + 2)
    products = [(q + kv, cfg.hidden), (cfg.hidden, cfg.heads * cfg.head_dim), (2 * mlp, cfg.hidden),
                (cfg.hidden, max(mlp, 1))]
    splits = [(K.qmv_split(M, Kd)[1], -(-M // K.TM_ROWS) * K.TM_ROWS) for M, Kd in products]
    segments = max((P * Mp for P, Mp in splits if P > 1), default=0)
    per_row = (4 * cfg.hidden + q + kv + cfg.heads * cfg.head_dim + attention + 3 * mlp + 2 * linear + segments)
    return kept + top * per_row * 4
