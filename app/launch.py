"""`lanechat`, the app's entry point (the console script; the desktop entry runs it through
packaging/lanechat-launch.sh): a log in the state dir, and a failure the user can see.

A double-click has no terminal, so when the app cannot open its window (no display, Qt's xcb
libraries missing, a broken install, any error on the way) the reason goes to the log
(<state dir>/lanechat.log, rotated at start) and to the user: a Qt message box when a display
works, else a desktop notification through notify-send when the session bus is there.

Only the standard library is imported up front: this module must run when PySide6 or the engine
cannot be imported.
"""
from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from . import APP_ID, APP_NAME

LOG_NAME = "lanechat.log"
LOG_BYTES, LOG_KEEP = 1 << 20, 3  # rotate past 1 MiB at start, keep 3 old logs
REPORTED = 3  # exit code: the user has been told (the shell launcher adds nothing then)
TITLE = f"{APP_NAME} could not start"
# Qt platforms that need no display server (tests, VNC, the framebuffer).
HEADLESS_PLATFORMS = ("offscreen", "minimal", "vnc", "eglfs", "linuxfb", "vkkhrdisplay")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("lanechat.launch")


def log_path() -> Path:
    """$LANECHAT_LOG (the desktop launcher sets it), else lanechat.log in the state dir."""
    if os.environ.get("LANECHAT_LOG"):
        return Path(os.environ["LANECHAT_LOG"])
    from engine import paths
    return paths.state_dir() / LOG_NAME


def rotate(path: Path, keep: int = LOG_KEEP, limit: int = LOG_BYTES) -> None:
    """lanechat.log -> .1 -> .2 ... when it has grown past `limit`; the oldest falls off."""
    if not path.exists() or path.stat().st_size <= limit:
        return
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{i + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


def open_log(path: Path, stderr_too: bool) -> None:
    """Log records to `path`, and to the terminal when there is one; `stderr_too`: all that is
    written to stderr (Qt's own messages, a native crash) goes to the log as well."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rotate(path)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    if sys.stderr is not None and sys.stderr.isatty():
        console = logging.StreamHandler()
        console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(console)
    elif stderr_too:
        os.dup2(handler.stream.fileno(), 2)


def display_problem(env: Mapping[str, str]) -> str | None:
    """Why Qt could not open a window here, or None when it can (checked before Qt loads, since
    Qt aborts the process on a platform plugin that does not load)."""
    qpa = env.get("QT_QPA_PLATFORM", "").split(";")[0].split(":")[0]
    if qpa in HEADLESS_PLATFORMS or qpa == "wayland" or (not qpa and env.get("WAYLAND_DISPLAY")):
        return None
    if not env.get("DISPLAY"):
        return ("there is no display to open a window on (DISPLAY and WAYLAND_DISPLAY are unset). Start "
                f"{APP_NAME} from a desktop session; over SSH use 'ssh -X', or the engine alone: "
                "python -m engine generate")
    from .qt_deps import advice, missing_libraries
    missing = missing_libraries()
    return advice(missing) if missing else None


def session_bus(env: Mapping[str, str]) -> bool:
    return bool(env.get("DBUS_SESSION_BUS_ADDRESS")) or Path(f"/run/user/{os.getuid()}/bus").exists()


def show_dialog(title: str, text: str) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication, QMessageBox
    app = QApplication.instance() or QApplication([sys.argv[0]])
    box = QMessageBox(QMessageBox.Icon.Critical, title, text)
    box.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # the path can be copied
    box.exec()
    app.processEvents()


def notify_send(title: str, text: str) -> bool:
    exe = shutil.which("notify-send")
    if exe is None:
        return False
    try:
        cmd = [exe, "-a", APP_NAME, "-i", APP_ID, "-u", "critical", title, text]
        return subprocess.run(cmd, capture_output=True, timeout=15).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def tell(title: str, text: str, display: bool, env: Mapping[str, str] = os.environ) -> str:
    """Show the failure the best way this session allows; returns how: dialog, notification or log."""
    if display:
        try:
            show_dialog(title, text)
            return "dialog"
        except Exception:
            log.exception("the message box did not show")
    if session_bus(env) and notify_send(title, text):
        return "notification"
    print(f"{title}: {text}", file=sys.stderr)
    return "log"


def report(message: str, display: bool, path: Path | None) -> int:
    log.error("%s", message)
    how = tell(TITLE, f"{message}\n\nDetails are in {path}" if path else message, display)
    log.info("told the user by %s", how)
    return REPORTED


def main(argv: list[str] | None = None, start: Callable[[list[str] | None], int] | None = None) -> int:
    """Runs the app (`start`, default app.main.main) and reports a failure; exit code REPORTED then."""
    path: Path | None = None
    try:
        path = log_path()
        open_log(path, stderr_too="LANECHAT_LOG" in os.environ)  # started by the desktop launcher
    except Exception as e:  # an unusable state dir, or an engine that does not import
        logging.basicConfig(level=logging.INFO, format=FORMAT)
        problem = display_problem(os.environ)
        return report(f"the log {path or '(state dir)'} cannot be written: {type(e).__name__}: {e}"
                      + (f"; and {problem}" if problem else ""), problem is None, None)
    log.info("starting (Python %s on %s %s)", platform.python_version(), platform.system(), platform.machine())
    problem = display_problem(os.environ)
    if problem:
        return report(problem, display=False, path=path)
    try:
        if start is None:
            from .main import main as start
        return start(argv)
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        log.exception("the app stopped")
        return report(f"{type(e).__name__}: {e}", display=True, path=path)


if __name__ == "__main__":
    sys.exit(main())
