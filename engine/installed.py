"""The models folder as a person manages it: what is installed (format, quantization, size on disk,
maximum context, when it was last used), and deleting one.

Every entry of the models folder that is a model (a .gguf file, or a folder the loader takes) is
listed; one that cannot be read is listed with its error, so it can still be deleted. Models used
recently from elsewhere (a GGUF in LM Studio's folder) follow; only the models folder's are deleted
here. When a model was last used lives in the state folder (`models-used.json`), written by
whoever loads one.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from . import jsonfile, paths
from .errors import LanechatError, ModelError

USED_FILE = "models-used.json"
MAX_USED = 512  # entries kept in the file (the most recent)
MAX_TIME = 95_617_584_000  # 5000-01-01, in seconds since the epoch


@dataclass(frozen=True)
class Installed:
    path: Path
    name: str
    format: str  # "GGUF Q4_K_M", "MLX 4-bit g64", "HF bf16", ... ("" when unreadable)
    arch: str
    size_bytes: int
    max_context: int
    last_used: float | None  # seconds since the epoch
    source: str  # "owner/name" for a download from the Hub, "" otherwise
    error: str = ""  # why it cannot be loaded, if it cannot
    in_folder: bool = True  # in the models folder (False: used recently from elsewhere)


def size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _used_path() -> Path:
    return paths.state_dir() / USED_FILE


def _read_used() -> dict[str, float]:
    try:
        raw = jsonfile.read(_used_path())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    # a time any view can show (seconds since the epoch, before the year 5000) for a path that can exist
    return {k: float(v) for k, v in raw.items() if k and "\0" not in k
            and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < MAX_TIME}


def mark_used(path: str | Path, when: float | None = None) -> None:
    """Remember that the model at `path` was just loaded (atomically; the newest MAX_USED kept)."""
    used = _read_used()
    used[str(Path(path).expanduser().resolve())] = time.time() if when is None else when
    _write_used(dict(sorted(used.items(), key=lambda kv: kv[1])[-MAX_USED:]))


def _write_used(used: dict[str, float]) -> None:
    tmp = _used_path().with_suffix(".tmp")
    tmp.write_text(json.dumps(used, indent=1))
    tmp.replace(_used_path())


def recent(limit: int = 8) -> list[Path]:
    """Models used most recently first, those that still exist."""
    ordered = sorted(_read_used().items(), key=lambda kv: -kv[1])
    return [Path(p) for p, _ in ordered if Path(p).exists()][:limit]


def _source(path: Path) -> str:
    from .hub import SOURCE_FILE
    meta = path / SOURCE_FILE if path.is_dir() else None
    if meta is None or not meta.is_file():
        return ""
    try:
        raw = jsonfile.read(meta)
    except (OSError, ValueError):
        return ""
    return raw.get("repo", "") if isinstance(raw, dict) and isinstance(raw.get("repo"), str) else ""


def describe_entry(path: Path, used: dict[str, float], in_folder: bool = True) -> Installed:
    from .loader import load_config, resolve
    from .loader.gguf import display_name, quant_label
    from .loader.hf import format_label, read_config
    from .loader.safetensors_io import Checkpoint
    last = used.get(str(path.resolve()))
    try:
        model, kind = resolve(path)
        cfg = load_config(model)
        if kind == "gguf":
            name, label = display_name(model), f"GGUF {quant_label(model)}"
        else:
            raw, _ = read_config(model)
            name, label = path.name, format_label(raw, Checkpoint(model), model)
        last = last or used.get(str(model.resolve()))
        return Installed(path, name, label, cfg.arch, size_on_disk(path), cfg.max_position, last, _source(path),
                         in_folder=in_folder)
    except LanechatError as e:
        return Installed(path, path.name, "", "", size_on_disk(path), 0, last, _source(path), str(e), in_folder)


def listing(folder: Path | None = None, recent_limit: int = 8) -> list[Installed]:
    """Every model in the models folder, by name; then up to `recent_limit` models used recently
    from other places, newest first."""
    folder = (folder or paths.models_dir()).resolve()
    used = _read_used()
    entries = [p for p in sorted(folder.iterdir()) if not p.name.startswith(".")
               and (p.is_dir() or p.suffix == ".gguf")]
    inside = sorted((describe_entry(p, used) for p in entries), key=lambda m: m.name.lower())
    linked = {p.resolve() for p in entries}  # a link in the folder to a model elsewhere: listed once
    elsewhere = [p for p in recent(MAX_USED)
                 if p != folder and folder not in p.parents and p.resolve() not in linked][:recent_limit]
    return inside + [describe_entry(p, used, in_folder=False) for p in elsewhere]


def delete(path: str | Path, folder: Path | None = None) -> None:
    """Remove an installed model (a file or a folder directly inside the models folder, nothing else)."""
    folder = (folder or paths.models_dir()).resolve()
    target = Path(path).expanduser().resolve()
    if target.parent != folder or not target.exists():
        raise ModelError(f"{target} is not a model in the models folder ({folder}); only those are deleted here")
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    used = _read_used()
    if used.pop(str(target), None) is not None:
        _write_used(used)
