"""Where Lanechat keeps things: platformdirs, or everything under $LANECHAT_HOME when it is set."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "lanechat"


def _home() -> Path | None:
    home = os.environ.get("LANECHAT_HOME")
    return Path(home).expanduser() if home else None


def _dir(kind: str) -> Path:
    home = _home()
    if home is not None:
        path = home / kind
    else:
        path = Path(getattr(platformdirs, f"user_{kind}_dir")(APP, appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    return _dir("data")


def config_dir() -> Path:
    return _dir("config")


def state_dir() -> Path:
    return _dir("state")


def cache_dir() -> Path:
    return _dir("cache")


def models_dir() -> Path:
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
