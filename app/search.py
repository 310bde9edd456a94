"""Search across conversations: where a query appears (title or a message), a line around the
hit for the list, and the hit highlighted in a message's text views."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import QTextEdit

from .conversation import Conversation, Message

_AROUND = 24  # characters shown before a hit in the list


@dataclass(frozen=True)
class Hit:
    index: int | None  # the message that holds the query (the newest one); None: only the title does
    snippet: str  # the line the list shows under the title
    hidden: Message | None = None  # where only another branch holds it: the message there


def find(conv: Conversation, query: str) -> Hit | None:
    """Where `query` (any case) appears in `conv`, or None. Messages are searched newest first:
    those of the branch shown, then the other branches' (regenerated replies, edited messages)."""
    q = query.strip().casefold()
    if not q:
        return None
    for i in range(len(conv.messages) - 1, -1, -1):
        text = conv.messages[i].text
        at = text.casefold().find(q)
        if at >= 0:
            return Hit(i, snippet(text, at))
    for m in sorted(conv.branches, key=lambda m: m.id, reverse=True):
        at = m.text.casefold().find(q)
        if at >= 0:
            return Hit(None, snippet(m.text, at), m)
    return Hit(None, "in the title") if q in conv.title.casefold() else None


def snippet(text: str, at: int) -> str:
    """One line of `text` around position `at`."""
    start = max(0, at - _AROUND)
    line = " ".join(text[start:at + 80].split())
    return ("…" if start else "") + line


def highlight(views: list[QTextEdit], query: str, color: QColor) -> int:
    """Mark every occurrence of `query` in `views` (an empty query clears the marks); the count."""
    found = 0
    fmt = QTextCharFormat()
    fmt.setBackground(color)
    for view in views:
        marks = []
        cursor = QTextCursor(view.document())
        while query.strip():
            cursor = view.document().find(query.strip(), cursor, QTextDocument.FindFlag(0))
            if cursor.isNull():
                break
            mark = QTextEdit.ExtraSelection()
            mark.cursor, mark.format = cursor, fmt
            marks.append(mark)
        view.setExtraSelections(marks)
        found += len(marks)
    return found
