"""`python -m engine doctor`: the GPU, its driver and CUDA libraries, which backend the engine gets,
and the exact command that fixes a wrong piece.

`gather()` reads the machine (nvidia-smi through `gpu_select`, the installed CuPy builds, what CuPy
loaded); `report()` turns those facts into lines, so every verdict is testable with made-up facts.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from .gpu_select import CUPY, OTHER_CUPY, Choice, Gpu, Version, choose, nvrtc_needed, read_smi
from .memory import is_unified
from .plan import GIB, UNIFIED_RESERVE

REPO = Path(__file__).resolve().parent.parent
CUPY_MAJOR = {name: major for major, name in CUPY.items()}


@dataclass
class Facts:
    gpu: Gpu | None
    choice: Choice  # what `make venv` installs for this driver
    cupy_builds: dict[str, str] = field(default_factory=dict)  # installed CuPy distributions -> versions
    cupy_error: str = ""  # why CuPy does not work ("" = it imports and sees a device)
    runtime: Version | None = None  # the CUDA runtime CuPy runs on
    nvrtc: Version | None = None  # the NVRTC CuPy loaded
    nvrtc_path: str = ""
    cc: Version | None = None  # compute capability as CuPy sees the device
    unified: bool = False


def _v(v: Version | None) -> str:
    return f"{v[0]}.{v[1]}" if v else "?"


def pip_install(extra: str) -> str:
    return f'{sys.executable} -m pip install -e "{REPO}[{extra}]"'


def pip_uninstall(names: list[str]) -> str:
    return f"{sys.executable} -m pip uninstall -y {' '.join(names)}"


def report(f: Facts) -> list[str]:
    """Lines for people; a wrong piece gets a `fix:` line with the command that mends it."""
    if f.gpu is None or not f.choice.cupy:
        lines = [f"no usable GPU: {f.choice.why}"]
        if f.cupy_builds:
            lines.append(f"fix: {pip_uninstall(sorted(f.cupy_builds))}  (CuPy has no GPU to use here)")
        return lines
    g, want = f.gpu, f.choice
    lines = [f"GPU {g.name}, compute capability {_v(g.cc)} ({g.arch}), driver {g.driver} (runs CUDA up to "
             f"{_v(g.cuda)})",
             f"make venv installs {want.cupy} {want.libs} (extra {want.extra})"]
    others = sorted(n for n in f.cupy_builds if n != want.cupy)
    if others:
        lines.append(f"CuPy builds installed: {', '.join(f'{n} {f.cupy_builds[n]}' for n in sorted(f.cupy_builds))}")
        lines.append(f"fix: {pip_uninstall(others)} && {pip_install(want.extra)}  (this driver needs {want.cupy}, "
                     f"and one CuPy build per environment)")
        return lines
    if want.cupy not in f.cupy_builds:
        lines.append("CuPy: not installed; the engine runs on the CPU")
        lines.append(f"fix: {pip_install(want.extra)}")
        return lines
    major = CUPY_MAJOR[want.cupy]
    toolkit = f"cuda{major}-toolkit"
    if f.cupy_error:
        lines.append(f"CuPy {want.cupy} {f.cupy_builds[want.cupy]} does not work: {f.cupy_error}")
        lines.append(f"fix: {pip_install(toolkit)}  (the CUDA {major} libraries CuPy loads, from pip)")
        return lines
    cc = f.cc or g.cc
    lines.append(f"CuPy {want.cupy} {f.cupy_builds[want.cupy]}, CUDA runtime {_v(f.runtime)}, NVRTC {_v(f.nvrtc)}"
                 + (f" ({f.nvrtc_path})" if f.nvrtc_path else ""))
    need = nvrtc_needed(cc, major)
    if f.nvrtc is None or f.nvrtc < need:
        lines.append(f"NVRTC {_v(f.nvrtc)} cannot compile for {g.arch} (it needs {_v(need)}): the kernels would not "
                     f"build and the engine would run on the CPU")
        lines.append(f"fix: {pip_install(toolkit)}  (NVRTC {major} from pip; CuPy prefers it to the system's)")
        return lines
    if f.unified:
        lines.append(f"memory: unified with the system; the KV budget comes from MemAvailable and leaves "
                     f"{UNIFIED_RESERVE / GIB:.0f} GiB to the desktop")
    lines.append(f"backend: cupy on {g.name}")
    return lines



def installed_cupy() -> dict[str, str]:
    found = {}
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "").lower().replace("_", "-")
        if name in OTHER_CUPY:
            found[name] = d.version
    return found


def gather(smi: str = "nvidia-smi") -> Facts:
    """The facts of this machine (imports CuPy, when it is installed, to see what it loaded)."""
    gpu, why = read_smi(smi)
    f = Facts(gpu, choose(gpu, why), installed_cupy())
    if gpu is None or not f.cupy_builds:
        return f
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("CuPy sees no CUDA device")
        v = cupy.cuda.runtime.runtimeGetVersion()
        f.runtime = (v // 1000, v % 1000 // 10)
        dev = cupy.cuda.Device()
        cc = int(dev.compute_capability)
        f.cc, f.unified = (cc // 10, cc % 10), is_unified(dev.attributes)
        f.nvrtc = tuple(cupy.cuda.nvrtc.getVersion())
    except Exception as e:  # a missing CUDA library raises at import or at first use, in many types
        f.cupy_error = f"{type(e).__name__}: {e}".splitlines()[0]
        return f
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # CuPy's own library finder
        f.nvrtc_path = load_nvidia_dynamic_lib("nvrtc").abs_path
    except Exception:  # an older CuPy without cuda-pathfinder: the version alone is still right
        pass
    return f
