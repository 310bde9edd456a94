"""Where the user writes: Enter sends, Shift+Enter breaks the line; the button is Send
while idle and Stop while this tab generates. The box grows with its text, wrapped line by
wrapped line, up to a few lines, then scrolls. While the last message is being edited, a line
above the box says so, with Cancel (Esc)."""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QTextEdit, QToolButton, QVBoxLayout, QWidget

from . import theme
from .chat_view import centered
from .wrap_guard import WrapGuard

MAX_LINES = 8


class _Edit(QTextEdit):
    submit = Signal()

    def event(self, event: QEvent) -> bool:
        # Ctrl+K is the window's search here, not the text edit's "delete to the end of the line".
        if event.type() == QEvent.Type.ShortcutOverride and event.matches(QKeySequence.StandardKey.DeleteEndOfLine):
            event.ignore()
            return True
        return super().event(event)

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
    edit_cancelled = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="composerBar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.edit = _Edit(placeholderText="Message the model…  (Enter sends, Shift+Enter new line)")
        self.edit.setAcceptRichText(False)
        WrapGuard(self.edit)
        self.edit.setTabChangesFocus(True)
        # No stylesheet on the editor itself: one would make Qt draw its scroll bar unstyled
        # (a black handle). A frameless editor on a transparent viewport shows the box behind it.
        self.edit.setFrameShape(QFrame.Shape.NoFrame)
        self.edit.viewport().setAutoFillBackground(False)
        self.edit.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # until it is full
        self.send_button = QPushButton("Send", objectName="primary", toolTip="Send (Enter)")
        self.stop_button = QPushButton("Stop", objectName="stop", toolTip="Stop this reply (Esc)")
        self.stop_button.hide()
        for b in (self.send_button, self.stop_button):
            b.setCursor(Qt.CursorShape.PointingHandCursor)

        self.edit_note = QLabel("Editing your last message: sending it replaces that message and its reply.",
                                objectName="meta", wordWrap=True)
        self.cancel_edit_button = QToolButton(text="Cancel", objectName="messageAction",
                                              toolTip="Keep the message as it was (Esc)")
        self.cancel_edit_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.cancel_edit_button.clicked.connect(self.edit_cancelled)
        self.edit_bar = QWidget()
        el = QHBoxLayout(self.edit_bar)
        el.setContentsMargins(4, 0, 0, 4)
        el.addWidget(self.edit_note, 1)
        el.addWidget(self.cancel_edit_button)
        self.edit_bar.hide()

        self.box = QFrame(objectName="composer")
        row = QHBoxLayout(self.box)
        row.setContentsMargins(10, 6, 6, 6)
        row.addWidget(self.edit, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignBottom)
        column = QWidget()
        cl = QVBoxLayout(column)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        cl.addWidget(self.edit_bar)
        cl.addWidget(self.box)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 8, 0, 12)
        outer.addWidget(centered(column))
        self.edit.submit.connect(self._send)
        self.send_button.clicked.connect(self._send)
        self.stop_button.clicked.connect(self.stop_requested)
        self.edit.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self.edit.installEventFilter(self)  # the box shows where the keyboard is
        self._generating = False
        self._fit_height()

    def text(self) -> str:
        return self.edit.toPlainText()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)
        self.edit.moveCursor(self.edit.textCursor().MoveOperation.End)

    def set_generating(self, generating: bool) -> None:
        self._generating = generating
        with self._focus_kept():
            self.send_button.setVisible(not generating)
            self.stop_button.setVisible(generating)

    def start_edit(self, text: str) -> None:
        """The box holds the message being edited; the line above it says so."""
        self.edit_bar.show()
        self.set_text(text)

    def end_edit(self, draft: str) -> None:
        """Back to writing a new message: the draft from before the edit returns."""
        with self._focus_kept():
            self.edit_bar.hide()
        self.set_text(draft)

    @contextmanager
    def _focus_kept(self) -> Iterator[None]:
        # A button that hides with the keyboard in it hands the focus to the message box, not to
        # whatever widget Qt finds next (a Copy button somewhere in the conversation).
        buttons = (self.send_button, self.stop_button, self.cancel_edit_button)
        had = self.window().focusWidget()
        yield
        if had in buttons and not had.isVisible():
            self.edit.setFocus()

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if obj is self.edit and event.type() in (QEvent.Type.FocusIn, QEvent.Type.FocusOut):
            theme.restyle(self.box, "composerFocused" if event.type() == QEvent.Type.FocusIn else "composer")
        return super().eventFilter(obj, event)

    def _send(self) -> None:
        # While this tab generates, Enter keeps the draft: one reply at a time per conversation.
        text = self.text()
        if self._generating or not text.strip():
            return
        self.edit.clear()
        self.send_requested.emit(text)

    def _fit_height(self) -> None:
        """As tall as the text's wrapped lines, up to MAX_LINES; beyond that it scrolls."""
        line_h = self.edit.fontMetrics().lineSpacing()
        doc = self.edit.document()
        margin = 2 * doc.documentMargin()
        wanted = max(line_h, math.ceil(doc.size().height() - margin))
        full = MAX_LINES * line_h
        self.edit.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded if wanted > full
                                             else Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        height = min(wanted, full) + int(margin) + 2 * self.edit.frameWidth()
        if height != self.edit.height() or self.edit.minimumHeight() != height:
            self.edit.setFixedHeight(height)
