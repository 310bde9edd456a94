"""The scrolling list of messages in one tab: a readable centred column that follows new text
while the user is at the bottom and stays put when they have scrolled up to read.

History is built lazily: opening a conversation makes widgets for its last messages only, and
older ones appear, a batch at a time, as the user scrolls towards the top (the view keeps its place
while they do), so a long conversation opens as fast as a short one.
"""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QEvent, QObject, QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget

from .conversation import Message
from .message_view import MessageWidget

COLUMN_WIDTH = 860  # beyond this, lines get too long to read comfortably
_STICK_PX = 24
FIRST_BATCH = 6  # messages built when a conversation opens
BATCH = 8  # older messages built at a time while scrolling up


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
    edit_requested = Signal(object)  # a message's Edit button: the Message
    regenerate_requested = Signal()  # a reply's Regenerate / Retry button
    branch_requested = Signal(object, int)  # a message's ‹ › : the Message, -1 or +1
    fork_requested = Signal(object)  # a message's Fork button: the Message
    continue_requested = Signal(object)  # a reply's Continue button: the Message

    def __init__(self, parent: QWidget | None = None) -> None:
        # While older messages appear above, the message the reader was looking at stays put.
        self._anchor: tuple[MessageWidget, int] | None = None
        self._adjusting = False
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
        self._messages: list[Message] = []
        self.first = 0  # index of the first message that has a widget
        self.widgets: list[MessageWidget] = []  # for messages[first:]
        self._stick = True
        # Sets a new widget's buttons and ‹ n/m › (the tab knows the tree); built lazily, widgets
        # of older messages get theirs as they appear.
        self.decorate: Callable[[MessageWidget], None] | None = None
        self._more = QTimer(self, singleShot=True, interval=0, timeout=self._build_more)
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)

    # --- the messages -------------------------------------------------------------------------

    def set_messages(self, messages: list[Message]) -> None:
        """Show a conversation: widgets for its last few messages now, older ones on demand."""
        self.remove_from(0)
        self._messages, self.first = messages, len(messages)
        self._prepend(FIRST_BATCH)
        self.scroll_to_end()
        self._more.start()

    def add(self, message: Message) -> MessageWidget:
        """A widget for `message`, the conversation's newest (already appended to it)."""
        widget = self._make(message)
        self._list.insertWidget(self._list.count() - 1, widget)
        self.widgets.append(widget)
        self._empty.hide()
        return widget

    def remove_from(self, index: int) -> None:
        """Drop the widgets of messages[index:] (regenerate and resend rewrite the tail)."""
        cut = max(0, index - self.first)
        if self._anchor is not None and self._anchor[0] in self.widgets[cut:]:
            self._set_anchor(None)
        for w in self.widgets[cut:]:
            w.deleteLater()
        del self.widgets[cut:]
        self.first = min(self.first, index)
        self._empty.setVisible(not self.widgets and self.first == 0)

    def widget_for(self, index: int) -> MessageWidget | None:
        """The widget of messages[index], if it has been built."""
        i = index - self.first
        return self.widgets[i] if 0 <= i < len(self.widgets) else None

    def reveal(self, index: int) -> MessageWidget | None:
        """Build the widgets back to messages[index] if they are not yet, and scroll to it."""
        if index < self.first:
            self._prepend(self.first - index)
        widget = self.widget_for(index)
        if widget is not None:
            # Held near the top as the column lays out, until the reader scrolls.
            self._stick = False
            self._set_anchor(widget)
            self._anchor = (widget, _STICK_PX)
            self._keep_anchor()
        return widget

    @property
    def filling(self) -> bool:
        """Older messages are still being built to fill the column."""
        return self._more.isActive()

    def scroll_to_end(self) -> None:
        self._stick = True
        self._follow()

    # --- internals ----------------------------------------------------------------------------

    def _make(self, message: Message) -> MessageWidget:
        widget = MessageWidget(message)
        widget.edit_requested.connect(lambda: self.edit_requested.emit(widget.message))
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.fork_requested.connect(lambda: self.fork_requested.emit(widget.message))
        widget.continue_requested.connect(lambda: self.continue_requested.emit(widget.message))
        widget.branch.step.connect(lambda step: self.branch_requested.emit(widget.message, step))
        if self.decorate is not None:
            self.decorate(widget)
        return widget

    def _prepend(self, count: int) -> None:
        start = max(0, self.first - count)
        if start == self.first:
            return
        if not self._stick and self.widgets and self._anchor is None:
            self._set_anchor(self.widgets[0])
        made = [self._make(m) for m in self._messages[start:self.first]]
        for i, widget in enumerate(made):
            self._list.insertWidget(1 + i, widget)  # after the (hidden) empty hint
        self.widgets[:0] = made
        self.first = start
        self._empty.setVisible(not self.widgets)

    def _build_more(self) -> None:
        """Older messages while the reader is near the top, or while the column is not yet full."""
        if self.first == 0 or not self.isVisible():
            return
        bar = self.verticalScrollBar()
        if bar.maximum() == 0 or bar.value() < self.viewport().height():
            self._prepend(BATCH)
            self._more.start()  # again after this batch is laid out, if still needed

    def _scrolled(self, value: int) -> None:
        bar = self.verticalScrollBar()
        self._stick = value >= bar.maximum() - _STICK_PX
        if not self._adjusting:
            self._set_anchor(None)  # the reader moved: their new place is the one to keep
        if self.first and value < self.viewport().height():
            self._more.start()

    def _range_changed(self) -> None:
        self._keep_anchor()
        self._follow()

    def _set_anchor(self, widget: MessageWidget | None) -> None:
        if self._anchor is not None:
            self._anchor[0].removeEventFilter(self)
        self._anchor = None
        if widget is not None:
            self._anchor = (widget, self._y(widget) - self.verticalScrollBar().value())
            widget.installEventFilter(self)  # it moves down as older messages appear above it

    def _keep_anchor(self) -> None:
        if self._anchor is not None:
            widget, offset = self._anchor
            self._set_value(self._y(widget) - offset)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if self._anchor is not None and obj is self._anchor[0] and event.type() == QEvent.Type.Move:
            self._keep_anchor()
        return super().eventFilter(obj, event)

    def _follow(self) -> None:
        if self._stick:
            self._set_value(self.verticalScrollBar().maximum())

    def _set_value(self, value: int) -> None:
        self._adjusting = True
        try:
            self.verticalScrollBar().setValue(value)
        finally:
            self._adjusting = False

    def _y(self, widget: QWidget) -> int:
        return widget.mapTo(self.widget(), QPoint(0, 0)).y()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self._more.start()  # a tab restored in the background fills its column once it is shown
