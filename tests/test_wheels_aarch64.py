"""The GB10 (aarch64, glibc 2.39 = Ubuntu 24.04 / DGX OS 7, CPython 3.12) gets a binary wheel for
every dependency `make venv` installs there (the app, the test extra, each GPU extra): pip
resolves them for that platform without installing (`--dry-run --only-binary=:all:`), and a
dependency without such a wheel fails by name. Skips, saying so, only when the package index
cannot be reached."""
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

REPO = Path(__file__).resolve().parent.parent
PYTHON = "3.12"
# pip takes a wheel only for a platform tag it is given: glibc 2.39 down to manylinux2014 (2.17).
PLATFORMS = [f"manylinux_2_{minor}_aarch64" for minor in range(39, 16, -1)] + ["manylinux2014_aarch64"]
TARGET = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.3", "platform_machine": "aarch64",
          "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
          "platform_python_implementation": "CPython"}
# The -toolkit extras hold the plain ones (the same CuPy plus its CUDA libraries); CUDA 12 and 13
# libraries cannot share one resolution, so each major is resolved apart.
GPU_SETS = ("cuda12-toolkit", "cuda13-toolkit")


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def for_gb10(requirements: list[str]) -> list[str]:
    """The requirements whose markers hold on the GB10, without their markers."""
    out = []
    for text in requirements:
        r = Requirement(text)
        if r.marker is None or r.marker.evaluate(dict(TARGET, extra="")):
            r.marker = None
            out.append(str(r))
    return out


def index_url() -> str:
    return os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


@pytest.fixture(scope="module")
def index():
    url = index_url()
    try:
        urllib.request.urlopen(f"{url}/pip/", timeout=15).close()
    except OSError as e:
        pytest.skip(f"the package index {url} is unreachable ({e}); aarch64 resolution not checked")
    return url


def resolve(requirements: list[str], report: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
           "--abi", f"cp{PYTHON.replace('.', '')}"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    return subprocess.run(cmd + requirements, capture_output=True, text=True, timeout=900)


def missing_wheels(stderr: str) -> list[str]:
    return sorted(set(re.findall(r"No matching distribution found for ([^\s]+)", stderr)))


@pytest.mark.parametrize("gpu", GPU_SETS)
def test_every_dependency_has_an_aarch64_wheel(index, tmp_path, gpu):
    p = project()
    extras = p["optional-dependencies"]
    wanted = for_gb10(p["dependencies"]) + for_gb10(extras["test"]) + for_gb10(extras[gpu])
    run = resolve(wanted, tmp_path / "report.json")
    assert run.returncode == 0, (f"no binary wheel for manylinux_2_39_aarch64 / CPython {PYTHON}: "
                                 f"{', '.join(missing_wheels(run.stderr)) or 'see pip'}\n{run.stderr[-3000:]}")
    installs = json.loads((tmp_path / "report.json").read_text())["install"]
    files = {i["metadata"]["name"].lower().replace("_", "-"): i["download_info"]["url"].rsplit("/", 1)[-1]
             for i in installs}
    assert all(f.endswith(".whl") for f in files.values()), files
    for name in (Requirement(r).name.lower().replace("_", "-") for r in wanted):
        assert name in files, f"{name} is not in pip's plan: {sorted(files)}"
    assert "pyside6-essentials" in files and "cupy-cuda" + gpu[4:6] + "x" in files


def test_the_gpu_extras_are_the_ones_gpu_select_names():
    from engine.gpu_select import CUPY
    extras = project()["optional-dependencies"]
    for major, cupy in CUPY.items():
        for extra in (f"cuda{major}", f"cuda{major}-toolkit"):
            assert any(Requirement(r).name == cupy for r in extras[extra]), (extra, extras[extra])
    assert set(GPU_SETS) <= set(extras)


def test_a_missing_wheel_is_named(index, tmp_path):
    """A package with no aarch64 binary (its releases are source only) fails, and by name."""
    run = resolve(["pycparser==2.14"], tmp_path / "report.json")
    assert run.returncode != 0 and missing_wheels(run.stderr) == ["pycparser==2.14"], run.stderr[-2000:]
