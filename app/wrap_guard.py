"""Keeps a wrapping text widget fast on very long words.

Qt's word-boundary wrapping looks for a break through the whole rest of a word for every line it
fills, so a word of n characters costs about n² to lay out (a 256 KB one-word prompt: seconds).
A widget whose text holds a run of LONG_RUN characters without a space wraps anywhere instead.
The guard decides on QTextDocument.contentsChange, which Qt sends before it lays the change out,
and looks only around the change, so a streaming insert costs what it adds.
"""
from __future__ import annotations

import re

from PySide6.QtCore import QObject
from PySide6.QtGui import QTextCursor, QTextOption
from PySide6.QtWidgets import QPlainTextEdit, QTextEdit

LONG_RUN = 1000  # characters without a space; far wider than any line, still fast word-wrapped
WORDS = QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere
ANYWHERE = QTextOption.WrapMode.WrapAnywhere
_RUN = re.compile(r"\S{%d}" % LONG_RUN)


def has_long_run(text: str) -> bool:
    """Whether `text` holds LONG_RUN characters in a row without whitespace."""
    return _RUN.search(text) is not None


class WrapGuard(QObject):
    """Wraps `widget` at word boundaries until its text holds a long run, then anywhere; back to
    word boundaries once the long runs are gone."""

    def __init__(self, widget: QTextEdit | QPlainTextEdit) -> None:
        super().__init__(widget)
        self._widget = widget
        self._doc = widget.document()
        self._doc.contentsChange.connect(self._changed)
        self._set(has_long_run(self._doc.toPlainText()))

    @property
    def anywhere(self) -> bool:
        return self._widget.wordWrapMode() == ANYWHERE

    def _changed(self, position: int, removed: int, added: int) -> None:
        if self.anywhere:
            if removed:  # the long run may be gone; only text that lost some is read whole
                self._set(has_long_run(self._doc.toPlainText()))
            return
        # A run made by this change (text added, or a space taken out between two words) lies
        # within LONG_RUN characters on either side of it.
        cursor = QTextCursor(self._doc)
        cursor.setPosition(max(0, position - LONG_RUN))
        cursor.setPosition(min(self._doc.characterCount() - 1, position + added + LONG_RUN),
                           QTextCursor.MoveMode.KeepAnchor)
        self._set(has_long_run(cursor.selectedText()))  # paragraph breaks read as U+2029

    def _set(self, anywhere: bool) -> None:
        mode = ANYWHERE if anywhere else WORDS
        if self._widget.wordWrapMode() != mode:
            self._widget.setWordWrapMode(mode)
