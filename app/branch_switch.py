"""‹ 2/3 ›: which of a message's alternatives is shown, with buttons to the previous and next."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget


class BranchSwitch(QWidget):
    step = Signal(int)  # -1: the previous alternative, +1: the next

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.previous = QToolButton(text="‹", objectName="messageAction", toolTip="The previous version")
        self.next = QToolButton(text="›", objectName="messageAction", toolTip="The next version")
        self.label = QLabel(objectName="meta")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        for w in (self.previous, self.label, self.next):
            layout.addWidget(w)
        for b, delta in ((self.previous, -1), (self.next, 1)):
            b.setCursor(Qt.CursorShape.PointingHandCursor)
            b.clicked.connect(lambda _c=False, d=delta: self.step.emit(d))
        self.hide()

    def show_place(self, position: int, count: int, enabled: bool = True) -> None:
        """Alternative `position` (from 1) of `count`; hidden when there is only one."""
        self.label.setText(f"{position}/{count}")
        self.previous.setEnabled(enabled and position > 1)
        self.next.setEnabled(enabled and position < count)
        self.setVisible(count > 1)
