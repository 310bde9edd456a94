"""The CuPy for the machine: engine/gpu_select.py against faked nvidia-smi outputs (CUDA 13, CUDA 12,
no driver, a failing driver, an old driver), run the way the Makefile runs it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.gpu_select import (
    Gpu,
    choose,
    nvrtc_needed,
    parse_header,
    parse_query,
    stale,
)

from fake_smi import GB10, H100_CUDA12, T4_OLD, fake_smi
from nvrtc_wheels import WHEELS, library

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "engine" / "gpu_select.py"


def select(*args: str, path: str | None = None) -> str:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    run = subprocess.run([sys.executable, "-I", str(SCRIPT), *args], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@pytest.mark.parametrize("outputs,system,extra", [
    (GB10, "13.0", "cuda13"),
    (GB10, "none", "cuda13-toolkit"),  # no CUDA 13 toolkit on the system: its libraries from pip
    (H100_CUDA12, "12.4", "cuda12"),
    (H100_CUDA12, "none", "cuda12-toolkit"),
])
def test_the_driver_major_picks_the_cupy(tmp_path, outputs, system, extra):
    smi = fake_smi(tmp_path, *outputs)
    assert select("--nvidia-smi", str(smi), "--system-nvrtc", system) == extra
    why = select("--nvidia-smi", str(smi), "--system-nvrtc", system, "--explain")
    assert ("cupy-cuda13x" if "13" in extra else "cupy-cuda12x") in why


def test_the_makefile_way_finds_nvidia_smi_on_path(tmp_path):
    fake_smi(tmp_path / "bin", *GB10)
    assert select("--system-nvrtc", "13.0", path=f"{tmp_path / 'bin'}:/usr/bin:/bin") == "cuda13"


def test_no_driver_means_no_gpu_extra(tmp_path):
    assert select("--nvidia-smi", str(tmp_path / "absent" / "nvidia-smi")) == ""
    why = select("--nvidia-smi", str(tmp_path / "absent" / "nvidia-smi"), "--explain")
    assert "nvidia-smi not found" in why and "CPU" in why


def test_a_failing_driver_says_what_nvidia_smi_said(tmp_path):
    msg = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
           "latest NVIDIA driver is installed and running.")
    smi = fake_smi(tmp_path, msg, None, rc=9)
    assert select("--nvidia-smi", str(smi)) == ""
    assert "couldn't communicate with the NVIDIA driver" in select("--nvidia-smi", str(smi), "--explain")


def test_an_old_driver_gets_no_cupy_and_the_fix(tmp_path):
    smi = fake_smi(tmp_path, *T4_OLD)
    assert select("--nvidia-smi", str(smi), "--system-nvrtc", "11.4") == ""
    why = select("--nvidia-smi", str(smi), "--explain")
    assert "Tesla T4" in why and "CUDA 11.4" in why and "update the NVIDIA driver" in why


def test_sm121_needs_nvrtc_12_9_on_cuda_12():
    gpu = Gpu("NVIDIA GB10", "575.51", (12, 8), (12, 1))
    c = choose(gpu, nvrtc=lambda major: (12, 8))
    assert c.extra == "cuda12-toolkit" and "12.8 is older than the 12.9 sm_121 needs" in c.why
    assert choose(gpu, nvrtc=lambda major: (12, 9)).extra == "cuda12"
    assert nvrtc_needed((9, 0), 12) == (12, 0) and nvrtc_needed((12, 1), 13) == (13, 0)
    assert nvrtc_needed((13, 5), 13) == (13, 0)  # newer than the table: the newest major's first release


def test_a_newer_driver_takes_the_newest_cupy():
    c = choose(Gpu("NVIDIA Future", "700.1", (14, 1), (14, 0)), nvrtc=lambda major: (major, 5))
    assert (c.extra, c.cupy) == ("cuda13", "cupy-cuda13x")


def test_parsers_read_real_lines():
    assert parse_header(GB10[0]) == ("580.95.05", (13, 0))
    assert parse_header("no table") == ("", None)
    assert parse_query(GB10[1]) == ("NVIDIA GB10", (12, 1))
    assert parse_query("Tesla T4\n") == ("Tesla T4", None)
    assert parse_query("") == ("", None)


def test_stale_cupy_builds_are_named():
    assert stale("cuda13", ["cupy-cuda12x", "numpy", "cupy_cuda13x"]) == ["cupy-cuda12x"]
    assert stale("cuda13-toolkit", ["cupy-cuda13x"]) == []
    assert stale("", ["cupy-cuda13x", "cupy"]) == ["cupy", "cupy-cuda13x"]


def test_the_makefile_installs_the_selected_extra(tmp_path):
    fake_smi(tmp_path / "bin", *GB10)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    run = subprocess.run(["make", "-C", str(REPO), "-n", "-B", "venv", f"PYTHON={sys.executable}"], env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert '.[test,cuda13' in run.stdout  # cuda13, or cuda13-toolkit where this machine has no NVRTC 13
    assert "--stale" in run.stdout


@pytest.mark.parametrize("version", sorted(WHEELS))
def test_system_nvrtc_reads_the_library_version(version):
    """CUDA_HOME pointed at the pip wheel's folder stands in for a system toolkit."""
    major = int(version.split(".")[0])
    home = library(version).parent.parent
    code = f"import sys; sys.path.insert(0, {str(REPO / 'engine')!r}); import gpu_select; " \
           f"print(gpu_select.system_nvrtc({major}), gpu_select.system_nvrtc(99))"
    run = subprocess.run([sys.executable, "-I", "-c", code], env=dict(os.environ, CUDA_HOME=str(home)),
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    found, absent = run.stdout.strip().rsplit(" ", 1)
    assert found.startswith(f"({major}, ") and absent == "None"
