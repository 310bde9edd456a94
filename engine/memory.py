"""Free memory the KV budget may take: the system's MemAvailable, or the device's on a discrete GPU.

On a GPU that shares the host's memory (the GB10: "unified memory") cudaMemGetInfo leaves out the
reclaimable page cache, so the system's number is the true one there too.
"""
from __future__ import annotations

import os
from collections.abc import Mapping


def system_free_bytes(meminfo: str = "/proc/meminfo") -> int:
    try:
        with open(meminfo) as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemAvailable"]
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def is_unified(attributes: Mapping[str, int]) -> bool:
    """Whether a CUDA device shares the host's memory, from CuPy's `Device.attributes` (the GB10, like
    any integrated GPU, says Integrated = 1)."""
    return bool(attributes.get("Integrated", 0))


def gpu_free_bytes(unified: bool, device_free: int, pool_free: int, meminfo: str = "/proc/meminfo") -> int:
    """Free bytes on a GPU: `device_free` from cudaMemGetInfo, or MemAvailable on unified memory;
    plus what CuPy's pool holds unused."""
    return (system_free_bytes(meminfo) if unified else device_free) + pool_free


IDLE_UNLOAD_MINUTES = 15  # the app's "unload after N minutes idle", where it is on by default


def unload_when_idle(unified: bool) -> bool:
    """Whether an idle model is unloaded by default: yes where its memory is the desktop's (unified
    memory, or the CPU backend's RAM), which other programs then get back; no on a discrete GPU,
    whose memory nothing else wants and where a reload costs the most."""
    return unified
