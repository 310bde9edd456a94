"""One file per architecture; `build` picks the class for a loaded checkpoint."""
from __future__ import annotations

from ..weights import Model


def build(model: Model, backend):
    arch = model.config.arch
    if arch == "llama":
        from .llama import Llama as cls
    elif arch == "qwen3":
        from .qwen3 import Qwen3 as cls
    else:
        from .qwen3_5 import Qwen3_5 as cls
    return cls(model, backend)
