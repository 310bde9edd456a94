"""A read-only text view exactly as tall as its text, for message bodies and code.

It holds a QTextDocument, so a streaming reply grows by inserting its new characters at the end:
Qt then lays out only the last paragraph, where a label would re-lay out the whole reply on every
update. Prose shows rendered Markdown followed by the plain paragraph still being written.
"""
from __future__ import annotations

import math

from PySide6.QtCore import QSizeF, Qt, QUrl
from PySide6.QtGui import QDesktopServices, QFont, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextOption
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QWidget

from . import theme
from .markdown import render
from .wrap_guard import WrapGuard

LIVE_GLYPH = "▍"  # shows that a reply is still arriving
_LINK_SCHEMES = ("http", "https", "mailto")


class TextView(QTextBrowser):
    def __init__(self, wrap: bool = True, font: QFont | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff if wrap
                                          else Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        if wrap:
            WrapGuard(self)
        else:
            self.setLineWrapMode(QTextBrowser.LineWrapMode.NoWrap)
            self.setWordWrapMode(QTextOption.WrapMode.NoWrap)
        # Message text a step up the type scale; code in the font it is given.
        self.setFont(font if font is not None else theme.scaled(self.font(), theme.PROSE))
        self.document().setDefaultFont(self.font())
        self.viewport().setAutoFillBackground(False)  # the message's own background shows through
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        # Mouse selection and a click to focus, but no Tab stop per paragraph: the buttons are.
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setOpenLinks(False)
        self.anchorClicked.connect(_open_link)
        self.document().setDocumentMargin(0)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._done: str | None = None  # the Markdown rendered above the plain tail
        self._tail = ""  # plain text after it (prose being written, or all of a plain view)
        self._tail_at = 0  # document position where the tail starts
        self._tail_block = False  # a paragraph was added after the Markdown for the tail
        self._live = False
        self._fit(self.document().size())

    # --- content ----------------------------------------------------------------------------

    def set_plain(self, text: str) -> None:
        self._done, self._tail_block = None, False
        self._replace_tail_from(0, text)

    def set_markdown(self, markdown: str) -> None:
        self.show_prose(markdown, "")

    def show_prose(self, done: str, tail: str) -> None:
        """Rendered Markdown `done`, then `tail` as plain text. Unchanged Markdown is not
        rendered again, and a tail that grew by some characters only gets those inserted."""
        if done == self._done:
            self.sync_tail(tail)
            return
        live, self._live = self._live, False
        self._done = done
        render(self.document(), done)
        self._tail, self._tail_at, self._tail_block = "", self._end(), False
        self._insert_tail(tail)
        self.set_live(live)

    def sync_tail(self, text: str) -> None:
        """Make the plain tail read `text`, inserting only what was added when it grew."""
        if text.startswith(self._tail):
            self._insert_tail(text[len(self._tail):])
        else:
            self._replace_tail_from(self._tail_at, text)

    def set_live(self, live: bool) -> None:
        """Show or hide the glyph that says more text is coming."""
        if live == self._live:
            return
        cursor = self._cursor_at_end()
        if live:
            self._open_tail_block()
            self._cursor_at_end().insertText(LIVE_GLYPH, QTextCharFormat())
        else:
            cursor.deletePreviousChar()
        self._live = live
        self._close_empty_tail_block()

    def text(self) -> str:
        """What the view shows, as plain text."""
        return self.document().toPlainText()

    # --- internals --------------------------------------------------------------------------

    def _replace_tail_from(self, position: int, text: str) -> None:
        live, self._live = self._live, False
        cursor = QTextCursor(self.document())
        cursor.setPosition(position)
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        self._tail, self._tail_at = "", position
        self._insert_tail(text)
        self.set_live(live)
        self._close_empty_tail_block()

    def _insert_tail(self, text: str) -> None:
        if not text:
            return
        self._open_tail_block()
        cursor = self._cursor_at_end()
        if self._live:
            cursor.movePosition(QTextCursor.MoveOperation.Left)
        cursor.insertText(text, QTextCharFormat())
        self._tail += text

    def _open_tail_block(self) -> None:
        # Plain text after rendered Markdown is a paragraph of its own, without the formats of the
        # block above it (a list item, a heading).
        if self._done and not self._tail_block:
            self._cursor_at_end().insertBlock(QTextBlockFormat(), QTextCharFormat())
            self._tail_block, self._tail_at = True, self._end()

    def _close_empty_tail_block(self) -> None:
        if self._tail_block and not self._tail and not self._live:
            self._cursor_at_end().deletePreviousChar()
            self._tail_block, self._tail_at = False, self._end()

    def _cursor_at_end(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor

    def _end(self) -> int:
        return self.document().characterCount() - 1

    def _fit(self, size: QSizeF) -> None:
        margins = self.viewportMargins()
        height = math.ceil(size.height()) + 2 * self.frameWidth() + margins.top() + margins.bottom()
        bar = self.horizontalScrollBar()
        if self.lineWrapMode() == QTextBrowser.LineWrapMode.NoWrap and size.width() > self.viewport().width():
            height += bar.sizeHint().height()
        if height != self.height() or self.minimumHeight() != height:
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit(self.document().size())  # a code view may need its scroll bar now, or not


def _open_link(url: QUrl) -> None:
    if url.scheme() in _LINK_SCHEMES:
        QDesktopServices.openUrl(url)
