"""One file per architecture; `build` picks the class for a loaded checkpoint."""
from __future__ import annotations

from typing import Callable

from ..ops.base import Backend
from ..weights import Model


def build(model: Model, backend: Backend, progress: Callable[[float], None] | None = None):
    """The model class of the checkpoint's architecture, its weights prepared on `backend`;
    `progress(fraction)` after each layer (it may raise to stop)."""
    arch = model.config.arch
    if arch == "llama":
        from .llama import Llama
        return Llama(model, backend, progress)
    if arch == "qwen3":
        from .qwen3 import Qwen3
        return Qwen3(model, backend, progress)
    from .qwen3_5 import Qwen3_5
    return Qwen3_5(model, backend, progress)
