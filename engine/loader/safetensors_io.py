"""Safetensors read without trusting the file: every header entry is checked against the file before use.

A file is 8 bytes of little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the data. Tensors come back as read-only numpy views of one memory map (no copy).
"""
from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

import numpy as np

from .. import jsonfile
from ..config import read_json, shown
from ..errors import ModelError
from ..safetensors_dtypes import DTYPES

FLOATS = ("F64", "F32", "F16", "BF16")
MAX_HEADER = 100 * 1024 * 1024  # the format's own limit; a larger length means a corrupt file
MAX_DIMS = 8  # no weight has more; numpy itself stops at 64


class SafetensorsFile:
    """One .safetensors file: validated header, tensors as views of a shared read-only map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                size = self.path.stat().st_size
                if size < 8:
                    raise ModelError(f"{self.path}: truncated safetensors file ({size} bytes)")
                (hlen,) = struct.unpack("<Q", f.read(8))
                if hlen > MAX_HEADER or 8 + hlen > size:
                    raise ModelError(f"{self.path}: header length {hlen} does not fit in the file ({size} bytes)")
                raw = f.read(hlen)
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise ModelError(f"{self.path}: no such file") from None
        except OSError as e:
            raise ModelError(f"{self.path}: cannot read ({e.strerror or e})") from None
        try:
            header = jsonfile.loads(raw, max_bytes=MAX_HEADER)
        except ValueError as e:
            raise ModelError(f"{self.path}: header is not valid JSON ({e})") from None
        if not isinstance(header, dict):
            raise ModelError(f"{self.path}: header is not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        if not isinstance(self.metadata, dict):
            raise ModelError(f"{self.path}: header __metadata__ is not an object")
        self._start = 8 + hlen
        self._data_size = size - self._start
        self.entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, info in header.items():
            self.entries[name] = self._check(name, info)

    def _check(self, name: str, info: object) -> tuple[str, tuple[int, ...], int, int]:
        where = f"{self.path}: tensor {name}"
        if not isinstance(info, dict):
            raise ModelError(f"{where}: header entry is not an object")
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise ModelError(f"{where}: unknown dtype {shown(dtype)}")
        if (not isinstance(shape, list) or len(shape) > MAX_DIMS
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise ModelError(f"{where}: bad shape {shown(shape)}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise ModelError(f"{where}: bad data_offsets {shown(offsets)}")
        begin, end = offsets
        if end > self._data_size:
            raise ModelError(f"{where}: data ends at byte {end} but the file has only {self._data_size} "
                             f"data bytes (truncated or lying header)")
        need = math.prod(shape) * DTYPES[dtype].itemsize
        if end - begin != need:
            raise ModelError(f"{where}: shape {shape} of {dtype} needs {need} bytes but the header gives "
                             f"{end - begin}")
        return dtype, tuple(shape), begin, end

    def dtype(self, name: str) -> str:
        return self.entries[name][0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def raw(self, name: str) -> np.ndarray:
        """The stored array in its own dtype, as a read-only view of the map."""
        dtype, shape, begin, end = self.entries[name]
        if end == begin:
            return np.zeros(shape, DTYPES[dtype])
        arr = np.frombuffer(self._map, dtype=DTYPES[dtype], count=math.prod(shape), offset=self._start + begin)
        return arr.reshape(shape)


class Checkpoint:
    """All tensors of a folder: one model.safetensors, or shards listed by model.safetensors.index.json."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        index = folder / "model.safetensors.index.json"
        self.where: dict[str, SafetensorsFile] = {}
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ModelError(f"{index}: not a shard index (no weight_map object)")
            for name, file in weight_map.items():
                # a shard is a file of this folder: never a path that leads out of it
                if not isinstance(file, str) or Path(file).name != file or not file.endswith(".safetensors"):
                    raise ModelError(f"{index}: weight_map entry {shown(name)} names {shown(file)}, "
                                     f"not a .safetensors file of this folder")
            shards = {f: SafetensorsFile(folder / f) for f in sorted(set(weight_map.values()))}
            for name, file in weight_map.items():
                if name not in shards[file].entries:
                    raise ModelError(f"{folder / file}: tensor {name} is listed in the index but missing")
                self.where[name] = shards[file]
        else:
            files = sorted(folder.glob("*.safetensors"))
            if not files:
                raise ModelError(f"{folder}: no .safetensors files")
            for path in files:
                st = SafetensorsFile(path)
                for name in st.entries:
                    self.where[name] = st

    @property
    def names(self) -> list[str]:
        return list(self.where)

    def file(self, name: str) -> Path:
        return self.where[name].path

    def shape(self, name: str) -> tuple[int, ...]:
        return self.where[name].shape(name)

    def dtype(self, name: str) -> str:
        return self.where[name].dtype(name)

    def raw(self, name: str) -> np.ndarray:
        return self.where[name].raw(name)

    def float32(self, name: str) -> np.ndarray:
        """A dense float weight as float32: bf16/f16 widened, f32 left as a view of the map."""
        dtype = self.dtype(name)
        if dtype not in FLOATS:
            raise ModelError(f"{self.file(name)}: tensor {name} has dtype {dtype}, expected a float type")
        return np.asarray(self.raw(name), dtype=np.float32)
