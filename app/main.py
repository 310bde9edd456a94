"""The desktop app's startup: the window, the event loop, the engine (`lanechat` runs it through
app.launch, which logs and reports a failure)."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

import qasync
from PySide6.QtCore import QObject, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication

from engine import paths

from . import APP_ID, APP_NAME, theme
from .app_settings import load_sampling_chosen, load_settings, remove_leftovers
from .engine_bridge import EngineBridge
from .resources import app_icon
from .store import ConversationStore
from .window import MainWindow


def create_window(bridge: EngineBridge | None = None) -> MainWindow:
    """The window of the last session, wired to a stopped engine (`bridge`: another one, e.g. a
    test's): call start_engine() next."""
    remove_leftovers()
    settings, notice = load_settings()
    store = ConversationStore(paths.data_dir() / "conversations")
    store.trash.empty()  # deletions of earlier sessions: their Undo is gone (app/trash.py)
    notices = store.recover() + ([notice] if notice else [])
    window = MainWindow(store, bridge or EngineBridge(), settings, icon=app_icon(), chosen=load_sampling_chosen())
    window.restore(notices)
    return window


def configure(app: QApplication) -> None:
    """Names, icon and look (the theme saved, or the system's); before the first window is shown."""
    # Must match the .desktop file's name so the shell ties the window to its launcher and icon.
    QGuiApplication.setDesktopFileName(APP_ID)
    app.setApplicationName("lanechat")  # X11 WM_CLASS, matched by the entry's StartupWMClass
    app.setApplicationDisplayName(APP_NAME)
    app.setWindowIcon(app_icon())
    theme.apply(app)


def collect_on_this_thread(parent: QObject, period_ms: int = 2000) -> QTimer:
    """Cyclic garbage is collected on the GUI thread only. Left to itself, Python collects in
    whichever thread allocates, and the engine thread would then delete Qt objects (a crash)."""
    gc.disable()
    timer = QTimer(parent, interval=period_ms, timeout=gc.collect)
    timer.start()
    return timer


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app = QApplication(sys.argv if argv is None else argv)
    configure(app)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    window = create_window()
    window.show()
    collect_on_this_thread(app)
    # A session logout or `kill` closes the window normally, so replies in progress are saved.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, window.close)
    closed = asyncio.Event()
    app.aboutToQuit.connect(closed.set)
    with loop:
        asyncio.ensure_future(window.start_engine())
        loop.run_until_complete(closed.wait())
    return 0


if __name__ == "__main__":
    sys.exit(main())
