"""Desktop launch: the install script writes a valid .desktop entry and hicolor icons for the user,
and the app names itself with the same id."""
import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication, QImage

from app import APP_ID
from app.main import configure

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "packaging" / "install-desktop.sh"


@pytest.fixture
def installed(tmp_path):
    """Run the script against a fake venv whose path has a space and a percent sign."""
    venv = tmp_path / "my venv%1"
    (venv / "bin").mkdir(parents=True)
    launcher = venv / "bin" / "lanechat"
    launcher.write_text("#!/bin/sh\n")
    launcher.chmod(0o755)
    data = tmp_path / "share"
    env = dict(os.environ, LANECHAT_VENV=str(venv), XDG_DATA_HOME=str(data), HOME=str(tmp_path))
    run = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return data, launcher


def read_entry(path: Path) -> dict:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return dict(parser["Desktop Entry"])


def test_entry_points_at_the_venv_launcher(installed):
    data, launcher = installed
    entry = read_entry(data / "applications" / f"{APP_ID}.desktop")
    assert entry["Type"] == "Application" and entry["Name"] == "Lanechat"
    assert entry["Exec"] == f'"{str(launcher).replace("%", "%%")}"'
    assert entry["TryExec"] == str(launcher) and entry["Icon"] == APP_ID
    assert entry["Terminal"] == "false"


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
