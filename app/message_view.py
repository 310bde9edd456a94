"""One message on screen: role, meta line, actions, and a body of prose chunks and code blocks.

A reply streams into the same widgets it ends up in: whole paragraphs render as Markdown once they
close, the paragraph being written shows as plain text, code shows as code from its opening fence,
and each update inserts only the new characters (see text_view.py).
"""
from __future__ import annotations

from datetime import datetime
from typing import Callable

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QGraphicsOpacityEffect,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from . import theme
from .attachment_chips import ChipRow
from .branch_switch import BranchSwitch
from .code_highlight import highlight
from .conversation import Message
from .markdown import Block, BlockReader, split_blocks
from .text_view import TextView
from .thinking_view import ThinkingSection

LENGTH_NOTE = "Stopped at the reply length limit (max tokens): Continue writes more."


def _copy_button(text_source: Callable[[], str], tooltip: str) -> QToolButton:
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


class CodeBlock(QFrame):
    """A fenced code block: monospace, unwrapped (scrolls sideways), language and Copy on top."""

    def __init__(self, code: str, lang: str, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="codeBlock")
        self.code = ""
        self._coloured: str | None = None  # the code the colours were made for
        self._dark = False  # ... and whether for a dark background
        self.lang = lang
        header = QFrame(objectName="codeHeader")
        hl = QHBoxLayout(header)
        hl.setContentsMargins(10, 2, 4, 2)
        hl.addWidget(QLabel(lang or "code", objectName="lang"))
        hl.addStretch()
        hl.addWidget(_copy_button(lambda: self.code, "Copy this code"))
        self.view = TextView(wrap=False, font=theme.code_font())
        self.view.setViewportMargins(10, 8, 10, 8)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(header)
        layout.addWidget(self.view)
        self.sync(code)

    def sync(self, code: str) -> None:
        """Show `code`; while it streams, only the characters added since the last call are new."""
        self.code = code
        self.view.sync_tail(code)

    def finish(self) -> None:
        """The block has closed: colour its syntax (once)."""
        if self._coloured != self.code:
            self._coloured = self.code
            self._dark = theme.is_dark(self.palette())
            highlight(self.view.document(), self.code, self.lang, self._dark)

    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt override
        super().changeEvent(event)
        # Another theme: colours made for a light background do not read on a dark one.
        if (event.type() == QEvent.Type.PaletteChange and self._coloured is not None
                and self._dark != theme.is_dark(self.palette())):
            self.view.set_plain(self.code)
            self._coloured = None
            self.finish()


class MessageWidget(QFrame):
    edit_requested = Signal()
    regenerate_requested = Signal()
    fork_requested = Signal()
    continue_requested = Signal()

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
        self._fork = QToolButton(text="Fork", objectName="messageAction",
                                 toolTip="Continue the conversation up to here in a new tab")
        self._continue = QToolButton(text="Continue", objectName="messageAction",
                                     toolTip="Go on writing this reply where it stopped")
        self.branch = BranchSwitch()
        for b in (self._edit, self._regenerate, self._fork, self._continue):
            b.setCursor(Qt.CursorShape.PointingHandCursor)
            b.hide()
        self._edit.clicked.connect(self.edit_requested)
        self._regenerate.clicked.connect(self.regenerate_requested)
        self._fork.clicked.connect(self.fork_requested)
        self._continue.clicked.connect(self.continue_requested)
        header = QHBoxLayout()
        header.setSpacing(8)
        header.addWidget(self._role)
        # The meta line gives way (cut at the right) in a narrow window, so the buttons stay in view.
        self._meta.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        header.addWidget(self._meta, 1)
        header.addWidget(self.branch)
        header.addWidget(self._edit)
        header.addWidget(self._continue)
        header.addWidget(self._regenerate)
        header.addWidget(self._fork)
        self._copy = _copy_button(lambda: self.message.text, "Copy the whole message")
        header.addWidget(self._copy)
        self._status = QLabel(objectName="status", wordWrap=True)
        self._status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._status.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self._status.hide()
        self._body = QVBoxLayout()
        self._body.setSpacing(8)
        self._views: list[QWidget] = []  # one per block of the body, in order
        self._reader: BlockReader | None = None  # while a reply streams
        self._streamed = ""
        self._finished = 0  # blocks of the streaming reply whose views are final
        self.thinking: ThinkingSection | None = None  # a thinking model's block, above the answer
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 8, 14, 12)
        layout.setSpacing(4)
        layout.addLayout(header)
        self._layout = layout
        self.chips = ChipRow(removable=False)  # a user message's files
        self.chips.set_attachments(message.attachments)
        layout.addWidget(self.chips)
        layout.addLayout(self._body)
        layout.addWidget(self._status)  # under the text: why it stopped reads after what was said
        self.show_final()
        self.update_meta()

    @property
    def streaming(self) -> bool:
        return self._reader is not None

    # --- body --------------------------------------------------------------------------------

    def show_streaming(self) -> None:
        """Get ready for append(): the text arrives in pieces from here on."""
        self._clear_body()
        self._reader, self._streamed, self._finished = BlockReader(), "", 0
        self.set_status("")
        self._copy.setVisible(False)
        self._sync_stream()
        self.append(self.message.text)
        self.update_meta()

    def append_reasoning(self, text: str, tokens: int) -> None:
        """New characters of the reply's thinking block (shown in its section, closed unless opened)."""
        if self._reader is None or not text:
            return
        self._thinking_section().append(text, tokens)
        self.thinking.set_live(True)

    def _thinking_section(self) -> ThinkingSection:
        if self.thinking is None:
            self.thinking = ThinkingSection()
            self._layout.insertWidget(1, self.thinking)  # under the header, above the answer
        return self.thinking

    def append(self, text: str) -> None:
        """New characters of a streaming reply; costs what they add, not what came before."""
        if self._reader is None or not text:
            return
        if self.thinking is not None and self.thinking.live:
            self.thinking.set_live(False)  # the answer has begun
        self._streamed += text
        self._reader.feed(text)
        self._sync_stream()
        self._copy.setVisible(True)

    def show_final(self) -> None:
        """The finished message. A reply that streamed here keeps its widgets."""
        reader, self._reader = self._reader, None
        if reader is not None and self._streamed == self.message.text:
            reader.finish()
            self._sync_blocks(reader.blocks, self._finished)
        else:
            self._clear_body()
            if self.message.role == "user":
                view = TextView()
                view.set_plain(self.message.text)
                self._add_view(view)
            else:
                self._sync_blocks(split_blocks(self.message.text))
        for view in self._views:
            _text_view(view).set_live(False)
        self._show_thinking()
        m = self.message
        self.set_status(m.error or (LENGTH_NOTE if m.finish_reason == "length" else ""), error=bool(m.error))
        self._copy.setVisible(bool(self.message.text))
        self.update_meta()

    def _sync_stream(self) -> None:
        reader = self._reader
        assert reader is not None
        self._sync_blocks(reader.blocks, self._finished)
        open_at = self._finished = len(reader.blocks)
        if reader.in_code:
            code, lang = reader.open_code()
            view = self._open_view(open_at, CodeBlock, lang)
            view.sync(code)
        else:
            view = self._open_view(open_at, TextView)
            view.show_prose(*reader.open_prose())
        for i, other in enumerate(self._views):
            _text_view(other).set_live(i == open_at)

    def _sync_blocks(self, blocks: list[Block], start: int = 0) -> None:
        """Views for blocks[start:] (those before are final): the view that was open becomes its
        finished block, new ones are made, and once streaming is over an open view that nothing
        became is dropped."""
        for i in range(start, len(blocks)):
            block = blocks[i]
            kind = CodeBlock if block.kind == "code" else TextView
            view = self._views[i] if i < len(self._views) else None
            if view is not None and (type(view) is not kind or getattr(view, "lang", "") != block.lang):
                self._drop_views_from(i)
                view = None
            if view is None:
                view = self._add_view(CodeBlock(block.text, block.lang) if kind is CodeBlock else TextView())
            if isinstance(view, CodeBlock):
                view.sync(block.text)
                view.finish()
            else:
                view.set_markdown(block.text)
        if self._reader is None:
            self._drop_views_from(len(blocks))

    def _open_view(self, index: int, kind: type, lang: str = "") -> QWidget:
        view = self._views[index] if index < len(self._views) else None
        if view is not None and (type(view) is not kind or getattr(view, "lang", "") != lang):
            self._drop_views_from(index)
            view = None
        if view is None:
            view = self._add_view(CodeBlock("", lang) if kind is CodeBlock else TextView())
        return view

    def _add_view(self, view: QWidget) -> QWidget:
        self._body.addWidget(view)
        self._views.append(view)
        return view

    def _drop_views_from(self, index: int) -> None:
        for view in self._views[index:]:
            self._body.removeWidget(view)
            view.deleteLater()
        del self._views[index:]

    def _clear_body(self) -> None:
        self._reader = None
        self._drop_views_from(0)

    def text_views(self) -> list[TextView]:
        """The body's text views, in order (a code block's own view for code)."""
        return [_text_view(v) for v in self._views]

    def _show_thinking(self) -> None:
        m = self.message
        if m.reasoning:
            self._thinking_section().set_final(m.reasoning, m.reasoning_tokens)
        elif self.thinking is not None:
            self._layout.removeWidget(self.thinking)
            self.thinking.deleteLater()
            self.thinking = None

    def body_text(self) -> str:
        """What the body shows, as plain text (code blocks without their header)."""
        return "\n".join(_text_view(v).text() for v in self._views)

    # --- header and status -------------------------------------------------------------------

    def set_status(self, text: str, error: bool = False) -> None:
        """A line under the body: 'Waiting for a free stream', or an error in this reply."""
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
            if m.accepted and not self.streaming:
                parts.append(f"{m.accepted:.2f} accepted per draft window")
            if m.ttft is not None:
                parts.append(f"first token {m.ttft:.2f} s")
            if m.left_out:
                parts.append(f"{m.left_out} earlier message{'s' if m.left_out != 1 else ''} left out to fit")
            # A reply in progress is marked interrupted on disk (so a crash says so), not on screen.
            if m.interrupted and not m.error and not self.streaming:
                parts.append("interrupted")
        self._meta.setText("  ·  ".join(p for p in parts if p))

    def set_actions(self, edit: bool = False, regenerate: bool = False, fork: bool = False,
                    go_on: bool = False) -> None:
        """Which buttons show; `go_on`: Continue, for a reply cut short."""
        self._edit.setVisible(edit)
        self._continue.setVisible(go_on)
        self._regenerate.setVisible(regenerate)
        self._fork.setVisible(fork)
        self._regenerate.setText("Retry" if self.message.error else "Regenerate")
        self._regenerate.setToolTip("Try this reply again (Ctrl+R)" if self.message.error
                                    else "Write this reply again (Ctrl+R)")

    def set_dimmed(self, dimmed: bool) -> None:
        """Shown faded while an edit would replace it (it stays until the edit is sent)."""
        effect = self.graphicsEffect()
        if dimmed and effect is None:
            effect = QGraphicsOpacityEffect(self)
            effect.setOpacity(0.45)
            self.setGraphicsEffect(effect)
        elif not dimmed and effect is not None:
            self.setGraphicsEffect(None)


def _text_view(view: QWidget) -> TextView:
    return view.view if isinstance(view, CodeBlock) else view


def _clock(iso: str) -> str:
    """'14:05' for today, '3 Mar 14:05' otherwise, in local time."""
    try:
        t = datetime.fromisoformat(iso).astimezone()
    except ValueError:
        return ""
    now = datetime.now().astimezone()
    return f"{t:%H:%M}" if t.date() == now.date() else f"{t.day} {t:%b %H:%M}"
