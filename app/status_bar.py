"""The window's bottom line: model, backend and device, the plan line, pool pages in use, and
how many streams are generating or waiting; while loading, the loader's progress instead."""
from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QProgressBar, QPushButton, QSizePolicy, QStatusBar, QWidget

from .engine_bridge import EngineBridge


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
        for w in (self.model, self.device, self.progress):
            self.addWidget(w)
        self.addWidget(self.error, 1)
        self.addWidget(self.fix)
        self.addWidget(self.plan, 1)
        self.addPermanentWidget(self.pages)
        bridge.state_changed.connect(self.refresh)
        bridge.progress.connect(self._progress)
        bridge.usage_changed.connect(self._usage)
        self.refresh()

    def refresh(self) -> None:
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
        self.model.setText(f"Loading model: {what}")
        self.progress.setValue(int(fraction * 100))

    def _usage(self, usage) -> None:  # engine.Usage
        streams = (f"{usage.active} generating" + (f", {usage.waiting} waiting" if usage.waiting else "")
                   if usage.active or usage.waiting else "idle")
        pool = f"pages {usage.pages_used} / {usage.pages_total}  ·  " if usage.pages_total else ""
        self.pages.setText(pool + streams)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""
