"""Syntax colours for a finished code block (Pygments): applied once the block closes, so a
block still streaming stays plain and costs only its new characters."""
from __future__ import annotations

from functools import cache

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_by_name
from pygments.styles import get_style_by_name
from pygments.util import ClassNotFound
from PySide6.QtGui import QColor, QFont, QTextCharFormat, QTextCursor, QTextDocument

LIGHT_STYLE, DARK_STYLE = "default", "github-dark"


@cache
def _lexer(lang: str) -> Lexer | None:
    try:
        return get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


@cache
def _formats(style_name: str) -> dict:
    formats = {}
    for token, style in get_style_by_name(style_name):
        fmt = QTextCharFormat()
        if style["color"]:
            fmt.setForeground(QColor(f"#{style['color']}"))
        if style["bold"]:
            fmt.setFontWeight(QFont.Weight.Bold)
        if style["italic"]:
            fmt.setFontItalic(True)
        formats[token] = fmt
    return formats


def highlight(document: QTextDocument, code: str, lang: str, dark: bool) -> bool:
    """Colour `document`, which holds `code`, as language `lang`; False when the language is not
    one Pygments knows (the block stays plain)."""
    lexer = _lexer(lang.lower()) if lang else None
    if lexer is None:
        return False
    formats = _formats(DARK_STYLE if dark else LIGHT_STYLE)
    cursor = QTextCursor(document)
    cursor.beginEditBlock()
    end = document.characterCount() - 1
    at = 0  # in UTF-16 units, as the document counts
    for token, text in lexer.get_tokens(code):
        n = len(text.encode("utf-16-le")) // 2
        while token not in formats and token.parent is not None:
            token = token.parent
        fmt = formats.get(token)
        if fmt is not None and fmt.properties() and at < end:
            cursor.setPosition(at)
            cursor.setPosition(min(at + n, end), QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(fmt)
        at += n
    cursor.endEditBlock()
    return True
