"""DFlash2 weights: read from a checkpoint folder, every tensor checked (present, of the shape its
config gives, a float type, finite) before anything uses it, or drawn at random for
`synthetic:dflash2`. Canonical names are the stored ones without `.weight`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config import ModelConfig
from ..errors import ModelError
from ..loader.safetensors_io import FLOATS, Checkpoint
from .dflash2_config import SYNTHETIC, DFlashConfig

BARE = ("base_kernel", "predecessor_codebook", "successor_codebook")  # stored without `.weight` (parameters)


def stored_name(name: str) -> str:
    """The name z-lab's checkpoints store a canonical tensor under."""
    return name if name.endswith(BARE) else name + ".weight"


def read(spec: str, target: ModelConfig) -> tuple[DFlashConfig, dict[str, np.ndarray]]:
    """The config and weights of the drafter `spec` names (a folder or SYNTHETIC) for the target;
    ModelError naming the file and the tensor for anything missing or wrong. Weights of a folder
    stay views of its files (as stored) until they are prepared."""
    cfg = DFlashConfig.read(spec, target)
    if spec == SYNTHETIC:
        return cfg, random_tensors(cfg)
    folder = Path(spec)
    ckpt = Checkpoint(folder)
    names = set(ckpt.names)
    out = {}
    for name, shape in cfg.tensor_shapes().items():
        stored = next((n for n in (stored_name(name), name, name + ".weight") if n in names), None)
        if stored is None:
            raise ModelError(f"{folder}: tensor {stored_name(name)} is missing (its config.json needs it)")
        where = f"{ckpt.file(stored)}: tensor {stored}"
        if ckpt.shape(stored) != shape:
            raise ModelError(f"{where} has shape {list(ckpt.shape(stored))}, but config.json makes it {list(shape)}")
        if ckpt.dtype(stored) not in FLOATS:
            raise ModelError(f"{where} is {ckpt.dtype(stored)}; DFlash2 weights are float (bf16, f16, f32)")
        raw = ckpt.raw(stored)
        if not all(np.isfinite(raw[i:i + 4096].astype(np.float32)).all() for i in range(0, max(len(raw), 1), 4096)):
            raise ModelError(f"{where} holds NaN or infinite values")
        out[name] = raw
    return cfg, out


def random_tensors(cfg: DFlashConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 weights of every tensor `cfg` needs, by canonical name: a drafter that runs like a
    trained one (finite, sensibly scaled) and drafts badly, so verify windows reject."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in cfg.tensor_shapes().items():
        if len(shape) == 1:  # norms
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("base_kernel"):  # [2, taps, H]: the current row's tap near one, the previous one small
            w = 0.2 * rng.standard_normal(shape)
            w[:, 0] += 1.0
        elif name.endswith("kernel_projection"):
            w = rng.standard_normal(shape) * (0.05 / np.sqrt(shape[-1]))
        elif name.endswith("codebook"):
            w = rng.standard_normal(shape) / np.sqrt(np.sqrt(shape[-1]))
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = w.astype(np.float32)
    return out
