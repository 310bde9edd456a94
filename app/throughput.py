"""The status bar's total decode rate while several tabs stream: the sum of their replies' rates."""
from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QWidget

from .tabs import ConversationTabs

PERIOD_MS = 500


class Throughput(QLabel):
    def __init__(self, tabs: ConversationTabs, parent: QWidget | None = None) -> None:
        super().__init__(parent, toolTip="Tokens per second written by every reply in progress, together")
        self.tabs = tabs
        self._timer = QTimer(self, interval=PERIOD_MS, timeout=self.refresh)
        self._timer.start()
        self.hide()

    def refresh(self) -> None:
        rates = [tab.reply.live_tps for tab in self.tabs.tabs() if tab.reply is not None]
        self.setText(f"{len(rates)} replies · {sum(rates):.1f} tok/s in all")
        self.setVisible(len(rates) > 1)
