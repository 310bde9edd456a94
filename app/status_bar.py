"""The window's bottom line: model, backend and device, the plan line, pool pages in use, and
how many streams are generating or waiting; while loading, the loader's progress instead. When
the current tab runs on a remote engine, "remote: <url>" and its model instead; on the right,
where the local server listens while it does."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QProgressBar, QPushButton, QSizePolicy, QStatusBar, QWidget

from .engine_bridge import EngineBridge
from .remote_engine import RemoteEngine


class _ElidedLabel(QLabel):
    """One line that gives way when the window is narrow (ending in …; the tooltip has it all),
    instead of a long path or plan line forcing the window wider than the screen."""

    def __init__(self, object_name: str = "") -> None:
        super().__init__(objectName=object_name)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        super().setText(text)
        self.setToolTip(text)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(40, super().minimumSizeHint().height())

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, rect.width())
        painter.setPen(self.palette().windowText().color())
        painter.drawText(rect, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, text)


class StatusBar(QStatusBar):
    settings_requested = Signal()

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.setSizeGripEnabled(False)
        self.model = QLabel(objectName="role")
        self.device = QLabel()
        self.plan = _ElidedLabel("meta")
        self.pages = QLabel()
        self.progress = QProgressBar(maximumWidth=160, maximum=100, textVisible=False)
        self.error = _ElidedLabel("error")
        self.fix = QPushButton("Open Settings…", flat=True)
        self.fix.clicked.connect(self.settings_requested)
        self.remote = _ElidedLabel("meta")
        self.serving = QLabel(objectName="meta")
        self._remote: RemoteEngine | None = None
        self.addWidget(self.remote, 1)
        for w in (self.model, self.device, self.progress):
            self.addWidget(w)
        self.addWidget(self.error, 1)
        self.addWidget(self.fix)
        self.addWidget(self.plan, 1)
        self.addPermanentWidget(self.pages)
        self.addPermanentWidget(self.serving)
        self.set_serving(None)
        bridge.state_changed.connect(self.refresh)
        bridge.progress.connect(self._progress)
        bridge.usage_changed.connect(self._usage)
        self.refresh()

    def show_engine(self, remote: RemoteEngine | None) -> None:
        """The current tab's engine: a remote one, or None for this computer's."""
        self._remote = remote
        self.refresh()

    def set_serving(self, url: str | None) -> None:
        self.serving.setText(f"Serving on {url}" if url else "")
        self.serving.setVisible(bool(url))

    def refresh(self) -> None:
        remote = self._remote
        self.remote.setVisible(remote is not None)
        if remote is not None:
            model = remote.config.model or "no model chosen"
            self.remote.setText(f"{remote.label}  ·  {model}")
            for w in (self.model, self.device, self.plan, self.pages, self.progress, self.error, self.fix):
                w.setVisible(False)
            return
        self.model.setVisible(True)
        b = self.bridge
        info = b.info
        loading, failed = b.state == "starting", b.state == "failed"
        self.progress.setVisible(loading)
        self.error.setVisible(failed)
        self.fix.setVisible(failed)
        self.device.setVisible(info is not None)
        self.pages.setVisible(info is not None)
        if info is not None:
            self.model.setText(info.model_name)
            self.device.setText(f"{info.backend} · {info.device}")
            self.plan.setText(info.plan_line)
        elif loading:
            self.model.setText("Loading model…")
            self.progress.setValue(0)
        elif failed:
            self.model.setText("No model loaded:")
            self.error.setText(_first_line(b.error or ""))
        else:
            self.model.setText("Engine stopped")
        self.plan.setVisible(info is not None)

    def _progress(self, what: str, fraction: float) -> None:
        if self._remote is not None:
            return
        self.model.setText(f"Loading model: {what}")
        self.progress.setValue(int(fraction * 100))

    def _usage(self, usage) -> None:  # engine.Usage
        streams = (f"{usage.active} generating" + (f", {usage.waiting} waiting" if usage.waiting else "")
                   if usage.active or usage.waiting else "idle")
        pool = f"pages {usage.pages_used} / {usage.pages_total}  ·  " if usage.pages_total else ""
        self.pages.setText(pool + streams)
        self.pages.setVisible(self._remote is None)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
