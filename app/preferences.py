"""The app's own choices beside the engine settings (`preferences.json` in the config dir): one
JSON object whose keys belong to the modules that use them (idle unloading, the theme). A write
keeps the other keys; an unreadable file reads as empty, so every choice takes its default.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine import jsonfile, paths

from .atomic import write_json_atomic

MAX_BYTES, MAX_DEPTH = 1 << 16, 4


def preferences_path() -> Path:
    return paths.config_dir() / "preferences.json"


def load() -> dict[str, Any]:
    try:
        raw = jsonfile.read(preferences_path(), MAX_DEPTH, MAX_BYTES)
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def save(key: str, value: Any) -> None:
    """Set one preference, keeping the others as they are on disk."""
    write_json_atomic(preferences_path(), {**load(), key: value})
