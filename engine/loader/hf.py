"""Model folders: Hugging Face safetensors (bf16/f16/f32) and MLX affine-quantized safetensors.

Both share one path: read config.json, open the (sharded) safetensors, group each module's tensors
under its canonical name, build dense float32 or Affine tensors, then `layout.finish`.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable

from ..config import ModelConfig, read_json
from ..errors import ModelError
from ..tokenizer import Tokenizer
from ..weights import Model, Tensor
from . import layout, mlx
from .safetensors_io import Checkpoint

SUFFIXES = ("scales", "biases")


def read_config(folder: Path) -> tuple[dict, ModelConfig]:
    path = folder / "config.json"
    raw = read_json(path)
    return raw, ModelConfig.from_hf(raw, str(path))


def config(folder: Path) -> ModelConfig:
    """The config as loading will leave it: no MTP layers where the checkpoint ships none (MLX drops them)."""
    cfg = read_config(folder)[1]
    if cfg.mtp_layers and not any(n.startswith("mtp.") for n in Checkpoint(folder).names):
        cfg.mtp_layers = 0
    return cfg


def modules(names: list[str]) -> dict[str, dict[str, str]]:
    """canonical name → {"weight"|"scales"|"biases": stored name}; vision tensors left out."""
    out: dict[str, dict[str, str]] = {}
    for stored in names:
        name = layout.canonical(stored)
        if name is None:
            continue
        part = "weight"
        for suffix in SUFFIXES:
            if name.endswith("." + suffix):
                name, part = name[: -len(suffix) - 1], suffix
        out.setdefault(name, {})[part] = stored
    return out


def _zero_centred_norms(cfg: ModelConfig, ckpt: Checkpoint, quantized: bool) -> bool:
    """Whether norms are stored as w in y = x·(1+w) and need +1.

    Only Qwen3.5 has such norms. mlx-lm shifts them when it converts, and the same conversion turns
    conv1d from [C, 1, K] into [C, K, 1], so the conv1d layout says which convention the file uses.
    """
    if not cfg.arch.startswith("qwen3_5"):
        return False
    for name in ckpt.names:
        shape = ckpt.shape(name)
        if name.endswith("conv1d.weight") and len(shape) == 3:
            return shape[1] == 1 and shape[2] != 1
    return not quantized


def load(folder: Path, progress: Callable[[str, float], None] | None = None) -> Model:
    raw, cfg = read_config(folder)
    ckpt = Checkpoint(folder)
    quant = mlx.quantization(raw, ckpt.names, folder / "config.json")
    weights: dict[str, Tensor] = {}
    origin: dict[str, str] = {}
    groups = modules(ckpt.names)
    for i, (name, parts) in enumerate(groups.items()):
        stored = parts.get("weight") or next(iter(parts.values()))
        origin[name] = f"{ckpt.file(stored)}: tensor {stored}"
        if len(parts) > 1 or "weight" not in parts:
            if quant is None:
                raise ModelError(f"{origin[name]}: has scales/biases but the model is not quantized")
            weights[name] = mlx.affine(ckpt, stored.removesuffix(".weight"), parts, quant)
        else:
            weights[name] = ckpt.float32(stored)
        if progress:
            progress("loading weights", (i + 1) / len(groups))
    dropped = layout.finish(weights, cfg, origin, str(folder), _zero_centred_norms(cfg, ckpt, quant is not None))
    tok = Tokenizer.from_folder(folder)
    layout.check_tokenizer(tok, cfg, str(folder / "tokenizer.json"))
    return Model(cfg, weights, tok, name=folder.name, source=str(folder), format="mlx" if quant else "hf",
                 meta={"label": format_label(raw, ckpt, folder), "dropped": dropped})


def format_label(raw: dict, ckpt: Checkpoint, folder: Path) -> str:
    """'MLX 4-bit g64' or 'HF bf16' (the dtype most weights are stored in)."""
    quant = mlx.quantization(raw, ckpt.names, folder / "config.json")
    if quant is not None:
        return f"MLX {quant.label()}"
    dtypes = Counter(ckpt.dtype(n) for n in ckpt.names)
    return f"HF {dtypes.most_common(1)[0][0].lower()}"
