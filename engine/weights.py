"""The in-memory model: canonical weight names, dense or affine-quantized tensors, one container.

Canonical names follow Hugging Face without the `model.` prefix and without `.weight`:
`embed_tokens`, `layers.3.self_attn.q_proj`, `layers.3.mlp.experts.gate_proj` (leading expert
dim), `norm`, `lm_head`, `mtp.*`. Norm weights hold the effective multiplier: zero-centred (1+w)
norms are shifted at load, so every RMSNorm is y = x·rsqrt(mean x²+eps)·w. conv1d is [C, K].
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from .config import ModelConfig


@dataclass
class Affine:
    """MLX-style affine quantization: w = scales·q + biases, q unsigned `bits` wide.

    `packed` is uint32 [..., out, in·bits/32]; element k of a word sits in bits [k·bits, (k+1)·bits)
    (element 0 least significant), elements run along the input dimension. `scales`/`biases` are
    [..., out, in/group] in their source dtype (bf16, fp16 or fp32).
    """

    packed: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int
    group: int

    @property
    def shape(self) -> tuple[int, ...]:
        *lead, out, words = self.packed.shape
        return (*lead, out, words * 32 // self.bits)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes + self.biases.nbytes


Tensor = Union[np.ndarray, Affine]


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint32 words → uint8 codes along the last axis."""
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits)
    codes = (packed[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per).astype(np.uint8)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes along the last axis → uint32 words (inverse of `unpack`)."""
    per = 32 // bits
    c = codes.astype(np.uint32).reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    shifts = (np.arange(per, dtype=np.uint32) * bits)
    return np.bitwise_or.reduce(c << shifts, axis=-1).astype(np.uint32)


def dequantize(w: Tensor) -> np.ndarray:
    """Any tensor → float32 array of its logical shape."""
    if isinstance(w, np.ndarray):
        return w.astype(np.float32)
    q = unpack(w.packed, w.bits).astype(np.float32)
    *lead, out, n = q.shape
    q = q.reshape(*lead, out, n // w.group, w.group)
    s = w.scales.astype(np.float32)[..., None]
    b = w.biases.astype(np.float32)[..., None]
    return (q * s + b).reshape(*lead, out, n)


def quantize(w: np.ndarray, bits: int, group: int, scale_dtype: Any = np.float16) -> Affine:
    """float → Affine with min/max per group (for tests and synthetic checkpoints)."""
    w = np.asarray(w, dtype=np.float32)
    *lead, out, n = w.shape
    g = w.reshape(*lead, out, n // group, group)
    lo, hi = g.min(-1), g.max(-1)
    levels = (1 << bits) - 1
    scale = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
    scale = scale.astype(scale_dtype).astype(np.float32)
    bias = lo.astype(scale_dtype).astype(np.float32)
    q = np.clip(np.rint((g - bias[..., None]) / scale[..., None]), 0, levels).astype(np.uint8)
    packed = pack(q.reshape(*lead, out, n), bits)
    return Affine(packed, scale.astype(scale_dtype), bias.astype(scale_dtype), bits, group)


@dataclass
class Model:
    """A loaded checkpoint: config, canonical weights, tokenizer and where it came from."""

    config: ModelConfig
    weights: dict[str, Tensor]
    tokenizer: Any  # engine.tokenizer.Tokenizer
    name: str
    source: str
    format: str  # "gguf" | "hf" | "mlx"
    meta: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.weights.values())
