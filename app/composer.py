"""Where the user writes: Enter sends, Shift+Enter breaks the line; the button is Send
while idle and Stop while this tab generates. The box grows with its text, wrapped line by
wrapped line, up to a few lines, then scrolls. While the last message is being edited, a line
above the box says so, with Cancel (Esc). Files attached to the message show as chips above the
box (Attach, or dropped or pasted into it); a file that cannot be attached says why there."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from . import theme
from .attachment_chips import ChipRow
from .attachments import Attachment, AttachmentError, read
from .chat_view import centered
from .model_menu import dropped_model
from .wrap_guard import WrapGuard

MAX_LINES = 8


def dropped_files(mime: QMimeData) -> list[Path]:
    """Local files dropped or pasted, unless they are a model (the window opens one of those)."""
    if not mime.hasUrls() or dropped_model(mime) is not None:
        return []
    return [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]


class _Edit(QTextEdit):
    submit = Signal()
    files_dropped = Signal(list)  # [Path]

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 - Qt override
        return bool(dropped_files(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 - Qt override
        files = dropped_files(source)
        if files:
            self.files_dropped.emit(files)
        else:
            super().insertFromMimeData(source)

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

        self.attachments: list[Attachment] = []  # of the message being written
        # Reads a file to attach, or raises AttachmentError saying why not (the tab knows the room left).
        self.read_file: Callable[[Path], Attachment] = lambda path: read(path, None, lambda text: None)
        self.chips = ChipRow(removable=True)
        self.chips.removed.connect(self._remove_attachment)
        self.problem = QLabel(objectName="error", wordWrap=True)
        self.problem.hide()
        self.attach_button = QToolButton(text="Attach", objectName="messageAction",
                                         toolTip="Attach a text or code file to the message (or drop one here)")
        self.attach_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.attach_button.clicked.connect(self.pick_files)
        self.edit.files_dropped.connect(self.attach_files)

        self.box = QFrame(objectName="composer")
        row = QHBoxLayout(self.box)
        row.setContentsMargins(4, 6, 6, 6)
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.edit, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self.stop_button, 0, Qt.AlignmentFlag.AlignBottom)
        column = QWidget()
        cl = QVBoxLayout(column)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.setSpacing(0)
        cl.addWidget(self.edit_bar)
        cl.addWidget(self.problem)
        cl.addWidget(self.chips)
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

    def set_attachments(self, files: list[Attachment]) -> None:
        self.attachments = list(files)
        self.chips.set_attachments(self.attachments)

    def add_attachment(self, attachment: Attachment) -> None:
        self.set_attachments(self.attachments + [attachment])

    def attach_files(self, paths: list[Path]) -> list[str]:
        """Attach files to the message; why any was refused (shown above the box too)."""
        problems = []
        for path in paths:
            try:
                self.add_attachment(self.read_file(Path(path)))
            except AttachmentError as e:
                problems.append(f"Not attached: {e}.")
        self.show_problem("\n".join(problems))
        self.edit.setFocus()
        return problems

    def pick_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach text or code files", str(Path.home()))
        if paths:
            self.attach_files([Path(p) for p in paths])

    def _remove_attachment(self, index: int) -> None:
        self.set_attachments(self.attachments[:index] + self.attachments[index + 1:])
        self.edit.setFocus()

    def show_problem(self, text: str) -> None:
        """Why a file could not be attached, above the box until the next attach or send."""
        self.problem.setText(text)
        self.problem.setVisible(bool(text))

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
        if self._generating or not (text.strip() or self.attachments):
            return
        self.edit.clear()
        self.show_problem("")
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
