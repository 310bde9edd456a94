"""JSON from files we did not write: size and nesting depth are checked before parsing.

Every JSON reader of the engine and the app goes through here. Python's parser recurses once per
level, so a file nested 10⁵ deep is a RecursionError, and a 2 GB file a memory spike; both are
refused first with a one-line `JSONLimitError` (a ValueError, as a syntax error is).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

MAX_BYTES = 16 << 20
MAX_DEPTH = 64
# unrolled ("normal* (special normal*)*"): a per-character alternation would make the regex engine
# keep a backtracking entry per character, gigabytes for one long string
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte that is not a bracket


class JSONLimitError(ValueError):
    """JSON too large or nested too deeply to read."""


def depth(data: bytes) -> int:
    """How deeply arrays and objects nest in `data` (brackets inside strings do not count)."""
    marks = np.frombuffer(_STRING.sub(b'""', data).translate(None, _BRACKETS), np.uint8)
    if not marks.size:
        return 0
    steps = np.where((marks == ord("[")) | (marks == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def check(data: str | bytes, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> None:
    """Raise JSONLimitError if `data` is too large or too deep to parse (without parsing it)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise JSONLimitError(f"{len(raw)} bytes is more than the {max_bytes} bytes allowed")
    if depth(raw) > max_depth:
        raise JSONLimitError(f"nested more than {max_depth} levels deep")


def loads(data: str | bytes, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """`json.loads` within the limits; raises ValueError (JSONLimitError or a syntax error)."""
    check(data, max_depth, max_bytes)
    try:
        return json.loads(data)
    except RecursionError:  # the check above makes this unreachable; kept so no reader can crash
        raise JSONLimitError(f"nested more than {max_depth} levels deep") from None


def read(path: str | Path, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES) -> Any:
    """A file's JSON value; OSError when it cannot be read, ValueError when it is not JSON or too big."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    return loads(data, max_depth, max_bytes)
