"""A launch that fails before the window exists writes the log and tells the user: a Qt message box
when a display works, notify-send when only the session bus does; the desktop launcher does the
same when the venv cannot even run Python."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from app import launch

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "packaging" / "lanechat-launch.sh"
NO_DISPLAY = ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "LANECHAT_LOG", "XDG_STATE_HOME", "LANECHAT_HOME")


def fake_tools(folder: Path, ldd_missing: str = "") -> Path:
    """notify-send that records each call as one line (fields split by |), and optionally an ldd
    that reports `ldd_missing` as not found."""
    bin_ = folder / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "notify-send").write_text(f"#!/bin/sh\nprintf '%s|' \"$@\" | tr '\\n' ' ' >> '{folder}/notified'\n"
                                      f"echo >> '{folder}/notified'\n")
    if ldd_missing:
        (bin_ / "ldd").write_text(f"#!/bin/sh\nprintf '\\t{ldd_missing} => not found\\n"
                                  f"\\tlibc.so.6 => /lib/libc.so.6 (0x0)\\n'\n")
    for tool in bin_.iterdir():
        tool.chmod(0o755)
    return bin_


def session(tmp_path: Path, bin_: Path, **extra: str) -> dict:
    """A desktop session's environment without a display: a session bus, HOME in tmp_path."""
    env = {k: v for k, v in os.environ.items() if k not in NO_DISPLAY}
    env.update(HOME=str(tmp_path / "home"), PATH=f"{bin_}:{env['PATH']}",
               DBUS_SESSION_BUS_ADDRESS=f"unix:path={tmp_path}/bus", **extra)
    return env


def notified(tmp_path: Path) -> list[list[str]]:
    f = tmp_path / "notified"
    return [line.rstrip("|").split("|") for line in f.read_text().splitlines()] if f.exists() else []


def state_log(env: dict) -> Path:
    code = "from engine import paths; print(paths.state_dir())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()) / "lanechat.log"


def test_no_display_notifies_through_the_session_bus(tmp_path):
    env = session(tmp_path, fake_tools(tmp_path))
    run = subprocess.run([sys.executable, "-m", "app.launch"], env=env, capture_output=True, text=True, cwd=REPO)
    assert run.returncode == launch.REPORTED, run.stderr
    log = state_log(env).read_text()
    assert "there is no display to open a window on" in log and "told the user by notification" in log
    [call] = notified(tmp_path)
    assert call[:6] == ["-a", "Lanechat", "-i", "io.github.lanechat.Lanechat", "-u", "critical"]
    assert call[6] == "Lanechat could not start" and "no display" in call[7] and str(state_log(env)) in call[7]


def test_missing_xcb_libraries_name_their_apt_packages(tmp_path):
    env = session(tmp_path, fake_tools(tmp_path, ldd_missing="libxcb-cursor.so.0"), DISPLAY=":93")
    run = subprocess.run([sys.executable, "-m", "app.launch"], env=env, capture_output=True, text=True, cwd=REPO)
    assert run.returncode == launch.REPORTED, run.stderr
    [call] = notified(tmp_path)
    assert "libxcb-cursor.so.0" in call[7] and "sudo apt-get install libxcb-cursor0" in call[7]
    assert "sudo apt-get install libxcb-cursor0" in state_log(env).read_text()


def test_without_a_session_bus_the_log_and_stderr_keep_it(tmp_path):
    env = session(tmp_path, fake_tools(tmp_path))
    del env["DBUS_SESSION_BUS_ADDRESS"]
    run = subprocess.run([sys.executable, "-m", "app.launch"], env=env, capture_output=True, text=True, cwd=REPO)
    assert run.returncode == launch.REPORTED
    if not Path(f"/run/user/{os.getuid()}/bus").exists():
        assert notified(tmp_path) == [] and "no display" in run.stderr
        assert "told the user by log" in state_log(env).read_text()


@pytest.fixture
def root_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


def close_the_next_box(shown: list) -> None:
    """Record the next modal message box (title, text, icon) and press OK, as the user would."""
    def close():
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, close)
            return
        shown.append((box.windowTitle(), box.text(), box.icon()))
        box.accept()
    QTimer.singleShot(20, close)


def test_an_error_before_the_window_shows_a_message_box(qapp, app_home, root_logging, monkeypatch):
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # a display that works
    shown = []

    def start(argv):
        raise RuntimeError("the conversations folder is not writable")

    close_the_next_box(shown)
    assert launch.main([], start=start) == launch.REPORTED
    [(title, text, icon)] = shown
    log = app_home / "state" / "lanechat.log"
    assert title == "Lanechat could not start" and icon == QMessageBox.Icon.Critical
    assert "RuntimeError: the conversations folder is not writable" in text and str(log) in text
    written = log.read_text()
    assert "Traceback" in written and "told the user by dialog" in written


def test_an_unwritable_log_is_said_in_the_box(qapp, tmp_path, root_logging, monkeypatch):
    (tmp_path / "not a folder").write_text("")
    monkeypatch.setenv("LANECHAT_LOG", str(tmp_path / "not a folder" / "lanechat.log"))
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    shown = []
    close_the_next_box(shown)
    assert launch.main([], start=lambda argv: pytest.fail("the app must not start")) == launch.REPORTED
    [(_, text, _)] = shown
    assert "not a folder/lanechat.log cannot be written" in text


def test_the_log_rotates_at_start(tmp_path):
    log = tmp_path / "lanechat.log"
    for i in range(5):
        log.write_text(f"run {i}\n" * 10)
        launch.rotate(log, keep=3, limit=20)
    assert not log.exists()
    assert [(tmp_path / f"lanechat.log.{i}").read_text().split()[1] for i in (1, 2, 3)] == ["4", "3", "2"]
    assert not (tmp_path / "lanechat.log.4").exists()
    log.write_text("small\n")
    launch.rotate(log, keep=3, limit=20)
    assert log.read_text() == "small\n"


def test_which_sessions_can_open_a_window():
    assert launch.display_problem({"QT_QPA_PLATFORM": "offscreen"}) is None
    assert launch.display_problem({"WAYLAND_DISPLAY": "wayland-0"}) is None
    assert "no display" in launch.display_problem({})
    assert "no display" in launch.display_problem({"QT_QPA_PLATFORM": "xcb"})


# --- the desktop launcher (packaging/lanechat-launch.sh) ---------------------------------------

def run_launcher(venv: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LAUNCHER), str(venv)], env=env, capture_output=True, text=True, timeout=120)


def test_a_missing_venv_is_logged_and_notified(tmp_path):
    env = session(tmp_path, fake_tools(tmp_path))
    run = run_launcher(tmp_path / "moved away" / ".venv", env)
    assert run.returncode == 1
    log = state_log(env)  # the launcher's state dir is engine.paths' one
    assert "moved away/.venv is missing or broken" in log.read_text() and "make venv" in log.read_text()
    [call] = notified(tmp_path)
    assert call[6] == "Lanechat could not start" and "make venv" in call[7] and str(log) in call[7]


def test_a_venv_that_cannot_import_the_app_says_why(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text("#!/bin/sh\n[ \"$1\" = -c ] && exit 0\n"
                      "echo 'Traceback (most recent call last):' >&2\n"
                      "echo \"ModuleNotFoundError: No module named 'PySide6'\" >&2\nexit 1\n")
    python.chmod(0o755)
    env = session(tmp_path, fake_tools(tmp_path), LANECHAT_HOME=str(tmp_path / "lc"))
    run = run_launcher(venv, env)
    assert run.returncode == 1
    log = (tmp_path / "lc" / "state" / "lanechat.log").read_text()
    assert "No module named 'PySide6'" in log and "Traceback" in log
    [call] = notified(tmp_path)
    assert "exit code 1: ModuleNotFoundError: No module named 'PySide6'" in call[7]


def test_the_launcher_runs_the_app_which_tells_the_user_once(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    env = session(tmp_path, fake_tools(tmp_path), LANECHAT_HOME=str(tmp_path / "lc"), PYTHONPATH=str(REPO))
    run = run_launcher(venv, env)
    assert run.returncode == launch.REPORTED
    log = (tmp_path / "lc" / "state" / "lanechat.log").read_text()
    assert "INFO lanechat.launch: starting" in log and "there is no display" in log
    assert len(notified(tmp_path)) == 1  # app.launch told the user; the launcher adds nothing
