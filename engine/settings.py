"""EngineSettings and SamplingParams: plain data, validated, JSON-friendly."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import PlanError

BACKENDS = ("auto", "numpy", "cupy")
KV_DTYPES = ("bf16", "fp8")
PAGING = ("off", "pages", "all")


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
        if self.temperature < 0:
            raise PlanError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PlanError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise PlanError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_tokens < 1:
            raise PlanError(f"max_tokens must be >= 1, got {self.max_tokens}")
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
    prefill_chunk: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def validate(self) -> "EngineSettings":
        if self.backend not in BACKENDS:
            raise PlanError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.parallel < 1:
            raise PlanError(f"parallel must be at least 1, got {self.parallel}")
        if self.context < 16:
            raise PlanError(f"context must be at least 16 tokens, got {self.context}")
        if self.kv_dtype not in KV_DTYPES:
            raise PlanError(f"kv dtype must be bf16 or fp8, got {self.kv_dtype!r}")
        if self.paging not in PAGING:
            raise PlanError(f"paging must be off, pages or all, got {self.paging!r}")
        p = self.page_tokens
        if p < 16 or p & (p - 1):
            raise PlanError(f"page size must be a power of two >= 16 tokens, got {p}")
        c = self.prefill_chunk
        if c < 1 or c & (c - 1):
            raise PlanError(f"prefill chunk must be a power of two, got {c}")
        if self.memory_gib is not None and self.memory_gib <= 0:
            raise PlanError(f"memory budget must be positive, got {self.memory_gib} GiB")
        self.sampling.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "EngineSettings":
        """Tolerant of unknown and missing keys, so settings files survive version changes."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in raw.items() if k in known and k != "sampling"}
        sp_known = {f.name for f in fields(SamplingParams)}
        sp = {k: v for k, v in (raw.get("sampling") or {}).items() if k in sp_known}
        return cls(**kw, sampling=SamplingParams(**sp))
