"""The model fingerprint a KV snapshot carries: a snapshot continues only the model that wrote it.

It hashes the snapshot format version, the backend, the config, every weight's name, shape and
dtype, and the first and last MiB of each weight file (cheap on a 50 GB checkpoint, and any
re-quantization or re-export changes them). Weights without files (synthetic ones) hash the
first and last MiB of each array instead.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .kv.snapshots import VERSION
from .weights import Model

EDGE = 1 << 20  # bytes hashed at each end of a weight file


def weight_files(model: Model) -> list[Path]:
    """The files the weights were read from (a GGUF file, or a folder's *.safetensors)."""
    src = Path(model.source)
    if model.format == "gguf" and src.is_file():
        return [src]
    if src.is_dir():
        return sorted(src.glob("*.safetensors"))
    return []


def _edges(data: bytes | memoryview, size: int) -> tuple[bytes, bytes]:
    return bytes(data[:EDGE]), bytes(data[max(0, size - EDGE):])


def fingerprint(model: Model, backend: str) -> str:
    h = hashlib.sha256()
    h.update(f"lanechat-kv {VERSION} {backend}\n".encode())
    h.update(repr(sorted(asdict(model.config).items())).encode())
    for name in sorted(model.weights):
        w = model.weights[name]
        parts = [w] if isinstance(w, np.ndarray) else [w.packed, w.scales, w.biases]
        h.update((f"\n{name} " + " ".join(f"{p.shape}{p.dtype}" for p in parts)).encode())
    files = weight_files(model)
    for path in files:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(EDGE)
            f.seek(max(0, size - EDGE))
            tail = f.read(EDGE)
        h.update(f"\n{path.name} {size}".encode() + head + tail)
    if not files:
        for name in sorted(model.weights):
            w = model.weights[name]
            raw = np.ascontiguousarray(w if isinstance(w, np.ndarray) else w.packed).view(np.uint8).reshape(-1)
            for part in _edges(memoryview(raw), raw.size):
                h.update(part)
    return h.hexdigest()[:32]
