"""Snapshots: a stream stopped between steps, in host memory and as a file on disk.

The file is safetensors: the token ids, every attention layer's K/V rows as stored bits (plus fp8
scales), every recurrent layer's arrays and a drafter's context ring, with a header naming the model fingerprint
(`engine.fingerprint`), the K/V dtype, the page size it ran with, the hash of its token ids and
an xxh3 checksum of every tensor's bytes. It is written to a temp file and renamed, so a full disk
or a kill leaves the old file whole. A file whose format, fingerprint, dtype or checksum does not
match is refused (SnapshotError says why), and so is one whose arrays the engine's cache does not
hold (`Cache.mismatch`, checked when the stream is queued): its conversation is recomputed,
never continued from the wrong state. A load makes one pass over the file's bytes, each grain
hashed as it is read into the backend's memory (`Landing`: the host arrays, or a GPU's staging).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import xxhash
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ..errors import LanechatError
from ..safetensors_dtypes import DTYPES
from .cache import LaneState

FORMAT = "lanechat-kv"
VERSION = 1


class SnapshotError(LanechatError):
    """A snapshot file that cannot be used here (damaged, foreign, another model or K/V dtype)."""


@dataclass
class Snapshot:
    """A stream stopped between steps: its tokens and, on the host, its state in the cache."""
    tokens: list[int]
    prompt_len: int
    cache: LaneState  # K/V rows of the first cache.n tokens and the recurrent state after them

    @property
    def kv_dtype(self) -> str:
        return self.cache.kv_dtype

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes

    def continues(self, ids: list[int]) -> bool:
        """Whether a prompt goes on from this snapshot: its state covers a prefix of `ids` and
        at least one position of `ids` is left to compute."""
        n = self.cache.n
        return len(ids) > n and ids[:n] == self.tokens[:n]


def _tensors(snap: Snapshot) -> dict[str, np.ndarray]:
    out = {"tokens": np.asarray(snap.tokens, np.int32)}
    for layer, arrays in enumerate(snap.cache.kv):
        for j, a in enumerate(arrays):
            out[f"kv.{layer}.{j}"] = np.ascontiguousarray(a)
    for i, arrays in enumerate(snap.cache.state):
        for j, a in enumerate(arrays):
            out[f"state.{i}.{j}"] = np.ascontiguousarray(a)
    for j, a in enumerate(snap.cache.ring):
        out[f"ring.{j}"] = np.ascontiguousarray(a)
    return out


def _checksum(tensors: dict[str, np.ndarray]) -> str:
    h = xxhash.xxh3_64()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(memoryview(np.ascontiguousarray(tensors[name])).cast("B"))
    return h.hexdigest()


def token_hash(tokens: list[int]) -> str:
    return xxhash.xxh3_64_hexdigest(np.asarray(tokens, np.int32).tobytes())


def save(path: Path, snap: Snapshot, fingerprint: str, page_tokens: int) -> int:
    """Write the snapshot atomically (temp file, fsync, rename); returns the file's size. On any
    error (OSError: a full disk) the temp file is removed and an older file at `path` is left as
    it was."""
    tensors = _tensors(snap)
    meta = {"format": FORMAT, "version": str(VERSION), "fingerprint": fingerprint, "kv_dtype": snap.kv_dtype,
            "page_tokens": str(page_tokens), "n": str(snap.cache.n), "prompt_len": str(snap.prompt_len),
            "kv_layers": str(len(snap.cache.kv)), "state_layers": str(len(snap.cache.state)),
            "tokens_hash": token_hash(snap.tokens), "checksum": _checksum(tensors)}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        try:
            save_file(tensors, tmp, metadata=meta)
        except SafetensorError as e:  # its I/O errors (a full disk) are OSErrors to the caller
            raise OSError(f"{path.name}: {e}") from None
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path.stat().st_size


class Landing(Protocol):
    """Where a snapshot's arrays land while its file is read: `chunk` gives the host buffer for
    bytes [offset, offset + nbytes) of `dest` (the destination itself on the host, a reused
    page-locked staging buffer for a device), `land` puts them there once they are read and
    hashed in grains of `grain_bytes`, `finish` waits until everything landed."""
    chunk_bytes: int
    grain_bytes: int

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any: ...

    def chunk(self, dest: Any, offset: int, nbytes: int) -> memoryview: ...

    def land(self, dest: Any, offset: int, buf: memoryview) -> None: ...

    def finish(self) -> None: ...


GRAIN = 4 << 20  # bytes read and then hashed while they are still in the CPU's caches


class HostLanding:
    """Arrays in host memory, each read straight into its own bytes."""
    chunk_bytes = 1 << 62  # a whole tensor at once: there is no staging to keep small
    grain_bytes = GRAIN

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        return np.empty(shape, dtype)

    def chunk(self, dest: np.ndarray, offset: int, nbytes: int) -> memoryview:
        return memoryview(dest.reshape(-1).view(np.uint8))[offset:offset + nbytes]

    def land(self, dest: np.ndarray, offset: int, buf: memoryview) -> None:
        pass

    def finish(self) -> None:
        pass


HOST = HostLanding()
# safetensors dtypes a snapshot's arrays may have: K/V are kept as raw bits (U16 / U8), never BF16 or fp8
_DTYPES = {k: v for k, v in DTYPES.items() if k not in ("BF16", "F8_E4M3")}


def load(path: Path, fingerprint: str, kv_dtype: str, landing: Landing = HOST,
         split: dict[str, float] | None = None) -> Snapshot:
    """The snapshot in `path`, checked against this engine; SnapshotError names what is wrong.

    One pass over the bytes: each tensor is read in grains into where `landing` puts it, and each
    grain is hashed as soon as it is read. `split`, when given, gets the seconds spent reading,
    hashing and landing (`read`, `check`, `land`); the token ids always land on the host."""
    spent = {"read": 0.0, "check": 0.0, "land": 0.0}
    try:
        with safe_open(str(path), "numpy") as f:  # validates the header: offsets, shapes, dtypes
            meta = f.metadata() or {}
        if meta.get("format") != FORMAT or meta.get("version") != str(VERSION):
            raise SnapshotError(f"{path.name}: not a Lanechat KV snapshot of format {VERSION}")
        if meta.get("fingerprint") != fingerprint:
            raise SnapshotError(f"{path.name}: taken with another model, engine version or backend")
        if meta.get("kv_dtype") != kv_dtype:
            raise SnapshotError(f"{path.name}: holds {meta.get('kv_dtype')} K/V, the engine runs {kv_dtype}")
        with open(path, "rb", buffering=0) as raw:
            digest, tensors = _read(raw, path.name, landing, spent)
    except SnapshotError:
        raise
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as e:
        raise SnapshotError(f"{path.name}: unreadable ({type(e).__name__}: {e})") from None
    if split is not None:
        split.update(spent)
    if digest != meta.get("checksum"):
        raise SnapshotError(f"{path.name}: checksum mismatch (the file is damaged)")
    try:
        n, kv_layers, state_layers = int(meta["n"]), int(meta["kv_layers"]), int(meta["state_layers"])
        tokens = tensors["tokens"].astype(np.int64).tolist()
        kv = [tuple(tensors[f"kv.{layer}.{j}"] for j in range(_count(tensors, f"kv.{layer}.")))
              for layer in range(kv_layers)]
        state = [tuple(tensors[f"state.{i}.{j}"] for j in range(_count(tensors, f"state.{i}.")))
                 for i in range(state_layers)]
        ring = tuple(tensors[f"ring.{j}"] for j in range(_count(tensors, "ring.")))
        prompt_len = int(meta["prompt_len"])
    except (KeyError, ValueError) as e:
        raise SnapshotError(f"{path.name}: inconsistent header ({e})") from None
    # a reply's last sampled token is never fed: a snapshot with a reply holds one row fewer than tokens
    most = len(tokens) - (1 if len(tokens) > prompt_len else 0)
    if token_hash(tokens) != meta.get("tokens_hash") or not 0 < n <= most or not 0 < prompt_len <= len(tokens) \
            or any(a.shape[0] != n for group in kv for a in group):
        raise SnapshotError(f"{path.name}: inconsistent header (tokens and rows disagree)")
    return Snapshot(tokens, prompt_len, LaneState(n, kv_dtype, kv, state, ring))


def _read(raw, name: str, landing: Landing, spent: dict[str, float]) -> tuple[str, dict]:
    """Every tensor of an open snapshot file landed, and the xxh3 of names and bytes in the order
    `_checksum` takes them (by name)."""
    size = int.from_bytes(raw.read(8), "little")
    header = json.loads(raw.read(size))
    header.pop("__metadata__", None)
    h = xxhash.xxh3_64()
    tensors = {}
    try:
        for tname in sorted(header):
            info = header[tname]
            if info["dtype"] not in _DTYPES:
                raise SnapshotError(f"{name}: holds a tensor of dtype {info['dtype']}, which no snapshot has")
            begin, end = info["data_offsets"]
            where = HOST if tname == "tokens" else landing
            dest = tensors[tname] = where.empty(tuple(info["shape"]), _DTYPES[info["dtype"]])
            raw.seek(8 + size + begin)
            h.update(tname.encode())
            for offset in range(0, end - begin, where.chunk_bytes):
                t = time.perf_counter()
                buf = where.chunk(dest, offset, min(where.chunk_bytes, end - begin - offset))
                spent["land"] += time.perf_counter() - t
                for i in range(0, len(buf), where.grain_bytes):
                    grain = buf[i:i + where.grain_bytes]
                    t = time.perf_counter()
                    if raw.readinto(grain) != len(grain):  # a regular file reads short only at its end
                        raise SnapshotError(f"{name}: truncated")
                    t2 = time.perf_counter()
                    h.update(grain)
                    spent["read"] += t2 - t
                    spent["check"] += time.perf_counter() - t2
                t = time.perf_counter()
                where.land(dest, offset, buf)
                spent["land"] += time.perf_counter() - t
    finally:  # also after an error: no copy may still read a staging buffer
        t = time.perf_counter()
        landing.finish()
        spent["land"] += time.perf_counter() - t
    return h.hexdigest(), tensors


def _count(tensors: dict, prefix: str) -> int:
    return sum(1 for name in tensors if name.startswith(prefix) and name[len(prefix):].isdigit())


def prune(folder: Path, budget_bytes: int, keep: Path | None = None) -> list[Path]:
    """Remove the oldest snapshot files (by modification time) until the folder's files fit the
    budget; `keep` (the one just written) stays. Temp files a killed write left go too (the one
    writer calls this between its writes). Returns what was removed."""
    removed = []
    for tmp in folder.glob(".*.kv.*.tmp"):
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    files = sorted((p for p in folder.glob("*.kv") if p.is_file()), key=lambda p: p.stat().st_mtime)
    total = sum(p.stat().st_size for p in files)
    for p in files:
        if total <= budget_bytes:
            break
        if keep is not None and p == keep:
            continue
        total -= p.stat().st_size
        p.unlink(missing_ok=True)
        removed.append(p)
    return removed
