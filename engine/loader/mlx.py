"""MLX affine-quantized safetensors: the config's quantization block and the weight/scales/biases triples."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelError
from ..weights import Affine
from .safetensors_io import FLOATS, Checkpoint

BITS = (2, 4, 8)  # widths whose codes never straddle a 32-bit word


@dataclass
class Quantization:
    bits: int
    group: int
    overrides: dict[str, dict] = field(default_factory=dict)  # module path → {"bits", "group_size"}

    def label(self) -> str:
        return f"{self.bits}-bit g{self.group}"

    def module(self, path: str) -> tuple[int, int]:
        o = self.overrides.get(path) or {}
        return int(o.get("bits", self.bits)), int(o.get("group_size", self.group))


def quantization(raw: dict, names: list[str], config_path: Path) -> Quantization | None:
    """The MLX quantization block, or None for a dense checkpoint; other quantization schemes are refused."""
    q = raw.get("quantization")
    if q is None:
        qc = raw.get("quantization_config")
        if isinstance(qc, dict) and qc.get("quant_method"):
            raise ModelError(f"{config_path}: quantization method {qc['quant_method']!r} is not supported "
                             f"(MLX affine or unquantized only)")
        if any(n.endswith(".scales") for n in names):
            raise ModelError(f"{config_path}: the tensors are quantized (.scales) but there is no 'quantization' entry")
        return None
    if not isinstance(q, dict):
        raise ModelError(f"{config_path}: 'quantization' must be an object")
    if q.get("mode", "affine") != "affine":
        raise ModelError(f"{config_path}: MLX quantization mode {q['mode']!r} is not supported (affine only)")
    try:
        spec = Quantization(int(q.get("bits", 4)), int(q.get("group_size", 64)),
                            {k: v for k, v in q.items() if isinstance(v, dict)})
        widths = [spec.bits] + [spec.module(k)[0] for k in spec.overrides]
        groups = [spec.group] + [spec.module(k)[1] for k in spec.overrides]
    except (TypeError, ValueError) as e:
        raise ModelError(f"{config_path}: bad 'quantization' entry ({e})") from None
    if any(b not in BITS for b in widths):
        raise ModelError(f"{config_path}: {sorted(set(widths) - set(BITS))}-bit quantization is not supported "
                         f"(bits: {', '.join(map(str, BITS))})")
    if any(g <= 0 for g in groups):
        raise ModelError(f"{config_path}: group sizes must be positive")
    return spec


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
