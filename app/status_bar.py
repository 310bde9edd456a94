"""The window's bottom line: model, backend and device, the plan in words (the engine's exact plan
line as its tooltip), pool pages in use, and how many chats are generating, reading their prompt
or waiting; while loading, the loader's progress instead. When the current tab runs on a remote
engine, "remote: <url>" and its model instead; on the right, where the local server listens while
it does."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QProgressBar, QPushButton, QSizePolicy, QStatusBar, QWidget

from .engine_bridge import GENERATING, READING, WAITING, EngineBridge
from .plan_words import plan_summary
from .remote_engine import RemoteEngine


class _ElidedLabel(QLabel):
    """One line that gives way when the window is narrow (ending in …; the tooltip has it all),
    instead of a long path or plan line forcing the window wider than the screen."""

    def __init__(self, object_name: str = "") -> None:
        super().__init__(objectName=object_name)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)

    def setText(self, text: str, tooltip: str | None = None) -> None:  # noqa: N802 - Qt override
        super().setText(text)
        self.setToolTip(text if tooltip is None else tooltip)

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
        self.cancel = QPushButton("Cancel", flat=True, toolTip="Stop loading the model (at its next tensor)")
        self.cancel.clicked.connect(bridge.cancel_start)
        self.error = _ElidedLabel("error")
        self.fix = QPushButton("Open Settings…", flat=True)
        self.fix.clicked.connect(self.settings_requested)
        self.remote = _ElidedLabel("meta")
        self.serving = QLabel(objectName="meta")
        self._remote: RemoteEngine | None = None
        self.addWidget(self.remote, 1)
        for w in (self.model, self.device, self.progress, self.cancel):
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
        bridge.activity_changed.connect(self._show_pages)
        self._pool = ""
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
            for w in (self.model, self.device, self.plan, self.pages, self.progress, self.cancel, self.error,
                      self.fix):
                w.setVisible(False)
            return
        self.model.setVisible(True)
        b = self.bridge
        info = b.info
        loading, failed = b.state == "starting", b.state == "failed"
        self.progress.setVisible(loading)
        self.cancel.setVisible(loading)
        self.error.setVisible(failed)
        self.fix.setVisible(failed)
        self.device.setVisible(info is not None)
        self.pages.setVisible(info is not None)
        if info is not None:
            self.model.setText(info.model_name)
            ready = f" · ready in {b.ready_seconds:.1f} s" if b.ready_seconds is not None else ""
            self.device.setText(f"{info.backend} · {info.device}{ready}")
            self.device.setToolTip("From Apply (or launch) to ready: "
                                   + ", ".join(f"{name} {sec:.2f} s" for name, sec in info.timings))
            self.plan.setText(plan_summary(info.plan) if info.plan is not None else info.plan_line, info.plan_line)
        elif loading:
            self.model.setText("Loading model…")
            self.progress.setValue(0)
        elif failed:
            self.model.setText("No model loaded:")
            self.error.setText(_first_line(b.error or ""))
        elif b.state == "unloaded":
            self.model.setText("Model unloaded while idle: the next message loads it again")
        else:
            self.model.setText("Engine stopped")
        self.plan.setVisible(info is not None)

    def _progress(self, what: str, fraction: float) -> None:
        if self._remote is not None:
            return
        self.model.setText(f"Loading model: {what}")
        self.progress.setValue(int(fraction * 100))

    def _usage(self, usage) -> None:  # engine.Usage
        self._pool = f"pages {usage.pages_used} / {usage.pages_total}  ·  " if usage.pages_total else ""
        self._show_pages()

    def _show_pages(self) -> None:
        # Streams as the app knows them (at once); the engine's usage is polled, and it counts a
        # prompt being read only once its first step is done.
        counts = self.bridge.activity()
        parts = [f"{counts[GENERATING]} generating"] if counts[GENERATING] else []
        if counts[READING]:
            parts.append(f"{counts[READING]} reading {'a prompt' if counts[READING] == 1 else 'prompts'}")
        if counts[WAITING]:
            parts.append(f"{counts[WAITING]} waiting")
        self.pages.setText(self._pool + (", ".join(parts) or "idle"))
        self.pages.setVisible(self._remote is None and self.bridge.info is not None)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
