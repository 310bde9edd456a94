"""The scrolling list of messages in one tab: a readable centred column that follows new text
while the user is at the bottom and stays put when they have scrolled up to read."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from .conversation import Message
from .message_view import MessageWidget

COLUMN_WIDTH = 860  # beyond this, lines get too long to read comfortably
_STICK_PX = 24


def centered(widget: QWidget, name: str = "", margins: tuple[int, int, int, int] = (16, 0, 16, 0)) -> QWidget:
    """`widget` in the middle of a full-width row, no wider than the chat column, so the system
    prompt, the messages and the composer line up."""
    row_widget = QWidget(objectName=name)
    row_widget.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, bool(name))  # paint its rule
    row = QHBoxLayout(row_widget)
    row.setContentsMargins(*margins)
    widget.setMaximumWidth(COLUMN_WIDTH)
    row.addStretch(1)
    row.addWidget(widget, 100)
    row.addStretch(1)
    return row_widget


class ChatView(QScrollArea):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="chatView", widgetResizable=True,
                         frameShape=QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        column = QWidget(objectName="chatColumn")
        outer = centered(column, "chatColumn", (16, 16, 16, 16))
        self._list = QVBoxLayout(column)
        self._list.setContentsMargins(0, 0, 0, 0)
        self._list.setSpacing(12)
        self._empty = QLabel("Ask anything.\n\nEnter sends  ·  Shift+Enter starts a new line\n"
                             "Ctrl+T opens another tab: tabs generate at the same time",
                             objectName="hint", alignment=Qt.AlignmentFlag.AlignCenter)
        self._list.addWidget(self._empty)
        self._list.addStretch(1)
        self.setWidget(outer)
        self.widgets: list[MessageWidget] = []
        self._stick = True
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(lambda v: setattr(self, "_stick", v >= bar.maximum() - _STICK_PX))
        bar.rangeChanged.connect(self._follow)

    def set_messages(self, messages: list[Message]) -> None:
        self.remove_from(0)
        for m in messages:
            self.add(m)
        self.scroll_to_end()

    def add(self, message: Message) -> MessageWidget:
        widget = MessageWidget(message)
        self._list.insertWidget(self._list.count() - 1, widget)
        self.widgets.append(widget)
        self._empty.hide()
        return widget

    def remove_from(self, index: int) -> None:
        """Drop the widgets of messages[index:] (edit and regenerate rewrite the tail)."""
        for w in self.widgets[index:]:
            w.deleteLater()
        del self.widgets[index:]
        self._empty.setVisible(not self.widgets)

    def scroll_to_end(self) -> None:
        self._stick = True
        self._follow()

    def _follow(self) -> None:
        if self._stick:
            bar = self.verticalScrollBar()
            bar.setValue(bar.maximum())
