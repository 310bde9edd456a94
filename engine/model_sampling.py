"""The sampling a model's makers recommend: Hugging Face `generation_config.json`, GGUF's
`general.sampling.*` keys, and for the embedded default its model card's values (its GGUF carries
none). A value of the wrong type or out of range is left out, never guessed."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import fetch, jsonfile
from .errors import ModelError

# SmolLM2-135M-Instruct's model card: temperature 0.2, top-p 0.9.
DEFAULT_MODEL_SAMPLING = {"temperature": 0.2, "top_p": 0.9}
_GGUF_KEYS = {"temperature": "general.sampling.temp", "top_p": "general.sampling.top_p",
              "top_k": "general.sampling.top_k"}
_MAX_JSON_BYTES = 1 << 20  # a generation config is a few hundred bytes


def sampling_defaults(model: str | None) -> dict[str, float | int]:
    """{temperature, top_p, top_k} as far as the model says (possibly none of them); {} for a model
    that cannot be read (the loader reports that where it matters)."""
    from .loader import gguf, resolve
    try:
        path, kind = resolve(model)
    except ModelError:
        return {}
    if _is_embedded_default(path):
        return dict(DEFAULT_MODEL_SAMPLING)
    if kind == "gguf":
        try:
            reader = gguf.read(path)
        except ModelError:
            return {}
        raw = {name: _gguf_value(reader, key) for name, key in _GGUF_KEYS.items()}
    else:
        raw = _generation_config(path)
    return _valid(raw)


def _is_embedded_default(path: Path) -> bool:
    # Wherever it lies (fetched, or copied elsewhere): its name and exact size are its own.
    try:
        return path.name == fetch.FILENAME and path.stat().st_size == fetch.SIZE
    except OSError:
        return False


def _generation_config(folder: Path) -> dict[str, Any]:
    path = folder / "generation_config.json"
    try:
        if not path.is_file():
            return {}
        raw = jsonfile.read(path, max_bytes=_MAX_JSON_BYTES)
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    if raw.get("do_sample") is False:
        return {"temperature": 0.0}  # the makers decode greedily
    return {k: raw.get(k) for k in _GGUF_KEYS}


def _gguf_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    try:
        return None if field is None else field.contents()
    except Exception:  # noqa: BLE001 - a malformed field is a missing one
        return None


def _valid(raw: dict[str, Any]) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    t, p, k = raw.get("temperature"), raw.get("top_p"), raw.get("top_k")
    if _number(t) and 0 <= t <= 100:
        out["temperature"] = float(t)
    if _number(p) and 0 < p <= 1:
        out["top_p"] = float(p)
    if isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= 1 << 20:
        out["top_k"] = k
    return out


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
