"""One message on screen: role, meta line, actions, and a body that is plain text while a reply
streams (cheap to update 30 times a second) and Markdown with code blocks once it is complete."""
from __future__ import annotations

from datetime import datetime

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from . import theme
from .conversation import Message
from .markdown import prose_html, split_blocks

_SELECTABLE = Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.TextSelectableByKeyboard
_CURSOR = "▍"  # shows a reply is still arriving


def _copy_button(text_source, tooltip: str) -> QToolButton:
    """A 'Copy' button that says 'Copied' for a moment, so the click visibly did something."""
    button = QToolButton(text="Copy", toolTip=tooltip, objectName="messageAction")
    button.setCursor(Qt.CursorShape.PointingHandCursor)

    # A child timer dies with the button, so a reset can never reach a deleted one.
    reset = QTimer(button, singleShot=True, interval=1200)
    reset.timeout.connect(lambda: button.setText("Copy"))

    def copy() -> None:
        QGuiApplication.clipboard().setText(text_source())
        button.setText("Copied")
        reset.start()

    button.clicked.connect(copy)
    return button


def _label(text: str = "", fmt: Qt.TextFormat = Qt.TextFormat.PlainText, name: str = "") -> QLabel:
    label = QLabel(text, textFormat=fmt, wordWrap=True, objectName=name)
    label.setTextInteractionFlags(_SELECTABLE | Qt.TextInteractionFlag.LinksAccessibleByMouse)
    label.setOpenExternalLinks(True)
    label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    return label


class CodeBlock(QFrame):
    """A fenced code block: monospace, unwrapped (scrolls sideways), language and Copy on top."""

    def __init__(self, code: str, lang: str, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="codeBlock")
        self.code = code
        header = QFrame(objectName="codeHeader")
        hl = QHBoxLayout(header)
        hl.setContentsMargins(10, 2, 4, 2)
        hl.addWidget(QLabel(lang or "code", objectName="lang"))
        hl.addStretch()
        hl.addWidget(_copy_button(lambda: self.code, "Copy this code"))
        body = QLabel(code, textFormat=Qt.TextFormat.PlainText, font=theme.code_font())
        body.setTextInteractionFlags(_SELECTABLE)
        body.setContentsMargins(10, 8, 10, 8)
        self._scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self._scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._scroll.setWidget(body)
        self._scroll.setStyleSheet("background: transparent;")
        self._body = body
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(header)
        layout.addWidget(self._scroll)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        # Show every line: the block is as tall as its text plus a scroll bar when lines overflow.
        bar = self._scroll.horizontalScrollBar()
        extra = bar.sizeHint().height() if self._body.sizeHint().width() > self._scroll.viewport().width() else 0
        self._scroll.setFixedHeight(self._body.sizeHint().height() + extra)
        super().resizeEvent(event)


class MessageWidget(QFrame):
    edit_requested = Signal()
    regenerate_requested = Signal()

    def __init__(self, message: Message, parent: QWidget | None = None) -> None:
        user = message.role == "user"
        super().__init__(parent, objectName="userMessage" if user else "assistantMessage")
        self.message = message
        self._role = QLabel("You" if user else "Assistant", objectName="role")
        self._meta = QLabel(objectName="meta")
        self._edit = QToolButton(text="Edit", objectName="messageAction",
                                 toolTip="Edit this message and send it again (Ctrl+E)")
        self._regenerate = QToolButton(text="Regenerate", objectName="messageAction",
                                       toolTip="Write this reply again (Ctrl+R)")
        for b in (self._edit, self._regenerate):
            b.setCursor(Qt.CursorShape.PointingHandCursor)
            b.hide()
        self._edit.clicked.connect(self.edit_requested)
        self._regenerate.clicked.connect(self.regenerate_requested)
        header = QHBoxLayout()
        header.setSpacing(8)
        header.addWidget(self._role)
        header.addWidget(self._meta)
        header.addStretch()
        header.addWidget(self._edit)
        header.addWidget(self._regenerate)
        self._copy = _copy_button(lambda: self.message.text, "Copy the whole message")
        header.addWidget(self._copy)
        self._status = _label(name="status")
        self._status.hide()
        self._body = QVBoxLayout()
        self._body.setSpacing(8)
        self._stream_label: QLabel | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 14, 12)
        layout.setSpacing(4)
        layout.addLayout(header)
        layout.addLayout(self._body)
        layout.addWidget(self._status)  # under the text: why it stopped reads after what was said
        self.show_final()
        self.update_meta()

    # --- body --------------------------------------------------------------------------------

    def show_streaming(self) -> None:
        """Plain text with a cursor; set_text() then only changes one label."""
        self._clear_body()
        self._copy.setVisible(bool(self.message.text))
        self._stream_label = _label(self.message.text + _CURSOR)
        self._body.addWidget(self._stream_label)

    def set_text(self, text: str) -> None:
        if self._stream_label is not None:
            self._stream_label.setText(text + _CURSOR)
            self._copy.setVisible(bool(text))

    def show_final(self) -> None:
        self._clear_body()
        self.set_status(self.message.error or "", error=bool(self.message.error))
        self._copy.setVisible(bool(self.message.text))
        if self.message.role == "user":
            self._body.addWidget(_label(self.message.text))
            return
        for block in split_blocks(self.message.text):
            if block.kind == "code":
                self._body.addWidget(CodeBlock(block.text, block.lang))
            else:
                self._body.addWidget(_label(prose_html(block.text), Qt.TextFormat.RichText))

    def _clear_body(self) -> None:
        self._stream_label = None
        while (item := self._body.takeAt(0)) is not None:
            if item.widget() is not None:
                item.widget().deleteLater()

    # --- header and status -------------------------------------------------------------------

    def set_status(self, text: str, error: bool = False) -> None:
        """A line under the header: 'Waiting for a free stream', or an error in this reply."""
        theme.restyle(self._status, "error" if error else "status")
        self._status.setText(text)
        self._status.setVisible(bool(text))

    def update_meta(self, live_tps: float | None = None) -> None:
        m = self.message
        parts = [_clock(m.time)]
        if m.role == "assistant":
            if m.tokens:
                parts.append(f"{m.tokens} token{'s' if m.tokens != 1 else ''}")
            tps = live_tps if live_tps is not None else m.tok_s
            if tps:
                parts.append(f"{tps:.1f} tok/s")
            if m.interrupted and not m.error and live_tps is None:
                parts.append("interrupted")
        self._meta.setText("  ·  ".join(p for p in parts if p))

    def set_actions(self, edit: bool = False, regenerate: bool = False) -> None:
        self._edit.setVisible(edit)
        self._regenerate.setVisible(regenerate)
        self._regenerate.setText("Retry" if self.message.error else "Regenerate")


def _clock(iso: str) -> str:
    """'14:05' for today, '3 Mar 14:05' otherwise, in local time."""
    try:
        t = datetime.fromisoformat(iso).astimezone()
    except ValueError:
        return ""
    now = datetime.now().astimezone()
    return f"{t:%H:%M}" if t.date() == now.date() else f"{t.day} {t:%b %H:%M}"
