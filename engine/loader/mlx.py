"""MLX affine-quantized safetensors: the config's quantization block and the weight/scales/biases triples."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import Fields, shown
from ..errors import ModelError
from ..weights import Affine
from .safetensors_io import FLOATS, Checkpoint

BITS = (2, 4, 8)  # widths whose codes never straddle a 32-bit word


@dataclass
class Quantization:
    bits: int
    group: int
    overrides: dict[str, tuple[int, int]] = field(default_factory=dict)  # module path → (bits, group size)

    def label(self) -> str:
        return f"{self.bits}-bit g{self.group}"

    def module(self, path: str) -> tuple[int, int]:
        return self.overrides.get(path, (self.bits, self.group))


def quantization(raw: dict, names: list[str], config_path: Path) -> Quantization | None:
    """The MLX quantization block, or None for a dense checkpoint; other quantization schemes are refused."""
    q = raw.get("quantization")
    if q is None:
        qc = raw.get("quantization_config")
        if isinstance(qc, dict) and qc.get("quant_method"):
            raise ModelError(f"{config_path}: quantization method {shown(qc['quant_method'])} is not supported "
                             f"(MLX affine or unquantized only)")
        if any(n.endswith(".scales") for n in names):
            raise ModelError(f"{config_path}: the tensors are quantized (.scales) but there is no 'quantization' entry")
        return None
    if not isinstance(q, dict):
        raise ModelError(f"{config_path}: 'quantization' must be an object")
    if q.get("mode", "affine") != "affine":
        raise ModelError(f"{config_path}: MLX quantization mode {shown(q['mode'])} is not supported (affine only)")
    top = _widths(Fields(q, str(config_path), "quantization."), (4, 64))
    overrides = {k: _widths(Fields(v, str(config_path), f"quantization.{k}."), top)
                 for k, v in q.items() if isinstance(v, dict)}
    return Quantization(*top, overrides)


def _widths(f: Fields, default: tuple[int, int]) -> tuple[int, int]:
    bits, group = f.int("bits", default[0], lo=1, hi=64), f.int("group_size", default[1], lo=1, hi=1 << 16)
    if bits not in BITS:
        raise ModelError(f"{f.source}: {bits}-bit quantization ({f.prefix}bits) is not supported "
                         f"(bits: {', '.join(map(str, BITS))})")
    return bits, group


def affine(ckpt: Checkpoint, module: str, parts: dict[str, str], q: Quantization) -> Affine:
    """One quantized module: uint32 `weight`, `scales` and `biases`, checked against each other."""
    missing = [k for k in ("weight", "scales", "biases") if k not in parts]
    any_name = next(iter(parts.values()))
    if missing:
        raise ModelError(f"{ckpt.file(any_name)}: quantized module {module} has no {', '.join(missing)}")
    w, s, b = parts["weight"], parts["scales"], parts["biases"]
    where = f"{ckpt.file(w)}: tensor {w}"
    if ckpt.dtype(w) != "U32":
        raise ModelError(f"{where}: quantized weight has dtype {ckpt.dtype(w)}, expected U32")
    if ckpt.dtype(s) not in FLOATS or ckpt.dtype(b) not in FLOATS:
        raise ModelError(f"{where}: scales/biases must be float, got {ckpt.dtype(s)}/{ckpt.dtype(b)}")
    bits, group = q.module(module)
    packed = ckpt.raw(w)
    if packed.ndim < 2:
        raise ModelError(f"{where}: quantized weight has shape {list(packed.shape)}")
    n_in = packed.shape[-1] * 32 // bits
    if n_in % group:
        raise ModelError(f"{where}: group size {group} does not divide the input dimension {n_in}")
    want = (*packed.shape[:-1], n_in // group)
    for name in (s, b):
        if ckpt.shape(name) != want:
            raise ModelError(f"{ckpt.file(name)}: tensor {name} has shape {list(ckpt.shape(name))}, but {bits}-bit "
                             f"groups of {group} over {list(packed.shape)} need {list(want)}")
    return Affine(packed, ckpt.raw(s), ckpt.raw(b), bits, group)
