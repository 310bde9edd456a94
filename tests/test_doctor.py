"""`python -m engine doctor`: made-up machines get the right verdict and the exact fix; the command
itself reads a faked nvidia-smi."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.doctor import REPO, Facts, gather, report
from engine.gpu_select import Gpu, choose, nvrtc_needed
from engine.ops import cuda_available

from fake_smi import GB10, fake_smi

GB10_GPU = Gpu("NVIDIA GB10", "580.95.05", (13, 0), (12, 1))
CUDA13 = choose(GB10_GPU, nvrtc=lambda major: (13, 0))


def healthy(**kw) -> Facts:
    f = Facts(GB10_GPU, CUDA13, {"cupy-cuda13x": "14.2.0"}, runtime=(13, 0), nvrtc=(13, 0),
              nvrtc_path="/usr/local/cuda-13.0/targets/sbsa-linux/lib/libnvrtc.so.13", cc=(12, 1), unified=True)
    for k, v in kw.items():
        setattr(f, k, v)
    return f


def fixes(lines: list[str]) -> list[str]:
    return [line[len("fix: "):] for line in lines if line.startswith("fix: ")]


def test_a_healthy_gb10_names_every_piece():
    lines = report(healthy())
    text = "\n".join(lines)
    for piece in ("NVIDIA GB10", "compute capability 12.1 (sm_121)", "driver 580.95.05", "CUDA up to 13.0",
                  "cupy-cuda13x 14.2.0", "CUDA runtime 13.0", "NVRTC 13.0", "libnvrtc.so.13", "unified",
                  "backend: cupy on NVIDIA GB10"):
        assert piece in text, piece
    assert fixes(lines) == []


def test_the_cuda12_build_on_a_cuda13_driver_is_swapped():
    lines = report(healthy(cupy_builds={"cupy-cuda12x": "14.2.0"}))
    [fix] = fixes(lines)
    assert f"{sys.executable} -m pip uninstall -y cupy-cuda12x" in fix
    assert f'pip install -e "{REPO}[cuda13]"' in fix


def test_two_cupy_builds_keep_the_right_one():
    lines = report(healthy(cupy_builds={"cupy-cuda12x": "13.6.0", "cupy-cuda13x": "14.2.0"}))
    [fix] = fixes(lines)
    assert "uninstall -y cupy-cuda12x &&" in fix and "cupy-cuda13x" not in fix.split("&&")[0]


def test_an_nvrtc_too_old_for_sm121_brings_the_toolkit_wheels():
    gpu = Gpu("NVIDIA GB10", "575.51", (12, 8), (12, 1))
    choice = choose(gpu, nvrtc=lambda major: (12, 9))  # the system's was new enough when make venv ran
    lines = report(healthy(gpu=gpu, choice=choice,
                           cupy_builds={"cupy-cuda12x": "14.2.0"}, runtime=(12, 8), nvrtc=(12, 8)))
    assert any("NVRTC 12.8 cannot compile for sm_121 (it needs 12.9)" in line for line in lines)
    assert fixes(lines) == [f'{sys.executable} -m pip install -e "{REPO}[cuda12-toolkit]"  '
                            f"(NVRTC 12 from pip; CuPy prefers it to the system's)"]
    assert not any(line.startswith("backend: cupy") for line in lines)


def test_cupy_that_cannot_load_its_libraries_gets_them_from_pip():
    lines = report(healthy(cupy_error="ImportError: libcublas.so.13: cannot open shared object file"))
    assert any("libcublas.so.13" in line for line in lines)
    assert fixes(lines)[0].startswith(f'{sys.executable} -m pip install -e "{REPO}[cuda13-toolkit]"')


def test_no_cupy_yet_is_one_install_away():
    lines = report(healthy(cupy_builds={}))
    assert "CuPy: not installed; the engine runs on the CPU" in lines
    assert fixes(lines) == [f'{sys.executable} -m pip install -e "{REPO}[cuda13]"']


def test_no_gpu_and_an_old_driver():
    lines = report(Facts(None, choose(None, "no NVIDIA driver (nvidia-smi not found)")))
    assert lines == ["no usable GPU: no NVIDIA driver (nvidia-smi not found): the engine runs on the CPU"]
    old = Gpu("Tesla T4", "470.182.03", (11, 4), None)
    lines = report(Facts(old, choose(old), {"cupy-cuda12x": "14.2.0"}))
    assert "update the NVIDIA driver" in lines[0]
    assert fixes(lines) == [f"{sys.executable} -m pip uninstall -y cupy-cuda12x  (CuPy has no GPU to use here)"]


def test_the_command_reads_nvidia_smi(tmp_path):
    fake_smi(tmp_path / "bin", *GB10)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    run = subprocess.run([sys.executable, "-m", "engine", "doctor"], cwd=REPO, env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "doctor: GPU NVIDIA GB10, compute capability 12.1 (sm_121), driver 580.95.05 (runs CUDA up to 13.0)" in out
    assert "make venv installs cupy-cuda13x" in out
    if importlib.util.find_spec("cupy") is None:  # here CuPy is missing: the fix installs the CUDA 13 build
        assert f'doctor: fix: {sys.executable} -m pip install -e "{REPO}[cuda13' in out


def test_the_command_without_a_driver(tmp_path):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + ":/usr/bin:/bin")
    if any((Path(d) / "nvidia-smi").exists() for d in env["PATH"].split(":")):
        env["PATH"] = str(Path(sys.executable).parent)  # a real driver here: hide it
    run = subprocess.run([sys.executable, "-m", "engine", "doctor"], cwd=REPO, env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    assert "doctor: no usable GPU: no NVIDIA driver (nvidia-smi not found)" in run.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available()[0], reason=cuda_available()[1] or "no GPU")
def test_this_gpu_gets_a_clean_bill():
    """On a machine whose CuPy works (the H200 run), doctor finds nothing to fix."""
    f = gather()
    lines = report(f)
    assert f.cupy_error == "" and fixes(lines) == [], lines
    assert lines[-1].startswith("backend: cupy on ") and f.nvrtc >= nvrtc_needed(f.cc, f.nvrtc[0])
