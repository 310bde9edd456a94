"""Desktop launch: the install script writes a valid .desktop entry and hicolor icons for the user,
and the app names itself with the same id."""
import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication, QImage

from app import APP_ID
from app.main import configure

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "packaging" / "install-desktop.sh"
START = REPO / "packaging" / "lanechat-launch.sh"


def fake_venv(tmp_path: Path) -> Path:
    """A venv whose path has a space and a percent sign; its python is this one."""
    venv = tmp_path / "my venv%1"
    (venv / "bin").mkdir(parents=True)
    for name, text in (("lanechat", "#!/bin/sh\n"), ("python", f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')):
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    return venv


def install(tmp_path: Path, venv: Path, path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, LANECHAT_VENV=str(venv), XDG_DATA_HOME=str(tmp_path / "share"), HOME=str(tmp_path),
               PYTHONPATH=str(REPO))
    if path:
        env["PATH"] = f"{path}:{env['PATH']}"
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)


@pytest.fixture
def installed(tmp_path):
    venv = fake_venv(tmp_path)
    run = install(tmp_path, venv)
    assert run.returncode == 0, run.stderr
    return tmp_path / "share", venv


def read_entry(path: Path) -> dict:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return dict(parser["Desktop Entry"])


def test_entry_runs_the_logging_launcher_with_the_venv(installed):
    data, venv = installed
    entry = read_entry(data / "applications" / f"{APP_ID}.desktop")
    assert entry["Type"] == "Application" and entry["Name"] == "Lanechat"
    assert entry["Exec"] == f'"{START}" "{str(venv).replace("%", "%%")}"'
    # The entry stays in the menu when the venv breaks: the launcher then says what to do.
    assert entry["TryExec"] == str(START) and entry["Icon"] == APP_ID
    assert entry["Terminal"] == "false"
    assert os.access(START, os.X_OK)


def test_missing_qt_libraries_are_named_with_their_apt_packages(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "ldd").write_text("#!/bin/sh\nprintf '\\tlibxcb-cursor.so.0 => not found\\n"
                               "\\tlibxkbcommon-x11.so.0 => not found\\n'\n")
    (tools / "ldd").chmod(0o755)
    run = install(tmp_path, fake_venv(tmp_path), path=str(tools))
    assert run.returncode == 0, run.stderr  # the entry is still installed; the launcher will say it too
    assert "sudo apt-get install libxcb-cursor0 libxkbcommon-x11-0" in run.stderr
    assert "warning: the app will not open a window" in run.stderr


def test_icons_in_every_hicolor_size(installed):
    data, _ = installed
    pngs = sorted((data / "icons" / "hicolor").glob(f"*/apps/{APP_ID}.png"))
    assert len(pngs) >= 6
    for png in pngs:
        size = png.parent.parent.name
        image = QImage(str(png))
        assert f"{image.width()}x{image.height()}" == size
    assert (data / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg").is_file()
    assert not (data / "icons" / "hicolor" / "icon-theme.cache").exists()


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils not installed")
def test_desktop_file_validate_passes(installed):
    data, _ = installed
    run = subprocess.run(["desktop-file-validate", str(data / "applications" / f"{APP_ID}.desktop")],
                         capture_output=True, text=True)
    assert run.returncode == 0 and not run.stdout.strip(), run.stdout + run.stderr


def test_missing_venv_is_a_clear_error(tmp_path):
    env = dict(os.environ, LANECHAT_VENV=str(tmp_path / "nope"), XDG_DATA_HOME=str(tmp_path / "share"))
    run = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert run.returncode == 1 and "make venv" in run.stderr
    assert not (tmp_path / "share").exists()


def test_make_target_runs_the_script():
    assert "bash packaging/install-desktop.sh" in (REPO / "Makefile").read_text()


def test_app_uses_the_same_id(qapp):
    configure(qapp)
    assert QGuiApplication.desktopFileName() == APP_ID
    assert not qapp.windowIcon().isNull()
