"""Programmatic dependent launch: a graph's kernel becomes resident while the one ahead of it still
runs, so the launch and the block dispatch between two decode kernels overlap the first one's tail.
CuPy's launch takes no launch attributes, so these launches go through the driver's cuLaunchKernelEx.
The kernels keep their order: each runs PDL_ENTRY (common.cuh), which waits for the previous
kernel's writes, before it reads any of them or writes anything; only reads of what that kernel does
not write (weights, tables, older keys, states) may come first.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: a 4-byte id, then a 64-byte value union at offset 8."""
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("value", ctypes.c_int32 * 16)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("smem", ctypes.c_uint32),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(LaunchAttribute)),
                ("nattrs", ctypes.c_uint32)]


_enabled = True


def use_pdl(on: bool) -> bool:
    """Turn programmatic launches in captured graphs on or off (the bench's A/B); returns the old value."""
    global _enabled
    old, _enabled = _enabled, bool(on)
    return old


def enabled() -> bool:
    """Whether graph captures launch programmatically: switched on and the driver has the call."""
    return _enabled and _launcher() is not None


@lru_cache(maxsize=1)
def _launcher():
    """cuLaunchKernelEx of the driver, or None where the driver lacks it (before CUDA 12)."""
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    return fn


_SCALARS = {np.int32: ctypes.c_int32, np.uint32: ctypes.c_uint32, np.int64: ctypes.c_int64,
            np.uint64: ctypes.c_uint64, np.float32: ctypes.c_float, np.float64: ctypes.c_double}


def param(a) -> ctypes._SimpleCData:
    """One kernel argument as the bytes the kernel reads: a device array's address, a numpy scalar's
    value (the launchers pass fixed-width numpy scalars only)."""
    ct = _SCALARS.get(type(a))
    if ct is not None:
        return ct(a)
    ptr = getattr(getattr(a, "data", None), "ptr", None)
    if ptr is None:
        raise TypeError(f"kernel argument of type {type(a).__name__}: pass a device array or a numpy scalar")
    return ctypes.c_uint64(ptr)


def config(grid, block, smem: int, stream: int, attr: LaunchAttribute) -> LaunchConfig:
    g, b = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
    return LaunchConfig((ctypes.c_uint32 * 3)(*g), (ctypes.c_uint32 * 3)(*b), smem, stream,
                        ctypes.pointer(attr), 1)


_ATTR = LaunchAttribute(PROGRAMMATIC_STREAM_SERIALIZATION, 0)
_ATTR.value[0] = 1  # programmaticStreamSerializationAllowed


def launch(function_ptr: int, grid, block, args, smem: int, stream: int) -> None:
    """Launch one kernel on `stream` with programmatic stream serialization."""
    held = [param(a) for a in args]  # alive until the driver has copied them
    ptrs = (ctypes.c_void_p * max(1, len(held)))(*map(ctypes.addressof, held))
    cfg = config(grid, block, smem, stream, _ATTR)
    rc = _launcher()(ctypes.byref(cfg), ctypes.c_void_p(function_ptr), ptrs, None)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed (CUresult {rc})")
