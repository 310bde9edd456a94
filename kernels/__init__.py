"""CUDA C++ sources of the GPU backend and the thin CuPy loaders that compile and launch them.

Each `*.cu` file is one op family (gemv, attention, elementwise; DeltaNet and MoE get files of their
own). `function(file, name)` compiles a file through NVRTC (`cupy.RawModule`) for the running device
(sm_90 on the H200, sm_121 on a GB10) and returns one kernel; template kernels are named with their
arguments, e.g. `qgemv<4, 2, 2, 1, 8>`. Local `#include "x.cuh"` lines are inlined first, so CuPy's
compile cache (keyed on the source text) sees every header's text too. Launchers live in
`kernels.launch`.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np

from . import pdl, trace

HERE = Path(__file__).resolve().parent
_INCLUDE = re.compile(r'^[ \t]*#include[ \t]+"([^"]+)"[ \t]*$', re.M)
_ONCE = re.compile(r"^[ \t]*#pragma[ \t]+once[ \t]*$", re.M)

# -std=c++17 for if-constexpr-free templates with constexpr locals; no fast math: several kernels
# must round exactly like numpy (see common.cuh).
OPTIONS = ("-std=c++17",)


def source(name: str) -> str:
    """The text of `name` with its local headers inlined once each."""
    seen: set[str] = set()

    def expand(text: str) -> str:
        def sub(m: re.Match) -> str:
            inc = m.group(1)
            if inc in seen:
                return ""
            seen.add(inc)
            return expand(_ONCE.sub("", (HERE / inc).read_text()))
        return _INCLUDE.sub(sub, text)

    return expand((HERE / name).read_text())


def file_options(file: str) -> tuple[str, ...]:
    """The NVRTC options of one file beyond OPTIONS: the -D values of constants its launchers own."""
    from . import launch  # it imports this module
    return launch.FILE_OPTIONS.get(file, ())


@lru_cache(maxsize=None)
def _module(file: str, expr: str | None):
    import cupy
    kw = {"name_expressions": (expr,)} if expr else {}
    traced = (trace.DEFINE,) if trace.active() else ()
    module = cupy.RawModule(code=source(file), options=OPTIONS + file_options(file) + traced, **kw)
    if traced:
        trace.attach(module)
    return module


class KernelTimes:
    """Every kernel launched while it is active (`with timing() as t:`), bracketed by CUDA events on
    the launching stream; `rows(a, b)` gives launches a..b as (name, grid, microseconds)."""

    def __init__(self) -> None:
        self.launches: list[tuple[str, tuple, object, object]] = []

    def mark(self) -> int:
        return len(self.launches)

    def backlog(self, ms: float = 100.0) -> None:
        """Keep the device busy for `ms` first, so the launches after it queue up and each event pair
        times its kernel alone, not the host's time to launch it."""
        function("timing.cu", "spin").kernel((1,), (1,), (np.int64(ms * 1e6),))  # not one of the timed

    def rows(self, start: int = 0, end: int | None = None) -> list[tuple[str, tuple, float]]:
        import cupy
        picked = self.launches[start:end]
        if picked:
            picked[-1][3].synchronize()
        return [(name, grid, 1e3 * cupy.cuda.get_elapsed_time(e0, e1)) for name, grid, e0, e1 in picked]


_timer: KernelTimes | None = None


@contextmanager
def timing():
    """Time every launch inside the block (not graph replays: graphs launch no kernels one by one)."""
    global _timer
    outer, _timer = _timer, KernelTimes()
    try:
        yield _timer
    finally:
        _timer = outer


_doubled: re.Pattern | None = None


def double_launches(pattern: str | None) -> None:
    """Launch every captured kernel whose name matches `pattern` (a regular expression) twice, or each
    once again (None): the bench's measure of a kernel class's cost on a decode graph's critical path
    (`bench --double`). Only for kernels whose second run repeats the first (not the DeltaNet's
    conv and scan, which step their states)."""
    global _doubled
    _doubled = re.compile(pattern) if pattern else None


class _Kernel:
    """One compiled kernel. Under `timing()` each launch is bracketed by events; with
    LANECHAT_KERNEL_SYNC=1 (debug) it synchronises after each launch and names itself in the error;
    neither while its stream is being captured into a graph, where launches are programmatic."""

    def __init__(self, kernel, name: str, checked: bool):
        self.kernel, self.name, self.checked = kernel, name, checked
        self._smem = 48 * 1024  # dynamic shared bytes a launch may take without an opt-in

    def allow_smem(self, n: int) -> None:
        """Let launches take n dynamic shared bytes (an opt-in above 48 KB): the driver is asked once
        per larger size, not on every launch."""
        if n > self._smem:
            if self.kernel.max_dynamic_shared_size_bytes < n:
                self.kernel.max_dynamic_shared_size_bytes = n
            self._smem = n

    def __call__(self, grid, block, args, **kw):
        import cupy
        s = cupy.cuda.get_current_stream()
        if s.ptr and s.is_capturing():
            return self._captured(grid, block, args, s, **kw)
        if _timer is None and not self.checked:
            return self.kernel(grid, block, args, **kw)
        timer = _timer
        if timer is not None:
            e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
            e0.record(s)
        self.kernel(grid, block, args, **kw)
        if timer is not None:
            e1.record(s)
            timer.launches.append((self.name, tuple(grid), e0, e1))
        if self.checked:
            try:
                s.synchronize()
            except Exception as e:
                raise RuntimeError(f"kernel {self.name} grid={grid} block={block}: {e}") from e

    def _captured(self, grid, block, args, s, shared_mem: int = 0) -> None:
        """A launch into a graph: programmatic (kernels.pdl) where the driver has it; twice where
        `double_launches` names this kernel."""
        for _ in range(2 if _doubled is not None and _doubled.search(self.name) else 1):
            trace.captured(self.name, grid)
            if pdl.enabled():
                pdl.launch(self.kernel.kernel.ptr, grid, block, args, shared_mem, s.ptr)
            else:
                self.kernel(grid, block, args, shared_mem=shared_mem)


@lru_cache(maxsize=None)
def function(file: str, name: str):
    """One compiled kernel of `file` (compiled on first use, then cached in memory and on disk)."""
    templ = "<" in name
    kernel = _module(file, name if templ else None).get_function(name)
    return _Kernel(kernel, name, os.environ.get("LANECHAT_KERNEL_SYNC") == "1")


def sources() -> list[str]:
    return sorted(p.name for p in HERE.glob("*.cu"))


def variants() -> list[tuple[str, str]]:
    """Every (file, name) pair the launchers may pass to `function`, built from their own tables: CI
    compiles each for sm_90 and sm_121 (tests/test_kernels_compile.py)."""
    from . import launch, launch_qwen3_5  # they import this module
    return launch.variants() + launch_qwen3_5.variants()
