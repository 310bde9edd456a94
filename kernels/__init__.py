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
from functools import lru_cache
from pathlib import Path

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
    return cupy.RawModule(code=source(file), options=OPTIONS + file_options(file), **kw)


class _Checked:
    """A kernel that synchronises after each launch and names itself in the error (debug mode:
    LANECHAT_KERNEL_SYNC=1), except while its stream is being captured into a graph."""

    def __init__(self, kernel, name: str):
        self.kernel, self.name = kernel, name

    def __call__(self, grid, block, args, **kw):
        import cupy
        self.kernel(grid, block, args, **kw)
        s = cupy.cuda.get_current_stream()
        if s.ptr and s.is_capturing():
            return
        try:
            s.synchronize()
        except Exception as e:
            raise RuntimeError(f"kernel {self.name} grid={grid} block={block}: {e}") from e


@lru_cache(maxsize=None)
def function(file: str, name: str):
    """One compiled kernel of `file` (compiled on first use, then cached in memory and on disk)."""
    templ = "<" in name
    kernel = _module(file, name if templ else None).get_function(name)
    return _Checked(kernel, name) if os.environ.get("LANECHAT_KERNEL_SYNC") == "1" else kernel


def sources() -> list[str]:
    return sorted(p.name for p in HERE.glob("*.cu"))


def variants() -> list[tuple[str, str]]:
    """Every (file, name) pair the launchers may pass to `function`, built from their own tables: CI
    compiles each for sm_90 and sm_121 (tests/test_kernels_compile.py)."""
    from . import launch, launch_qwen3_5  # they import this module
    return launch.variants() + launch_qwen3_5.variants()
