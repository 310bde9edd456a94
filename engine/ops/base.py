"""The backend contract: the op set every backend implements, and all that models, the cache and the
scheduler may call. `NumpyBackend` is the reference; `CupyBackend` declares every member with the
same signature (tests/test_ops_base.py checks both, the GPU one without importing CuPy).

Arrays are the backend's own (numpy or CuPy); row metadata (`tables`, `positions`, `lanes`) may be
host int arrays or, inside a captured decode graph, device arrays.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..kv.cache import Cache
    from ..kv.snapshots import Landing
    from ..rows import Rows
    from ..settings import EngineSettings, SamplingParams
    from ..weights import Tensor

# What a weight is for: a product's matrix (`linear`), the embedding table (gathered, and the tied
# head), a norm's or bias's vector, the DeltaNet conv kernel, or stacked [E, out, in] experts.
Kind = Literal["linear", "embed", "norm", "conv", "experts"]
Array = Any  # a backend array (numpy.ndarray, cupy.ndarray, or a backend's lazy value)


@dataclass
class GraphStats:
    """What a backend's decode graphs hold: batch sizes captured, capture failures, pool bytes."""
    captured: int = 0
    failed: list[str] = field(default_factory=list)
    pool_bytes: int = 0


class Backend(Protocol):
    name: str  # "numpy" | "cupy"
    device: str  # in words, for the startup line
    kv_stores: tuple[str, ...]  # the K/V storage dtypes its kv_write and attention take
    unified_memory: bool  # the device's memory is the system's (a GB10): the plan leaves the desktop room
    prompt_chunk: int  # the prefill chunk when the settings leave it to the backend: where its products pay

    # --- memory ------------------------------------------------------------------------------
    def prepare(self, w: Tensor, kind: Kind = "linear") -> Array:
        """A canonical weight → what the ops take (dequantized, repacked, on the device)."""

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Array: ...

    def asarray(self, a: Any) -> Array: ...

    def to_host(self, a: Array) -> np.ndarray: ...

    def landing(self) -> Landing:
        """Where a snapshot file's arrays land as they are read (`kv.snapshots.load`): this
        backend's memory, through whatever staging makes that one pass over the bytes."""

    def free_memory(self) -> int:
        """Bytes the device could still give (the default KV budget is a share of it)."""

    def synchronize(self) -> None: ...

    def prompt_work(self) -> AbstractContextManager:
        """Launches inside run as prompt work: after all work so far, beside the decode steps that
        follow (a GPU's second, low-priority stream), until `join_prompt`."""

    def prompt_pending(self) -> bool:
        """Whether prompt work launched so far may still be running."""

    def join_prompt(self) -> None:
        """Everything launched from now on comes after the prompt work launched so far."""

    def mark(self) -> Any:
        """A point in the backend's queue of work (a device event on a GPU): `seconds(a, b)` between two
        is the device's time from a to b, read without stalling the work queued after them."""

    def seconds(self, a: Any, b: Any) -> float:
        """Seconds between two marks (waits for b to be reached)."""

    def copy_slots(self, src: list[Array], dst: list[Array], src_slots: list[int], dst_slots: list[int]) -> None:
        """dst[i][dst_slots[j]] = src[i][src_slots[j]] for every array pair i and slot pair j (float32
        arrays of slots along axis 0; src and dst may be the same arrays when the slots differ)."""

    def device_lost(self, error: BaseException) -> bool:
        """Whether `error` left the device unusable (a sticky fault: the engine must restart),
        as opposed to an error of one computation that the other streams survive."""

    # --- elementwise and norms ---------------------------------------------------------------
    def embed(self, table: Array, ids: Array) -> Array: ...

    def rmsnorm(self, x: Array, w: Array, eps: float) -> Array: ...

    def add_rmsnorm(self, x: Array, residual: Array, w: Array, eps: float) -> tuple[Array, Array]:
        """(norm(x + residual), x + residual)."""

    def silu_mul(self, gate: Array, up: Array) -> Array: ...

    def sigmoid_mul(self, x: Array, gate: Array) -> Array: ...

    def rope(self, x: Array, positions: Array, theta: float, rotary_dim: int) -> Array:
        """NeoX RoPE on the first `rotary_dim` dims of every head: x [n, heads, head_dim]."""

    # --- linear ------------------------------------------------------------------------------
    def linear(self, x: Array, w: Array, pad_to: int = 0, fp16: bool = False, feeds_norm: bool = False) -> Array:
        """x [n, in] @ wᵀ; pad_to > 0 marks a prompt chunk of that fixed row count, whose products may
        then round inputs and weights to fp16 (fp16; a backend without such a path computes exactly).
        feeds_norm: the result's one use is the x of an `add_rmsnorm` (a backend may run the product
        with the one that stages that norm; the numbers are the same)."""

    def concat(self, parts: list[Array], axis: int = -1) -> Array:
        """Concatenation of arrays along `axis` (column-wise by default: [n, k_i] parts)."""

    # --- attention ---------------------------------------------------------------------------
    def kv_write(self, cache: Cache, layer: int, k: Array, v: Array, tables: Array, positions: Array) -> None:
        """New K/V rows into the cache at (table, position) of each row."""

    def attention(self, q: Array, cache: Cache, layer: int, tables: Array, positions: Array,
                  prompt: bool = False, window: int = 1, fp16: bool = False) -> Array:
        """Causal attention of rows q [n, heads, hd] over their lanes' keys 0..position.

        window > 1: decode rows in verify windows of that many rows per lane (`Rows.window`); a row
        reads the K/V its window's earlier rows wrote in this forward's `kv_write`. fp16: a prompt
        chunk's products may take fp16 operands (`Rows.fp16`)."""

    # --- drafters: DFlash2's block over a stream's context ring (Cache.ring_*) ----------------
    def ring_write(self, cache: Cache, layer: int, lane: int, k: Array, v: Array, positions: np.ndarray) -> None:
        """Context keys and values [n, kv_heads, hd] of a lane's positions into ring layer `layer`
        (slot position % cache.ring_len; at most ring_len distinct slots)."""

    def ring_attention(self, q: Array, k: Array, v: Array, cache: Cache, layer: int, lane: int, first: int,
                       window: int | None, causal: bool) -> Array:
        """Attention of one block's rows q [B, heads, hd] at positions first..first+B-1 over the
        lane's ring keys of positions before `first` within `window` of each row (None: all) and
        the block's own keys k, v [B, kv_heads, hd] (all of them; with `causal`, those up to the row)."""

    def dynamic_conv(self, x: Array, dyn: Array, base: Array, group: int) -> Array:
        """DFlash2's dynamic conv over one block's rows x [B, H], in row order: y_t[c] =
        Σ_o (base[o, c] + dyn[t, o·G + c // group]) · x_{t-o}[c], rows before the block zero;
        dyn [B, taps·G] with G = H / group, base [taps, H]."""

    def top_k(self, x: Array, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k largest values of each row of x [n, V] and their ids, on the host (float32,
        int64; largest first, equal values in id order)."""

    # --- heads -------------------------------------------------------------------------------
    def decode_step(self, model: Any, rows: Rows, cache: Cache) -> Array:
        """One decode forward of `rows` (logits [n, vocab]); valid until the next decode step."""

    def choose(self, logits: Array, params: list[SamplingParams], positions: list[int]) -> list[int]:
        """A token per row: greedy by argmax (lowest index on ties), sampled keyed by (seed, position)."""

    # Whether a decode step can run on the tokens the step before chose, before the host has read
    # them (`chosen`, `Rows.fed`): a GPU's graphs can; the CPU computes in order and gains nothing.
    overlaps: bool

    def chosen(self, logits: Array, params: list[SamplingParams], positions: list[int]) -> Any:
        """The tokens a decode step with `Rows.choose` chose for `logits` as `choose` would, as a handle
        (copy back begun) that `take` reads and `Rows.fed` feeds to the next step; None where the step
        did not choose every row itself (then `choose` of the logits)."""

    def take(self, chosen: Any) -> list[int]:
        """The tokens of a `chosen` handle."""

    def warm_decode(self, model: Any, cache: Cache, width: int, streams: int,
                    shapes: list[tuple[int, bool, tuple]]) -> int:
        """Prepare every decode step shape up to `streams` streams now (start-up), not at a stream's
        first step: (window, hidden, taps) per shape, page tables `width` wide. Returns how many
        graphs it captured (0 without graphs)."""

    def graph_stats(self) -> GraphStats: ...

    def graph_bytes(self, cfg: ModelConfig, settings: EngineSettings) -> int:
        """Device memory its decode graphs will keep for these settings (0 without graphs)."""

    # --- hybrid: Gated DeltaNet and MoE (recurrent state updated in place at `lane(s)`) -------
    # Decode steps take `window`, `stride`: rows in verify windows of `window` rows per stream
    # (`Rows.window`); window row j steps from the state row j-1 left, exactly as a one-row step from
    # a copy of it, and writes slot lane + j·stride (`Cache.window_slots`, stride `Cache.window_stride`)
    # or, for the DeltaNet state, its log (`Cache.logs`; row 0 the lane's slot); `deltanet_keep` replays.
    def conv1d_prompt(self, x: Array, w: Array, conv_state: Array, lane: int) -> Array: ...

    def conv1d_step(self, x: Array, w: Array, conv_state: Array, lanes: Array, window: int = 1,
                    stride: int = 0) -> Array: ...

    def conv1d_step_gates(self, x: Array, w: Array, conv_state: Array, lanes: Array, a: Array, b: Array,
                          a_log: Array, dt_bias: Array, window: int = 1,
                          stride: int = 0) -> tuple[Array, Array, Array]: ...

    def deltanet_gates(self, a: Array, b: Array, a_log: Array, dt_bias: Array) -> tuple[Array, Array]: ...

    def deltanet_step(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array,
                      lanes: Array, window: int = 1, stride: int = 0, logs: tuple = ()) -> Array: ...

    def deltanet_step_norm(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, lanes: Array,
                           z: Array, w: Array, eps: float, window: int = 1, stride: int = 0,
                           logs: tuple = ()) -> Array:
        """`gated_rmsnorm(deltanet_step(...), z, w, eps)`, the same numbers (one launch on a GPU)."""

    def deltanet_keep(self, states: list, logs: list[tuple], lane: int, first: int, last: int,
                      stride: int) -> None: ...

    def deltanet_prompt(self, q: Array, k: Array, v: Array, g: Array, beta: Array, state: Array, lane: int,
                        chunk: int = 64) -> Array: ...

    def gated_rmsnorm(self, x: Array, z: Array, w: Array, eps: float) -> Array: ...

    def moe_route(self, logits: Array, top_k: int, shared_gate: Array | None = None) -> tuple[Array, Array]: ...

    def moe_experts(self, x: Array, gate_up: Array, down: Array, experts: Array, weights: Array,
                    prompt: bool = False, shared: Array | None = None, shared_gate: Array | None = None) -> Array:
        """Σ_j weights[:, j]·expert_j(x) (+ sigmoid(shared_gate)·shared). A GPU backend may return decode
        rows' combination pending, as it does a norm: the next product can sum it while staging its input,
        and `to_host` or any other op sees the numbers."""
