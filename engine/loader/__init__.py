"""Load a model from a GGUF file or a Hugging Face / MLX safetensors folder into canonical weights.

`load_model(None)` loads the embedded default model (SmolLM2-135M-Instruct Q4_1 GGUF). The format is
read from the files themselves, never from a name: GGUF magic bytes; a folder with config.json and
*.safetensors is MLX when it declares affine quantization (or has .scales tensors), otherwise HF.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..config import ModelConfig
from ..errors import ModelError
from ..fetch import default_model_path
from ..weights import Model
from . import gguf, hf
from .safetensors_io import Checkpoint

__all__ = ["load_model", "load_config", "describe", "resolve"]

Progress = Callable[[str, float], None]


def resolve(path: str | Path | None) -> tuple[Path, str]:
    """The model file or folder a path names, and its kind: "gguf" or "folder"."""
    if path is None:
        p = default_model_path()
        if not p.is_file():
            raise ModelError(f"the default model is not downloaded yet ({p}): run `python -m engine fetch-default`")
    else:
        p = Path(path).expanduser()
    if not p.exists():
        raise ModelError(f"{p}: no such file or folder")
    if p.is_file():
        if gguf.is_gguf(p):
            return p, "gguf"
        if p.name != "config.json" and p.suffix != ".safetensors":
            raise ModelError(f"{p}: not a GGUF file (a model is a .gguf file or a folder with config.json "
                             f"and *.safetensors)")
        p = p.parent  # a file inside a model folder stands for the folder
    if (p / "config.json").is_file() and any(p.glob("*.safetensors")):
        return p, "folder"
    ggufs = [g for g in sorted(p.glob("*.gguf")) if gguf.is_gguf(g)]
    if len(ggufs) == 1 and not (p / "config.json").exists():
        return ggufs[0], "gguf"
    raise ModelError(f"{p}: not a model folder (it needs config.json and *.safetensors, or a single .gguf file)")


def load_model(path: str | Path | None, progress: Progress | None = None) -> Model:
    """Every weight in canonical names (engine.weights), the tokenizer, and the config."""
    p, kind = resolve(path)
    if progress:
        progress(f"opening {p.name}", 0.0)
    return gguf.load(p, progress) if kind == "gguf" else hf.load(p, progress)


def load_config(path: str | Path | None) -> ModelConfig:
    """The model's shapes without reading any weight data (GGUF: metadata only)."""
    p, kind = resolve(path)
    return gguf.config(p) if kind == "gguf" else hf.config(p)


def describe(path: str | Path | None) -> str:
    """One line for people, e.g. 'SmolLM2-135M-Instruct · llama · 30 layers · GGUF Q4_1'."""
    p, kind = resolve(path)
    if kind == "gguf":
        cfg, name, label = gguf.config(p), gguf.display_name(p), f"GGUF {gguf.quant_label(p)}"
    else:
        raw, cfg = hf.read_config(p)
        name, label = p.name, hf.format_label(raw, Checkpoint(p), p)
    return f"{name} · {cfg.arch} · {cfg.layers} layers · {label}"
