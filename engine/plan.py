"""The memory plan: how many pages, windows and state bytes the settings need, and the startup line.

Computed from the model config and the settings alone (no weights), so the settings dialog can show
it live. The default budget leaves most free memory alone: on a GB10 the GPU's memory is the
desktop's too (unified memory), and there it always leaves the desktop UNIFIED_RESERVE.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import drafters
from .config import ModelConfig
from .errors import LanechatError, PlanError
from .kv.cache import ring_bytes
from .memory import system_free_bytes
from .settings import EngineSettings

GIB = 1 << 30
DEFAULT_FRACTION = 0.5  # of the memory free after the weights, at most
UNIFIED_RESERVE = 16 * GIB  # what the default budget never takes from a desktop whose GPU shares its memory


@dataclass
class Plan:
    line: str
    fits: bool
    error: str | None = None
    mode: str = "pages"
    parallel: int = 0
    context: int = 0
    page_tokens: int = 0
    kv_dtype: str = "bf16"
    page_bytes: int = 0
    window_pages: int = 0  # pages in one window (= one context)
    windows: int = 0  # lanes with a window of their own
    pool_pages: int = 0
    state_bytes: int = 0
    kv_bytes: int = 0  # windows + pool
    budget_bytes: int = 0
    unified: bool = False  # the GPU's memory is the system's (GB10)
    graph_bytes: int = 0  # what the backend's captured decode graphs keep (outside the KV budget)
    drafter: str = "none"  # the drafter that runs (a refused one leaves "none")
    draft_tokens: int = 0  # k of the verify windows (0: plain decoding)
    draft_layers: int = 0  # attention layers of the drafter's own on every stream's pages (MTP)
    draft_ring: tuple[int, int, int, int] | None = None  # a DFlash2 drafter's context ring per stream
    ring_bytes: int = 0  # what those rings take (beside the pages, in the budget)
    drafter_note: str | None = None  # why the drafter asked for does not run
    prompt_cache_bytes: int = 0  # pool pages the prompt cache may keep (inside the pool, not added)

    @property
    def pages_total(self) -> int:
        return self.windows * self.window_pages + self.pool_pages

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.state_bytes + self.ring_bytes


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def make_plan(cfg: ModelConfig, s: EngineSettings, free_bytes: int | None = None, weight_bytes: int = 0,
              unified: bool = False, graph_bytes: int = 0, drafter_error: str | None = None) -> Plan:
    """Raises PlanError with the setting to change when the settings cannot work. `unified`: the
    memory is shared with the desktop, whose UNIFIED_RESERVE the default budget leaves alone.
    `graph_bytes`: what the backend's decode graphs will keep (`Backend.graph_bytes`), taken off the
    free memory first. `drafter_error`: why the drafter's checkpoint did not load (it runs plain)."""
    s.validate()
    if s.context > cfg.max_position:
        raise PlanError(f"context {s.context} is beyond the model's maximum of {cfg.max_position} tokens")
    P, n = s.page_tokens, s.parallel
    W = -(-s.context // P)
    f = drafters.refused(s.drafter, drafter_error) if drafter_error else drafters.fit(cfg, s.drafter, s.drafter_model)
    drafter, note, layers = f.drafter, f.note, f.kv_layers
    k = f.most_drafts(s.draft_tokens) if drafter != "none" else 0
    ring = f.dflash.ring(s.context) if f.dflash else None
    rings = ring_bytes(n, ring)
    page_bytes = P * cfg.kv_bytes_per_token(s.kv_dtype, layers)
    # One state slot more than streams: padding rows of a captured decode batch update a scratch slot;
    # a verify window of k drafts keeps the conv rows after each of its k + 1 rows and the DeltaNet
    # state's log of each row after the first; and per stream a checkpoint slot (a failed batched
    # step puts the rows' state back).
    state = cfg.recurrent_bytes(n, k)
    windows = {"off": n, "pages": 1, "all": 0}[s.paging]
    pool_lanes = n - windows
    need_pool = pool_lanes * W
    fixed = windows * W * page_bytes + state + rings
    if s.memory_gib is not None:
        budget = int(s.memory_gib * GIB)
        source = f"a memory budget of {s.memory_gib:g} GiB"
    else:
        free = system_free_bytes() if free_bytes is None else free_bytes
        after = max(0, free - weight_bytes - graph_bytes)
        budget = int(after * DEFAULT_FRACTION)
        kept = "the weights and decode graphs" if graph_bytes else "the weights"
        source = f"the default budget ({gib(budget)}, half of what is free after {kept})"
        if unified and budget > after - UNIFIED_RESERVE:
            budget = max(0, after - UNIFIED_RESERVE)
            source = (f"the default budget ({gib(budget)}: what is free after {kept}, less "
                      f"{gib(UNIFIED_RESERVE)} left to the desktop)")
    min_pool = W if pool_lanes else 0  # a pool lane must be able to hold one whole context
    if budget < fixed + min_pool * page_bytes:
        raise PlanError(
            f"{source} is too small for {n} stream(s) of {s.context} tokens: one context needs "
            f"{gib(fixed + min_pool * page_bytes)}; lower context or parallel, use fp8 KV, or raise the memory budget")
    pool = min(need_pool, (budget - fixed) // page_bytes) if page_bytes else need_pool
    if s.memory_gib is not None and free_bytes is not None and fixed + pool * page_bytes > free_bytes - weight_bytes:
        # An explicit budget may exceed what this machine has; the pool is allocated next, so say it now.
        raise PlanError(f"{source} asks for {gib(fixed + pool * page_bytes)} of KV memory, but only "
                        f"{gib(max(0, free_bytes - weight_bytes))} is free; lower the memory budget, context or "
                        f"parallel")
    p = Plan(line="", fits=True, mode=s.paging, parallel=n, context=s.context, page_tokens=P, kv_dtype=s.kv_dtype,
             page_bytes=page_bytes, window_pages=W, windows=windows, pool_pages=pool, state_bytes=state,
             kv_bytes=(windows * W + pool) * page_bytes, budget_bytes=budget, unified=unified,
             graph_bytes=graph_bytes, drafter=drafter, draft_tokens=k, draft_layers=layers, draft_ring=ring,
             ring_bytes=rings, drafter_note=note,
             prompt_cache_bytes=min(int(s.prompt_cache_gib * GIB), pool * page_bytes) if s.paging != "off" else 0)
    p.line = plan_line(p)
    return p


def plan_line(p: Plan) -> str:
    """The seed's words: `plan: the engine's own and 7 more on 1039 pages (16.23 GiB), no window`.
    What the seed's line did not have follows it after " · ", so the line starts the same."""
    pool = f"{p.pool_pages} pages ({gib(p.pool_pages * p.page_bytes)})"
    window = gib(p.window_pages * p.page_bytes)
    others = p.parallel - 1
    if p.mode == "all":
        who = "the engine's own" + (f" and {others} more" if others else "")
        line = f"plan: {who} on {pool}, no window"
    elif p.mode == "pages":
        rest = f" and {others} more on {pool}" if others else ", no pages"
        line = f"plan: the engine's own window ({window}){rest}"
    else:
        windows = f"{p.parallel} window{'s' if p.parallel > 1 else ''}"
        line = f"plan: {windows} of {p.context} tokens ({gib(p.kv_bytes)}), no pages"
    if p.state_bytes:
        line += f" · recurrent state {gib(p.state_bytes)}"
    if p.graph_bytes:
        line += f" · decode graphs {gib(p.graph_bytes)}"
    if p.draft_tokens:
        ring = f", context ring {gib(p.ring_bytes)}" if p.ring_bytes else ""
        line += f" · drafter {p.drafter} ({p.draft_tokens} drafts per window{ring})"
    if p.drafter_note:
        line += f" · {p.drafter_note}"
    if p.prompt_cache_bytes:
        line += f" · prompt cache up to {gib(p.prompt_cache_bytes)} of the pool"
    if p.unified:
        line += " · unified memory"
    return line


def model_config(model: str | None) -> ModelConfig:
    """The config of a model path, the default model (None) or `synthetic:NAME`, without weights."""
    if model and model.startswith("synthetic:"):
        from .synthetic import config_for
        return config_for(model.split(":", 1)[1])[0]
    from .loader import load_config
    return load_config(model)


def weights_bytes(model: str | None) -> int:
    """Bytes of weights on disk (a fair estimate of their size in memory, quantized or not)."""
    from .fetch import default_model_path
    if model and model.startswith("synthetic:"):
        return 0
    path = Path(model) if model else default_model_path()
    if path.is_dir():
        return sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return path.stat().st_size if path.exists() else 0


def plan(settings: EngineSettings, free_bytes: int | None = None) -> Plan:
    """The plan for these settings, reading only the model's config; never raises for bad settings
    or a bad model: the Plan then has fits=False and the error line."""
    try:
        cfg = model_config(settings.model)
        drafter = settings.drafter_model if settings.drafter == "dflash2" else None
        extra = weights_bytes(drafter) if drafter else 0  # the drafter's weights are in memory too
        return make_plan(cfg, settings, free_bytes, weights_bytes(settings.model) + extra)
    except LanechatError as e:
        return Plan(line=f"plan: does not fit: {e}", fits=False, error=str(e))
