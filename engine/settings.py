"""EngineSettings and SamplingParams: plain data, validated, JSON-friendly."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from .errors import PlanError

BACKENDS = ("auto", "numpy", "cupy")
KV_DTYPES = ("bf16", "fp8")
PAGING = ("off", "pages", "all")
# How prompt chunks' products round: fp16 inputs and weights on tensor cores (~2^-11 an element, 2.5x
# faster on the GPU), or exact (the decode products' near-fp32 arithmetic). numpy is always exact.
PREFILL_PRECISIONS = ("fp16", "exact")
# Bounds on what a request or a settings file may ask for; past them a value is a mistake, and the
# shapes built from it (a padded prompt chunk, a lane table) would allocate before any plan is made.
MAX_PARALLEL, MAX_CONTEXT, MAX_PAGE_TOKENS, MAX_PREFILL_CHUNK = 256, 1 << 24, 1 << 16, 8192
MAX_MEMORY_GIB = float(1 << 20)
MAX_TEMPERATURE, MAX_TOKENS, MAX_TOKEN_ID = 100.0, 1 << 24, 1 << 31
MAX_STOPS, MAX_STOP_CHARS = 16, 1024
DRAFTERS = ("none", "ngram", "mtp", "dflash2", "oracle")  # oracle: the gates' and the bench's (proposes a known run)
MAX_DRAFT_TOKENS = 16


@dataclass
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    max_tokens: int = 1024
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False

    def validate(self) -> "SamplingParams":
        """Raise PlanError naming the first bad value; every caller's request comes through here."""
        _number("temperature", self.temperature, 0, MAX_TEMPERATURE)
        _number("top_p", self.top_p, 0, 1, open_low=True)
        _integer("top_k", self.top_k, 0, MAX_TOKEN_ID, "(0 = off)")
        _integer("max_tokens", self.max_tokens, 1, MAX_TOKENS)
        _integer("seed", self.seed, 0, (1 << 64) - 1)
        if not isinstance(self.stop, list) or len(self.stop) > MAX_STOPS or not all(
                isinstance(t, str) and 0 < len(t) <= MAX_STOP_CHARS for t in self.stop):
            raise PlanError(f"stop must be a list of at most {MAX_STOPS} strings of 1..{MAX_STOP_CHARS} characters, "
                            f"got {_shown(self.stop)}")
        if not isinstance(self.ignore_eos, bool):
            raise PlanError(f"ignore_eos must be true or false, got {_shown(self.ignore_eos)}")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class EngineSettings:
    model: str | None = None  # None: the embedded default model
    backend: str = "auto"
    parallel: int = 4
    context: int = 4096
    kv_dtype: str = "bf16"
    paging: str = "pages"
    page_tokens: int = 256
    memory_gib: float | None = None  # KV budget; None: a safe fraction of free memory
    prefill_chunk: int = 0  # rows a prompt chunk runs; 0: the backend's (Backend.prompt_chunk)
    prefill_precision: str = "fp16"  # PREFILL_PRECISIONS
    drafter: str = "none"  # speculative decoding: none, ngram (prompt lookup), mtp (the checkpoint's own head), dflash2
    drafter_model: str | None = None  # dflash2: the drafter checkpoint folder (or synthetic:dflash2)
    draft_tokens: int = 4  # drafts per verify window (k: the window is k + 1 rows)
    prompt_cache_gib: float = 0.0  # pool pages kept for prefix reuse, part of the KV budget (0 = off)
    snapshot_disk_gib: float = 4.0  # the app's KV snapshot files on disk, oldest removed first (0 = off)
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def validate(self) -> "EngineSettings":
        if self.model is not None and (not isinstance(self.model, str) or not self.model or "\0" in self.model):
            raise PlanError(f"model must be a path (or empty for the default model), got {_shown(self.model)}")
        if not isinstance(self.backend, str) or self.backend not in BACKENDS:
            raise PlanError(f"backend must be one of {', '.join(BACKENDS)}, got {_shown(self.backend)}")
        _integer("parallel", self.parallel, 1, MAX_PARALLEL, what="parallel streams")
        _integer("context", self.context, 16, MAX_CONTEXT, what="context tokens")
        if not isinstance(self.kv_dtype, str) or self.kv_dtype not in KV_DTYPES:
            raise PlanError(f"kv dtype must be bf16 or fp8, got {_shown(self.kv_dtype)}")
        if not isinstance(self.paging, str) or self.paging not in PAGING:
            raise PlanError(f"paging must be off, pages or all, got {_shown(self.paging)}")
        p = self.page_tokens
        if isinstance(p, bool) or not isinstance(p, int) or not 16 <= p <= MAX_PAGE_TOKENS or p & (p - 1):
            raise PlanError(f"page size must be a power of two from 16 to {MAX_PAGE_TOKENS} tokens, got {_shown(p)}")
        c = self.prefill_chunk
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= MAX_PREFILL_CHUNK or c & (c - 1):
            raise PlanError(f"prefill chunk must be a power of two from 1 to {MAX_PREFILL_CHUNK} tokens "
                            f"(or 0: the backend's), got {_shown(c)}")
        if not isinstance(self.prefill_precision, str) or self.prefill_precision not in PREFILL_PRECISIONS:
            raise PlanError(f"prefill precision must be fp16 or exact, got {_shown(self.prefill_precision)}")
        if not isinstance(self.drafter, str) or self.drafter not in DRAFTERS:
            raise PlanError(f"drafter must be one of {', '.join(DRAFTERS)}, got {_shown(self.drafter)}")
        _integer("draft tokens", self.draft_tokens, 1, MAX_DRAFT_TOKENS, what="drafts per verify window")
        if self.drafter_model is not None and (not isinstance(self.drafter_model, str) or not self.drafter_model
                                               or "\0" in self.drafter_model):
            raise PlanError(f"drafter model must be a folder path (or empty), got {_shown(self.drafter_model)}")
        if self.memory_gib is not None:
            _number("memory budget (GiB)", self.memory_gib, 0, MAX_MEMORY_GIB, open_low=True)
        _number("prompt cache (GiB)", self.prompt_cache_gib, 0, MAX_MEMORY_GIB)
        _number("snapshot disk budget (GiB)", self.snapshot_disk_gib, 0, MAX_MEMORY_GIB)
        if not isinstance(self.sampling, SamplingParams):
            raise PlanError("sampling must be SamplingParams")
        self.sampling.validate()
        return self

    def with_chunk(self, backend_chunk: int) -> "EngineSettings":
        """These settings with the backend's prefill chunk where they leave it to the backend (0)."""
        return self if self.prefill_chunk else replace(self, prefill_chunk=backend_chunk)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "EngineSettings":
        """Tolerant of unknown and missing keys, so settings files survive version changes."""
        if not isinstance(raw, dict) or not isinstance(raw.get("sampling") or {}, dict):
            raise PlanError("settings must be an object (with a sampling object)")
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in raw.items() if k in known and k != "sampling"}
        sp_known = {f.name for f in fields(SamplingParams)}
        sp = {k: v for k, v in (raw.get("sampling") or {}).items() if k in sp_known}
        return cls(**kw, sampling=SamplingParams(**sp))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(name: str, value: Any, low: float, high: float, open_low: bool = False) -> None:
    """A real number (not a bool, not NaN or inf) in [low, high], or (low, high] with open_low."""
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value > low if open_low else value >= low) and value <= high)
    if not ok:
        span = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise PlanError(f"{name} must be a number in {span}, got {_shown(value)}")


def _integer(name: str, value: Any, low: int, high: int, note: str = "", what: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PlanError(f"{name} must be a whole number from {low} to {high}{' ' + note if note else ''}"
                        f"{' (' + what + ')' if what else ''}, got {_shown(value)}")
