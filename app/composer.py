"""Where the user writes: Enter sends, Shift+Enter breaks the line; the button is Send
while idle and Stop while this tab generates. The box grows with its text up to a few lines."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from .chat_view import centered

_MAX_LINES = 8


class _Edit(QPlainTextEdit):
    submit = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        plain_enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & (Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.AltModifier))
        if plain_enter:
            self.submit.emit()
        else:
            super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="composerBar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.edit = _Edit(placeholderText="Message the model…  (Enter sends, Shift+Enter new line)")
        self.edit.setTabChangesFocus(True)
        self.edit.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # until it is full
        self.send_button = QPushButton("Send", objectName="primary", toolTip="Send (Enter)")
        self.stop_button = QPushButton("Stop", objectName="stop", toolTip="Stop this reply (Esc)")
        self.stop_button.hide()
        for b in (self.send_button, self.stop_button):
            b.setCursor(Qt.CursorShape.PointingHandCursor)
        box = QFrame(objectName="composer")
        row = QHBoxLayout(box)
        row.setContentsMargins(10, 6, 6, 6)
        row.addWidget(self.edit, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignBottom)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 8, 0, 12)
        outer.addWidget(centered(box))
        self.edit.submit.connect(self._send)
        self.send_button.clicked.connect(self._send)
        self.stop_button.clicked.connect(self.stop_requested)
        self.edit.textChanged.connect(self._fit_height)
        self._generating = False
        self._fit_height()

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)
        self.edit.moveCursor(self.edit.textCursor().MoveOperation.End)

    def set_generating(self, generating: bool) -> None:
        self._generating = generating
        self.send_button.setVisible(not generating)
        self.stop_button.setVisible(generating)

    def _send(self) -> None:
        # While this tab generates, Enter keeps the draft: one reply at a time per conversation.
        text = self.text()
        if self._generating or not text.strip():
            return
        self.edit.clear()
        self.send_requested.emit(text)

    def _fit_height(self) -> None:
        wanted = int(self.edit.document().size().height())
        lines = max(1, min(_MAX_LINES, wanted))
        self.edit.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded if wanted > _MAX_LINES
                                             else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        line_h = self.edit.fontMetrics().lineSpacing()
        margins = self.edit.contentsMargins()
        self.edit.setFixedHeight(lines * line_h + 2 * int(self.edit.document().documentMargin())
                                 + margins.top() + margins.bottom())
