"""Every kernel compiles for sm_90 (H200) and sm_121 (GB10) with NVRTC 12.9 and 13.0, without a GPU
(qmv's instantiations as a cover of its parameters: `covered`).

NVRTC comes from the pip wheels of the test extra, loaded through ctypes; the sources, options and
template instantiations are the backend's own (`kernels.source`, `kernels.OPTIONS` and
`kernels.file_options` plus what `cupy.RawModule` adds, `kernels.variants()`). One program per file
holds all of that file's instantiations; when it fails, each is compiled alone so the message names
the kernel.
"""
import ctypes
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import kernels

from nvrtc_wheels import WHEELS, library

ARCHS = ("sm_90", "sm_121")
# What cupy.RawModule appends to the caller's options before NVRTC sees them (CuPy 14,
# cupy/cuda/compiler.py): flush-to-zero, device code by default, and -arch=sm_XX for a cubin.
CUPY_OPTIONS = ("-ftz=true", "--device-as-default-execution-space")
PER_PROGRAM = 6  # template instantiations compiled in one NVRTC program
_GLOBAL = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")


class Nvrtc:
    """The few NVRTC calls a compile check needs."""

    def __init__(self, path: Path):
        # NVRTC opens its builtins library by name; one already loaded from the wheel satisfies that.
        for builtins in sorted(path.parent.glob("libnvrtc-builtins.so.*")):
            ctypes.CDLL(str(builtins))
        self.lib = ctypes.CDLL(str(path))
        major, minor = ctypes.c_int(), ctypes.c_int()
        assert self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0
        self.version = (major.value, minor.value)

    def compile(self, code: str, name: str, options: list[str], exprs: list[str]) -> tuple[bool, str, bytes]:
        """(compiled, log, cubin) of one program with these name expressions."""
        lib, prog = self.lib, ctypes.c_void_p()
        assert lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), name.encode(), 0, None, None) == 0
        try:
            for e in exprs:
                assert lib.nvrtcAddNameExpression(prog, e.encode()) == 0
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            ok = lib.nvrtcCompileProgram(prog, len(options), opts) == 0
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            cubin = b""
            if ok:
                lowered = ctypes.c_char_p()
                for e in exprs:  # each expression must name a kernel the program instantiated
                    ok = ok and lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(lowered)) == 0
                lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
                buf = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetCUBIN(prog, buf)
                cubin = buf.raw
            return ok, log.value.decode(errors="replace"), cubin
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


def nvrtc(version: str) -> Nvrtc:
    return Nvrtc(library(version))


def by_file() -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for file, name in kernels.variants():
        files.setdefault(file, []).append(name)
    return files


_QMV = re.compile(r"qmv<(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+)>")


def covered(names: list[str]) -> list[str]:
    """qmv's instantiations cut to a cover: every (bits, group, n-tiles, experts) class, whose
    tile sizes and shared arrays these fix, with each input mode and each scale type at least once
    (a Latin square: they only choose code paths, never resources) and its 3-an-SM build; the
    other kernels all. About a third of qmv's cartesian product, which was half of CI's time."""
    keep, seen = [], set()
    for n in names:
        m = _QMV.fullmatch(n)
        if m is None:
            keep.append(n)
            continue
        bits, sub, nt, xm, st, ex, minb = map(int, m.groups())
        if minb != 2:
            pick = ("blocks an SM", minb)
        elif st == xm or (xm, st) in ((0, 2), (3, 0)):  # XM 3 (a staged combination) with fp16 scales
            pick = ("input mode, scale type", xm, st)
        else:
            continue
        if ((bits, sub, nt, ex), pick) not in seen:
            seen.add(((bits, sub, nt, ex), pick))
            keep.append(n)
    return keep


def programs() -> list[tuple[str, list[str]]]:
    """(file, names) per program: a file's instantiations (qmv's `covered`) in groups of a few, so
    the compiles spread over the cores."""
    out = []
    for file, names in by_file().items():
        names = covered(names)
        plain, templates = [n for n in names if "<" not in n], [n for n in names if "<" in n]
        out.append((file, plain + templates[:PER_PROGRAM]))
        out += [(file, templates[i:i + PER_PROGRAM]) for i in range(PER_PROGRAM, len(templates), PER_PROGRAM)]
    return out


def check(compiler: Nvrtc, arch: str, file: str, names: list[str]) -> list[str]:
    """Failures, each naming its kernel, for one program of `file` compiled as the backend does."""
    options = [*kernels.OPTIONS, *kernels.file_options(file), *CUPY_OPTIONS, f"-arch={arch}"]
    code = kernels.source(file)
    templates = [n for n in names if "<" in n]
    where = f"for {arch} with NVRTC {compiler.version[0]}.{compiler.version[1]}"
    ok, log, cubin = compiler.compile(code, file, options, templates)
    if not ok:
        bad = [n for n in templates if not compiler.compile(code, file, options, [n])[0]] or [file]
        return [f"{n} ({file}) does not compile {where}:\n{log.strip()}" for n in bad]
    # extern "C" kernels keep their names in the cubin's symbol table.
    return [f"{n} ({file}) is not in the cubin {where}" for n in names
            if "<" not in n and b"\0" + n.encode() + b"\0" not in cubin]


@pytest.mark.parametrize("version", sorted(WHEELS))
@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles(version, arch):
    compiler = nvrtc(version)
    assert f"{compiler.version[0]}.{compiler.version[1]}" == version
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failures = sum(pool.map(lambda p: check(compiler, arch, *p), programs()), [])
    assert not failures, "\n\n".join(failures)


def test_variants_cover_every_kernel_and_file():
    """A kernel without a launcher entry, or an entry naming no kernel, fails here by name."""
    files = by_file()
    assert sorted(files) == kernels.sources()
    for file, names in files.items():
        defined = set(_GLOBAL.findall(kernels.source(file)))
        listed = {n.split("<")[0] for n in names}
        assert listed - defined == set(), f"{file}: launchers name kernels it does not define"
        assert defined - listed == set(), f"{file}: kernels.variants() misses these kernels"
        assert len(names) == len(set(names)), f"{file}: a variant is listed twice"


def test_the_cover_has_every_parameter_value_of_every_qmv_class():
    """Each (bits, group, n-tiles, experts) class keeps every input mode, scale type and blocks-an-SM
    value that its full product has, so a value that breaks a compile still fails here."""
    def values(names):
        out: dict[tuple, list[set]] = {}
        for n in names:
            m = _QMV.fullmatch(n)
            if m:
                bits, sub, nt, xm, st, ex, minb = map(int, m.groups())
                v = out.setdefault((bits, sub, nt, ex), [set(), set(), set()])
                v[0].add(xm), v[1].add(st), v[2].add(minb)
        return out
    gemv = by_file()["gemv.cu"]
    full, kept = values(gemv), values(covered(gemv))
    assert full and kept == full
    assert len(covered(gemv)) < len(gemv) / 2


def test_a_broken_kernel_is_named():
    compiler = nvrtc("12.9")
    code = "template <int N> __global__ void k(int* x) { x[0] = N / (N - N) + undefined_name; }\n" \
           'extern "C" __global__ void fine(int* x) { x[0] = 1; }\n'
    opts = [*kernels.OPTIONS, *CUPY_OPTIONS, "-arch=sm_121"]
    ok, log, _ = compiler.compile(code, "broken.cu", opts, ["k<1>"])
    assert not ok and "undefined_name" in log
    ok, _, cubin = compiler.compile(code, "fine.cu", opts, [])
    assert ok and b"\0fine\0" in cubin


@pytest.mark.parametrize("arch", ARCHS)
def test_the_trace_stamp_compiles(arch):
    """bench --trace builds every kernel with the stamp (kernels/trace.py); the host finds its buffer
    pointer by name."""
    from kernels import trace
    compiler = nvrtc(sorted(WHEELS)[-1])
    file = "elementwise.cu"
    opts = [*kernels.OPTIONS, *kernels.file_options(file), *CUPY_OPTIONS, trace.DEFINE, f"-arch={arch}"]
    ok, log, cubin = compiler.compile(kernels.source(file), file, opts, [])
    assert ok, log
    assert b"\0lc_trace\0" in cubin
