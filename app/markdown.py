"""A finished reply's Markdown: fenced code blocks cut out (they get their own widget with a copy
button), the prose between them turned into HTML by Qt's own Markdown reader (md4c)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtGui import QTextDocument

_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$")


@dataclass(frozen=True)
class Block:
    kind: str  # "text" | "code"
    text: str
    lang: str = ""


def split_blocks(markdown: str) -> list[Block]:
    """Prose and fenced code, in order. An unclosed fence runs to the end (as CommonMark says)."""
    blocks: list[Block] = []
    prose: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3)
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        code: list[str] = []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            code.append(_dedent(lines[i], indent))
            i += 1
        i += 1  # the closing fence
        _add_prose(blocks, prose)
        prose = []
        blocks.append(Block("code", "\n".join(code), lang))
    _add_prose(blocks, prose)
    return blocks


def prose_html(markdown: str) -> str:
    """HTML for a QLabel. Raw HTML in model output is shown as text, never interpreted."""
    doc = QTextDocument()
    doc.setMarkdown(markdown, QTextDocument.MarkdownFeature.MarkdownDialectGitHub
                    | QTextDocument.MarkdownFeature.MarkdownNoHTML)
    return doc.toHtml()


def _add_prose(blocks: list[Block], lines: list[str]) -> None:
    text = "\n".join(lines).strip("\n")
    if text.strip():
        blocks.append(Block("text", text))


def _dedent(line: str, indent: int) -> str:
    # Content lines lose as many leading spaces as the opening fence had (CommonMark).
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(indent, stripped):]
