"""NVRTC 12.9 and 13.0 from the test extra's pip wheels (nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvrtc)."""
from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import pytest

WHEELS = {"12.9": ("nvidia-cuda-nvrtc-cu12", "libnvrtc.so.12"), "13.0": ("nvidia-cuda-nvrtc", "libnvrtc.so.13")}


def library(version: str) -> Path:
    """The wheel's libnvrtc.so.N; a skip where the wheel is not installed (a GPU host without the
    test extra), a failure in CI, which must check it."""
    dist, soname = WHEELS[version]
    try:
        files = metadata.files(dist) or []
    except metadata.PackageNotFoundError:
        files = []
    lib = next((f for f in files if f.name == soname), None)
    if lib is None:
        msg = f"{dist} is not installed (pip install -e '.[test]' brings NVRTC {version})"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return Path(lib.locate())
