"""Snapshot restores on the GPU (`kv.snapshots.Landing`): the file is read into page-locked
staging buffers, and each one goes to its device array by one asynchronous copy on the backend's
stream while the next is read. The staging is a few fixed buffers, made once and reused by every
restore, so a snapshot of any size needs no page-locked copy of itself.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..kv.snapshots import GRAIN
from .cupy_import import cupy, cupyx

if TYPE_CHECKING:
    from .cupy_backend import CupyBackend

CHUNK = 64 << 20
SLOTS = 2  # one buffer copies to the device while the file is read into the other


class DeviceLanding:
    chunk_bytes = CHUNK
    grain_bytes = GRAIN

    def __init__(self, backend: CupyBackend):
        self._b = backend
        self._host = [cupyx.empty_pinned((CHUNK,), np.uint8) for _ in range(SLOTS)]
        self._copied = [cupy.cuda.Event(disable_timing=True) for _ in range(SLOTS)]
        self._slot = 0

    def empty(self, shape: tuple[int, ...], dtype: np.dtype):
        self._b.make_current()
        return cupy.empty(shape, dtype)

    def chunk(self, dest, offset: int, nbytes: int) -> memoryview:
        self._copied[self._slot].synchronize()  # its last copy has left the buffer
        return memoryview(self._host[self._slot])[:nbytes]

    def land(self, dest, offset: int, buf: memoryview) -> None:
        i, stream = self._slot, self._b.stream
        cupy.cuda.runtime.memcpyAsync(dest.data.ptr + offset, self._host[i].ctypes.data, buf.nbytes,
                                      cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
        stream.record(self._copied[i])
        self._slot = (i + 1) % SLOTS

    def finish(self) -> None:
        self._b.stream.synchronize()
