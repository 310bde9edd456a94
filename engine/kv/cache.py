"""The cache: every stream's state on one backend, built by the model (`model.make_cache(backend, plan)`).

It holds the K/V pages of the attention layers, `[pages, page_tokens, kv_heads, head_dim]` per
layer (windows and pool pages alike, plus one scratch page that padding rows write), and the
per-lane recurrent slots of the hybrid layers, `[lanes + 1, ...]` fp32 per array (the last slot is
scratch: padding rows carry lane -1), with one checkpoint slot per lane beside them: a batched
step that raises puts every row's state back from there (`checkpoint` / `rollback`). A scheduler
owns one cache; nothing else holds stream state.

Verify windows (speculative decoding, k drafts): the small recurrent arrays (conv rows) hold k + 1
blocks of `lanes + 1` slots. Window row j of lane L steps slot `L + j·(lanes + 1)` (row 0: the
lane's own), starting from the state row j-1 left (the decode ops step a window's rows in order and
write each row's state to its slot). A large one with a log (`state_logs`: the DeltaNet state,
~3 MB a layer) keeps only the lane's slot: row 0 writes its state there, and rows j >= 1 write
their update instead, (k̂, δ, e^g) at log slot `L + (j-1)·(lanes + 1)` (`logs`), ~1 % of a
state. `keep(lane, row)` makes the accepted row's state the lane's: it copies the small arrays'
slot and replays rows 1..row of the log onto the large ones (`Backend.deltanet_keep`: the step's
own operations in its order, so the same bits). A padding row (lane -1) lands on a block's scratch
slot whatever j is.

Context rings (a DFlash2 drafter, `ring`): per lane and drafter layer the keys and values of the
last `ring_len` positions of the stream's context, slot position % ring_len, fp16 (drafts need no
exact bits), and `ring_pos` [lanes, ring_len], the position each slot holds (-1: none), so a ring
says by itself what it holds wherever a snapshot puts it.

Snapshots: `read(lane, n)` copies a lane's first n positions of K/V and its recurrent slots to the
host as they are stored (raw bits, no re-encoding), and `write(lane, snap)` puts them into any lane
that holds pages for n positions, so a stream continues bit for bit wherever it lands.
docs/architecture.md has the contract.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import ml_dtypes
import numpy as np

from ..errors import PlanError

if TYPE_CHECKING:
    from ..ops.base import Backend
    from .lanes import Lane

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn
FP8_MAX = 448.0
GIB = 1 << 30
# Test-only K/V storage: float32 bits, lossless, for the tight parity tests. Never a setting.
F32 = "f32"
_STORED = {"bf16": np.uint16, "fp8": np.uint8, F32: np.uint32}  # raw bits: one layout for numpy and CuPy


def slots(tables: np.ndarray, positions: np.ndarray, page_tokens: int) -> np.ndarray:
    """Flat cache rows of (page table, absolute position) pairs: table[p // P]·P + p % P.

    The one page arithmetic of the engine; `slot_of` in kernels/attention.cu is its device twin.
    """
    pages = tables[np.arange(len(positions)), positions // page_tokens]
    return pages.astype(np.int64) * page_tokens + positions % page_tokens


def ring_bytes(lanes: int, ring: tuple[int, int, int, int] | None) -> int:
    """Bytes of the context rings of `lanes` streams: fp16 K and V of (layers, positions, kv heads,
    head dim) each, and an int32 position per slot."""
    if not ring:
        return 0
    layers, n, kvh, hd = ring
    return lanes * n * (layers * 2 * kvh * hd * 2 + 4)


def encode_kv(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """float32 [n, heads, dim] → raw stored bits (+ per-head fp8 scales = amax / 448)."""
    if dtype == F32:
        return np.ascontiguousarray(x, np.float32).view(np.uint32), None
    if dtype == "bf16":
        return x.astype(BF16).view(np.uint16), None
    amax = np.abs(x).max(-1)
    scale = np.where(amax > 0, amax / np.float32(FP8_MAX), np.float32(1.0)).astype(np.float32)
    return (x / scale[..., None]).astype(FP8).view(np.uint8), scale


def decode_kv(raw: np.ndarray, scale: np.ndarray | None, dtype: str) -> np.ndarray:
    if dtype == F32:
        return raw.view(np.float32)
    if dtype == "bf16":
        return raw.view(BF16).astype(np.float32)
    return raw.view(FP8).astype(np.float32) * scale[..., None]


@dataclass
class LaneState:
    """A stream's state on the host: K/V rows of its first `n` positions and its recurrent slots."""
    n: int
    kv_dtype: str
    kv: list[tuple[np.ndarray, ...]]  # per attention layer: k, v [n, kv_heads, head_dim] (+ fp8 scales [n, kv_heads])
    state: list[tuple[np.ndarray, ...]]  # per recurrent layer: its arrays at the lane's slot (fp32)
    ring: tuple[np.ndarray, ...] = ()  # a drafter's context ring: K, V [layers, ring_len, kvh, hd], positions

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for group in self.kv + self.state + [self.ring] for a in group)

    def on_host(self, to_host: Callable[[Any], np.ndarray]) -> LaneState:
        """The same state with every array on the host (a restore may have landed them on the device)."""
        def host(group: tuple) -> tuple[np.ndarray, ...]:
            return tuple(to_host(a) for a in group)
        return LaneState(self.n, self.kv_dtype, [host(g) for g in self.kv], [host(g) for g in self.state],
                         host(self.ring))


class Cache:
    """K/V pages and recurrent slots of every stream on one backend.

    The ops read `k`, `v` (per layer, raw bits), `k_scale`, `v_scale` (fp8 only), `page_tokens` and
    `dtype`; the hybrid models read `state[i]`, the arrays of recurrent layer i.
    """

    def __init__(self, backend: Backend, *, layers: int, pages: int, page_tokens: int, kv_heads: int,
                 head_dim: int, kv_dtype: str, lanes: int, state_shapes: list[tuple[tuple[int, ...], ...]] = (),
                 state_logs: list[tuple[tuple[int, ...], ...]] = (), draft_tokens: int = 0,
                 ring: tuple[int, int, int, int] | None = None):
        """draft_tokens: k of the verify windows (0: no drafting); the recurrent slots grow k + 1 times,
        but for the last array of a group with `state_logs` (per group: the shapes of a window row's
        log of it, or () for none), which keeps its lane slots and gains k logs a lane instead.
        ring: (layers, positions, kv heads, head dim) of a drafter's context ring per lane."""
        if kv_dtype not in backend.kv_stores:
            raise PlanError(f"the {backend.name} backend does not store {kv_dtype} K/V "
                            f"({', '.join(backend.kv_stores)})")
        self.page_tokens, self.dtype, self.lanes = page_tokens, kv_dtype, lanes
        self.draft_tokens = draft_tokens
        slots_total = (lanes + 1) * (draft_tokens + 1)
        self.scratch_page = pages - 1  # padding rows of a captured decode batch write here
        shape = (pages, page_tokens, kv_heads, head_dim)
        stored = np.dtype(_STORED[kv_dtype])
        need = layers * 2 * int(np.prod(shape)) * stored.itemsize
        if kv_dtype == "fp8":
            need += layers * 2 * int(np.prod(shape[:3])) * 4
        # The slots (k + 1 blocks with a scratch slot each; a logged array 1 block and k of logs),
        # and a checkpoint slot per lane.
        logs = list(state_logs) or [()] * len(state_shapes)
        self._logged = [bool(lg) for lg in logs]
        counts = [[lanes + 1 if lg and i == len(group) - 1 else slots_total for i in range(len(group))]
                  for group, lg in zip(state_shapes, logs)]
        need += sum((c + lanes) * 4 * int(np.prod(s)) for group, cs in zip(state_shapes, counts)
                    for s, c in zip(group, cs))
        need += (lanes + 1) * draft_tokens * sum(4 * int(np.prod(s)) for lg in logs for s in lg)
        need += ring_bytes(lanes, ring)
        free = backend.free_memory()
        if need > free:
            raise PlanError(f"the KV cache needs {need / GIB:.2f} GiB but the {backend.device} has {free / GIB:.2f} "
                            "GiB free; lower --memory-gib (or context or parallel), or use --kv-dtype fp8")
        self.k = [backend.zeros(shape, stored) for _ in range(layers)]
        self.v = [backend.zeros(shape, stored) for _ in range(layers)]
        if kv_dtype == "fp8":
            self.k_scale = [backend.zeros(shape[:3], np.float32) for _ in range(layers)]
            self.v_scale = [backend.zeros(shape[:3], np.float32) for _ in range(layers)]
            for a in self.k_scale + self.v_scale:
                a[...] = 1  # the scale of an all-zero head
        self.state = [tuple(backend.zeros((c, *s), np.float32) for s, c in zip(group, cs))
                      for group, cs in zip(state_shapes, counts)]
        self._saved = [tuple(backend.zeros((lanes, *s), np.float32) for s in group) for group in state_shapes]
        self.logs = [tuple(backend.zeros(((lanes + 1) * draft_tokens, *s), np.float32) for s in lg) if draft_tokens
                     else () for lg in logs]
        # every layer's arrays in one list each, for copies of slots across all of them at once
        self._slot_arrays = [a for group in self.state for a in group]
        self._saved_arrays = [a for group in self._saved for a in group]
        self._window_arrays = [a for group, lg in zip(self.state, self._logged)
                               for a in (group[:-1] if lg else group)]
        self._logged_states = [g[-1] for g, on in zip(self.state, self._logged) if on]  # what keep replays
        self._logged_logs = [lg for lg, on in zip(self.logs, self._logged) if on]
        ring_layers, self.ring_len, ring_heads, ring_dim = ring or (0, 0, 0, 0)
        self.ring_k = [backend.zeros((lanes, self.ring_len, ring_heads, ring_dim), np.float16)
                       for _ in range(ring_layers)]
        self.ring_v = [backend.zeros((lanes, self.ring_len, ring_heads, ring_dim), np.float16)
                       for _ in range(ring_layers)]
        self.ring_pos = backend.zeros((lanes, self.ring_len), np.int32)
        self.ring_pos[...] = -1
        self._b = backend

    # --- layout ---------------------------------------------------------------------------
    def _kv_arrays(self) -> list[list]:
        return [self.k, self.v] + ([self.k_scale, self.v_scale] if self.dtype == "fp8" else [])

    def _holds(self, lane: Lane, n: int) -> None:
        if n > len(lane.pages) * self.page_tokens:
            raise ValueError(f"lane {lane.index} holds pages for {len(lane.pages) * self.page_tokens} positions, "
                             f"not {n}")

    def rows(self, lane: Lane, n: int) -> np.ndarray:
        """Flat rows of the lane's positions 0..n-1."""
        self._holds(lane, n)
        table = np.asarray(lane.pages, np.int64)[None]
        return slots(np.broadcast_to(table, (n, table.shape[1])), np.arange(n), self.page_tokens)

    def runs(self, lane: Lane, n: int) -> list[tuple[int, int, int]]:
        """The lane's positions 0..n-1 as runs of consecutive flat rows, (first position, first row,
        length): one slice copy per run instead of a row scatter (a fresh lane's pages are mostly
        consecutive, a window's always)."""
        self._holds(lane, n)
        p, out = self.page_tokens, []
        for j in range(-(-n // p)):
            pos, row, size = j * p, lane.pages[j] * p, min(p, n - j * p)
            if out and out[-1][1] + out[-1][2] == row:
                out[-1] = (out[-1][0], out[-1][1], out[-1][2] + size)
            else:
                out.append((pos, row, size))
        return out

    @property
    def nbytes(self) -> int:
        rings = self.ring_k + self.ring_v + [self.ring_pos]
        return sum(a.nbytes for g in self._kv_arrays() + self.state + self._saved + self.logs + [rings] for a in g)

    # --- per-lane state -------------------------------------------------------------------
    def reset(self, lane: int) -> None:
        """A fresh stream on `lane`: zero recurrent state (K/V needs none: attention reads only
        positions its stream wrote)."""
        for group in self.state:
            for a in group:
                a[lane] = 0
        if self.ring_len:
            self.ring_pos[lane] = -1

    def ring_mark(self, lane: int, positions: np.ndarray) -> None:
        """The lane's ring slots of these positions hold them now (after `ring_write` of every layer)."""
        p = np.asarray(positions, np.int32)
        self.ring_pos[lane, self._b.asarray(p % self.ring_len)] = self._b.asarray(p)

    # --- verify windows -------------------------------------------------------------------
    @property
    def window_stride(self) -> int:
        """Slots from one window row's to the next's: `window_slots(lanes, j) = lanes + j·window_stride`
        (the decode ops' `stride`)."""
        return self.lanes + 1

    def window_slots(self, lanes, row: int):
        """Recurrent slots of window row `row` for rows of these lanes (int arrays, host or device)."""
        if not 0 <= row <= self.draft_tokens:
            raise ValueError(f"window row {row} is outside 0..{self.draft_tokens}")
        return lanes + row * self.window_stride

    def keep(self, lane: int, row: int, held: int = 0) -> None:
        """The state after window row `row` becomes the lane's (the rows after it were rejected); `held`:
        the lane holds window row `held`'s already (an earlier keep of this window), so only the rows
        after it are replayed."""
        if row <= held:
            return
        flat = self._window_arrays
        if flat:
            self._b.copy_slots(flat, flat, [int(self.window_slots(lane, row))], [lane])
        if self._logged_states:
            self._b.deltanet_keep(self._logged_states, self._logged_logs, lane, held + 1, row, self.window_stride)

    def checkpoint(self, lanes: list[int]) -> None:
        """Copy these lanes' recurrent slots aside, on the device (before a batched step)."""
        self._b.copy_slots(self._slot_arrays, self._saved_arrays, lanes, lanes)

    def rollback(self, lanes: list[int]) -> None:
        """Put back the recurrent slots `checkpoint` copied (K/V need nothing: a step that runs
        again rewrites the same rows with the same bits before anything reads them)."""
        self._b.copy_slots(self._saved_arrays, self._slot_arrays, lanes, lanes)

    @property
    def state_bytes(self) -> int:
        """Bytes of the recurrent slots and their checkpoints (what the plan's state_bytes counts)."""
        return sum(a.nbytes for g in self.state + self._saved + self.logs for a in g)

    @property
    def stateful(self) -> bool:
        """Whether streams carry recurrent state (a hybrid model)."""
        return bool(self.state)

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy whole pages (every attention layer's K/V bits), on the device."""
        if not src:
            return
        s, d = (self._b.asarray(np.asarray(p, np.int64)) for p in (src, dst))
        for group in self._kv_arrays():
            for a in group:
                a[d] = a[s]

    def read(self, lane: Lane, n: int) -> LaneState:
        """Host copies of the lane's first n positions of K/V and of its recurrent slots."""
        rows = self.rows(lane, n)
        b = self._b
        kv = [tuple(b.to_host(g[layer].reshape(-1, *g[layer].shape[2:])[rows]) for g in self._kv_arrays())
              for layer in range(len(self.k))]
        state = [tuple(np.array(b.to_host(a[lane.index]), np.float32) for a in group) for group in self.state]
        ring = ()
        if self.ring_len:
            ring = (np.stack([b.to_host(a[lane.index]) for a in self.ring_k]),
                    np.stack([b.to_host(a[lane.index]) for a in self.ring_v]), b.to_host(self.ring_pos[lane.index]))
        return LaneState(n, self.dtype, kv, state, ring)

    def mismatch(self, snap: LaneState) -> str | None:
        """Why `snap` cannot go into this cache (its dtype, layers, or an array's shape or type
        differs from what this cache stores), or None when it can."""
        if snap.kv_dtype != self.dtype:
            return f"it holds {snap.kv_dtype} K/V, the cache stores {self.dtype}"
        if len(snap.kv) != len(self.k) or len(snap.state) != len(self.state):
            return (f"it holds {len(snap.kv)} attention and {len(snap.state)} recurrent layers, the cache "
                    f"{len(self.k)} and {len(self.state)}")
        groups = self._kv_arrays()
        for layer, arrays in enumerate(snap.kv):
            want = [((snap.n, *g[layer].shape[2:]), np.dtype(g[layer].dtype)) for g in groups]
            if [(tuple(a.shape), a.dtype) for a in arrays] != want:
                return f"attention layer {layer} holds arrays of another shape or type than the cache's"
        for i, (group, saved) in enumerate(zip(self.state, snap.state)):
            if [(tuple(a.shape), a.dtype) for a in saved] != [(a.shape[1:], np.dtype(np.float32)) for a in group]:
                return f"recurrent layer {i} holds arrays of another shape or type than the cache's"
        return None

    def write(self, lane: Lane, snap: LaneState) -> None:
        """Put a snapshot into `lane` (which must hold pages for snap.n positions), bit for bit."""
        if snap.kv_dtype != self.dtype:
            raise ValueError(f"snapshot holds {snap.kv_dtype} K/V, the cache stores {self.dtype}")
        if len(snap.kv) != len(self.k) or len(snap.state) != len(self.state):
            raise ValueError(f"snapshot holds {len(snap.kv)} attention and {len(snap.state)} recurrent layers, "
                             f"the cache {len(self.k)} and {len(self.state)}")
        runs = self.runs(lane, snap.n)
        b = self._b
        for layer, arrays in enumerate(snap.kv):
            for g, a in zip(self._kv_arrays(), arrays):
                flat, src = g[layer].reshape(-1, *g[layer].shape[2:]), b.asarray(a)
                for pos, row, size in runs:
                    flat[row:row + size] = src[pos:pos + size]
        for group, saved in zip(self.state, snap.state):
            for a, s in zip(group, saved):
                a[lane.index] = b.asarray(s)  # float32: `mismatch` refuses any other
        if self.ring_len:
            self._write_ring(lane.index, snap.ring)

    def _write_ring(self, lane: int, ring: tuple[np.ndarray, ...]) -> None:
        """A snapshot's ring into the lane's; one of another shape (or none: taken without this
        drafter) leaves the ring empty, and the drafter starts from the positions it sees next."""
        shape = (len(self.ring_k), *self.ring_k[0].shape[1:]) if self.ring_k else None
        if len(ring) != 3 or ring[0].shape != shape or ring[1].shape != shape or ring[2].shape != (self.ring_len,):
            self.ring_pos[lane] = -1
            return
        b = self._b
        for i, (k, v) in enumerate(zip(ring[0], ring[1])):
            self.ring_k[i][lane] = b.asarray(k)  # an assignment casts to the ring's dtype on either backend
            self.ring_v[i][lane] = b.asarray(v)
        self.ring_pos[lane] = b.asarray(ring[2])
