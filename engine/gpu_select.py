"""Which CuPy this machine needs: the pip extra for its NVIDIA driver, read from `nvidia-smi`.

The Makefile runs this file with the system python before the venv exists (`python3 -I`, so the
folder's modules shadow nothing), so it uses the standard library only and imports nothing of the
engine. The driver's CUDA major picks the CuPy build
(`cupy-cuda13x` for 13 and newer, `cupy-cuda12x` for 12); the CUDA libraries come from pip as well
(the `-toolkit` extras) where the system's NVRTC of that major is missing or too old for the GPU.

    python3 -I engine/gpu_select.py            # the extra: cuda13, cuda13-toolkit, cuda12, ... or nothing
    python3 -I engine/gpu_select.py --explain  # one line saying why
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

Version = Tuple[int, int]
CUPY = {12: "cupy-cuda12x", 13: "cupy-cuda13x"}  # CUDA major -> the CuPy wheel built for it
# The first NVRTC that compiles for an architecture (CUDA release notes); sm_121 is the GB10.
NVRTC_FOR_ARCH = {(12, 1): (12, 9), (12, 0): (12, 8), (11, 0): (13, 0), (10, 3): (12, 9), (10, 0): (12, 8)}
OTHER_CUPY = ("cupy", "cupy-cuda11x", "cupy-cuda12x", "cupy-cuda13x")  # one of these at most per venv


@dataclass(frozen=True)
class Gpu:
    """What `nvidia-smi` says about the first GPU and its driver."""
    name: str
    driver: str  # "580.95.05"
    cuda: Optional[Version]  # the newest CUDA the driver runs ("CUDA Version" in nvidia-smi's header)
    cc: Optional[Version]  # compute capability; drivers before R510 do not report it

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}" if self.cc else "an unknown architecture"


@dataclass(frozen=True)
class Choice:
    extra: str  # the pyproject extra to install ("" = none: the engine runs on the CPU)
    cupy: str  # the CuPy distribution that extra brings ("" = none)
    why: str  # one line for people
    libs: str = ""  # where CuPy's CUDA libraries come from ("with the system's NVRTC 13.0")


def parse_header(text: str) -> tuple[str, Optional[Version]]:
    """(driver version, CUDA version) from nvidia-smi's table header."""
    driver = re.search(r"Driver Version:\s*([0-9.]+)", text)
    cuda = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", text)
    return (driver.group(1) if driver else "", (int(cuda.group(1)), int(cuda.group(2))) if cuda else None)


def parse_query(text: str) -> tuple[str, Optional[Version]]:
    """(name, compute capability) from the first line of `--query-gpu=name,compute_cap --format=csv,noheader`."""
    fields = [f.strip() for f in text.strip().splitlines()[0].split(",")] if text.strip() else []
    name = fields[0] if fields else ""
    cc = re.fullmatch(r"(\d+)\.(\d+)", fields[1]) if len(fields) > 1 else None
    return name, ((int(cc.group(1)), int(cc.group(2))) if cc else None)


def _run(cmd: list[str]) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return 127, ""
    except (OSError, subprocess.TimeoutExpired) as e:
        return 1, str(e)
    return p.returncode, p.stdout + p.stderr


def read_smi(smi: str = "nvidia-smi") -> tuple[Optional[Gpu], str]:
    """The GPU, or None and the reason there is none usable."""
    rc, header = _run([smi])
    if rc == 127:
        return None, "no NVIDIA driver (nvidia-smi not found)"
    if rc != 0:
        first = next((line.strip() for line in header.splitlines() if line.strip()), f"exit code {rc}")
        return None, f"nvidia-smi failed: {first}"
    driver, cuda = parse_header(header)
    rc, query = _run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    if rc != 0:  # drivers before R510 know no compute_cap field
        rc, query = _run([smi, "--query-gpu=name", "--format=csv,noheader"])
    name, cc = parse_query(query) if rc == 0 else ("", None)
    return Gpu(name or "NVIDIA GPU", driver, cuda, cc), ""


def nvrtc_needed(cc: Optional[Version], major: int) -> Version:
    """The oldest NVRTC of `major` that compiles for compute capability `cc`."""
    arch = NVRTC_FOR_ARCH.get(cc, (0, 0)) if cc else (0, 0)
    if cc and cc > max(NVRTC_FOR_ARCH):  # newer than this table: ask for the newest major's first release
        arch = (max(CUPY), 0)
    return max(arch, (major, 0))


def system_nvrtc(major: int) -> Optional[Version]:
    """The version of the system's NVRTC of `major`, found where CuPy looks outside the venv: the
    dynamic loader's paths, then $CUDA_HOME / $CUDA_PATH; None when there is none."""
    names = [f"libnvrtc.so.{major}"]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            names += [os.path.join(os.environ[var], d, f"libnvrtc.so.{major}") for d in ("lib64", "lib")]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        hi, lo = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(hi), ctypes.byref(lo)) == 0:
            return hi.value, lo.value
    return None


def choose(gpu: Optional[Gpu], reason: str = "",
           nvrtc: Callable[[int], Optional[Version]] = system_nvrtc) -> Choice:
    """The extra for this GPU; `nvrtc(major)` gives the system NVRTC of a CUDA major (or None)."""
    if gpu is None:
        return Choice("", "", f"{reason}: the engine runs on the CPU")
    if gpu.cuda is None or gpu.cuda[0] < min(CUPY):
        runs = f"CUDA {gpu.cuda[0]}.{gpu.cuda[1]}" if gpu.cuda else "no CUDA version it reports"
        return Choice("", "", f"{gpu.name}: driver {gpu.driver or '(unknown)'} runs {runs}; Lanechat's CuPy needs "
                              f"a driver for CUDA 12 or newer (R525+; a GB10 ships with R580): update the NVIDIA "
                              f"driver; until then the engine runs on the CPU")
    major = min(gpu.cuda[0], max(CUPY))  # a newer driver runs the newest CUDA we have wheels for
    cupy = CUPY[major]
    head = f"{gpu.name} ({gpu.arch}), driver {gpu.driver} for CUDA {gpu.cuda[0]}.{gpu.cuda[1]}: {cupy}"
    need = nvrtc_needed(gpu.cc, major)
    have = nvrtc(major)
    if have is not None and have >= need:
        libs = f"with the system's NVRTC {have[0]}.{have[1]}"
        return Choice(f"cuda{major}", cupy, f"{head}, {libs}", libs)
    if have is None:
        short = f"the system has no NVRTC {major}"
    else:
        short = f"the system's NVRTC {have[0]}.{have[1]} is older than the {need[0]}.{need[1]} {gpu.arch} needs"
    libs = f"with CUDA {major} libraries from pip ({short})"
    return Choice(f"cuda{major}-toolkit", cupy, f"{head}, {libs}", libs)


def stale(extra: str, installed: Optional[list[str]] = None) -> list[str]:
    """CuPy distributions in this environment that `extra` does not want (two CuPy builds in one
    venv break `import cupy`, and a CPU-only machine has no use for one)."""
    if installed is None:
        from importlib import metadata
        installed = [d.metadata["Name"] for d in metadata.distributions()]
    m = re.match(r"cuda(\d+)", extra)
    keep = CUPY.get(int(m.group(1))) if m else None
    present = {n.lower().replace("_", "-") for n in installed if n}
    return [n for n in OTHER_CUPY if n in present and n != keep]


def _parse_version(text: str) -> Optional[Version]:
    if text == "none":
        return None
    m = re.fullmatch(r"(\d+)\.(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected MAJOR.MINOR or none, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="gpu_select.py", description="The pip extra of Lanechat for this machine's GPU")
    ap.add_argument("--explain", action="store_true", help="print why, not the extra")
    ap.add_argument("--stale", metavar="EXTRA", nargs="?", const="",
                    help="print the installed CuPy distributions that EXTRA does not want (run with the venv's python)")
    ap.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to ask (default: the one on PATH)")
    ap.add_argument("--system-nvrtc", type=_parse_version, metavar="X.Y|none", default=argparse.SUPPRESS,
                    help="take this as the system NVRTC instead of looking for it (another machine's answer)")
    a = ap.parse_args(argv)
    if a.stale is not None:
        print(" ".join(stale(a.stale)))
        return 0
    gpu, reason = read_smi(a.nvidia_smi)
    probe = (lambda major: a.system_nvrtc) if hasattr(a, "system_nvrtc") else system_nvrtc
    c = choose(gpu, reason, probe)
    print(f"gpu: {c.why}" if a.explain else c.extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
