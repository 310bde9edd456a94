"""Crash-safe file writes: a reader sees the old file or the new one, never half of either.

A write goes to `.<name>.<random>.tmp` beside the file, locked while it is written and renamed
over the file, so a temp file nobody holds a lock on was left by a writer that died (kill -9,
power cut): `leftovers` finds those.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file in the same folder, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until the rename: the file is not a leftover
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename itself must reach the disk too, or a power cut can bring the old name back.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def json_bytes(obj: Any) -> bytes:
    """Readable UTF-8 JSON. Text may hold lone surrogates (no UTF-8 can): those are written as
    \\uXXXX escapes, which JSON allows and which read back as the same text."""
    text = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
    return _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text).encode("utf-8")


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json_bytes(obj))


def leftovers(folder: Path, min_age_s: float = 2.0) -> list[Path]:
    """Temp files of `write_atomic` in `folder` whose writer is gone: no lock on them, and not
    touched for `min_age_s` (a writer takes its lock right after creating the file)."""
    found = []
    for tmp in sorted(folder.glob(".*.tmp")):
        try:
            if time.time() - tmp.stat().st_mtime < min_age_s or not tmp.is_file():
                continue
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile: its writer renamed it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live writer holds it
        finally:
            os.close(fd)
        found.append(tmp)
    return found
