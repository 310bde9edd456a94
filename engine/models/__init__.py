"""One file per architecture; `build` picks the class for a loaded checkpoint."""
from __future__ import annotations

from ..ops.base import Backend
from ..weights import Model


def build(model: Model, backend: Backend):
    """The model class of the checkpoint's architecture, its weights prepared on `backend`."""
    arch = model.config.arch
    if arch == "llama":
        from .llama import Llama
        return Llama(model, backend)
    if arch == "qwen3":
        from .qwen3 import Qwen3
        return Qwen3(model, backend)
    from .qwen3_5 import Qwen3_5
    return Qwen3_5(model, backend)
