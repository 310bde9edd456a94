"""Notices across the top of the window (a model that failed to load, a conversation file set
aside): visible without blocking anything, each with an optional action and a close button."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication, QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QVBoxLayout, QWidget

from . import theme


class Notice(QFrame):
    def __init__(self, text: str, error: bool, action: tuple[str, Callable[[], None]] | None = None,
                 widget: QWidget | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.text, self.error = text, error
        self._colour()
        row = QHBoxLayout(self)
        row.setContentsMargins(16, 6, 8, 6)
        label = QLabel(text, wordWrap=True)
        if widget is not None:  # under the text, e.g. a download with its progress
            column = QVBoxLayout()
            column.addWidget(label)
            column.addWidget(widget)
            row.addLayout(column, 1)
        else:
            row.addWidget(label, 1)
        if action is not None:
            button = QPushButton(action[0])
            button.clicked.connect(action[1])
            row.addWidget(button)
        close = QToolButton(text="✕", toolTip="Dismiss", autoRaise=True)
        close.clicked.connect(self.dismiss)
        row.addWidget(close)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:  # another theme
            self._colour()

    def _colour(self) -> None:
        # The theme's palette: the widget's own takes the colours of the style sheet set here.
        p = QApplication.palette(self)
        colour = theme.error_color(p) if self.error else theme.mix(p.text().color(), p.highlight().color(), 0.6)
        bg = theme.mix(p.base().color(), colour, 0.10)
        sheet = f"Notice {{ background: {bg.name()}; border-bottom: 1px solid {theme.mix(bg, colour, 0.3).name()}; }}"
        if sheet != self.styleSheet():  # setting it is a palette change too
            self.setStyleSheet(sheet)

    def dismiss(self) -> None:
        self.hide()
        self.deleteLater()


class NoticeBar(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(0)

    def add(self, text: str, error: bool = False, action: tuple[str, Callable[[], None]] | None = None,
            widget: QWidget | None = None) -> Notice:
        notice = Notice(text, error, action, widget)
        self._layout.addWidget(notice)
        notice.show()  # the layout would only queue the show: notices() must count it at once
        return notice

    def notices(self) -> list[Notice]:
        return [w for w in self.findChildren(Notice) if not w.isHidden()]

    def dismiss(self, prefix: str) -> int:
        """Drop notices that start with `prefix` (a newer state replaces them); how many went."""
        gone = [n for n in self.notices() if n.text.startswith(prefix)]
        for n in gone:
            n.dismiss()
        return len(gone)
