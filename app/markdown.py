"""A reply's Markdown, cut into the pieces the message view shows: prose chunks (rendered by Qt's
own Markdown reader, md4c) and fenced code blocks (their own widget with a copy button).

`BlockReader` reads text as it streams, line by line, so a growing reply costs only its new
characters; `split_blocks` is the same reader over a whole text, so a reply looks the same
streamed and reopened. A prose chunk holds whole paragraphs up to about CHUNK_CHARS characters:
re-rendering one when a paragraph closes costs a bounded amount, however long the reply grows.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from PySide6.QtGui import QTextDocument

CHUNK_CHARS = 1500
MARKDOWN = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML

_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^`\s]*)[^`]*$")
# Lines that start a block of their own (heading, quote, list item, table row, rule, fence,
# indented code): a line break next to one of these is Markdown structure, not a soft break.
_BLOCK_START = re.compile(r"^(?: {4}|\t| {0,3}(?:#{1,6}(?:\s|$)|>|[-+*](?:\s|$)|\d{1,9}[.)](?:\s|$)|`{3}|~{3}))")
_RULE_OR_UNDERLINE = re.compile(r"^ {0,3}[-=_*:| \t]+$")
LINE_SEPARATOR = "\u2028"  # a line break inside a paragraph (QTextLayout breaks the line there)


@dataclass(frozen=True)
class Block:
    kind: str  # "text" | "code"
    text: str
    lang: str = ""


class BlockReader:
    """Reads Markdown incrementally. `blocks` are complete; `open_prose()` / `open_code()`
    describe the block still being written."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._partial = ""  # the last line, not yet ended by a newline
        self._chunk: list[str] = []  # lines of whole paragraphs in the open prose chunk
        self._chunk_chars = 0
        self._para: list[str] = []  # lines of the paragraph being written
        self._fence: tuple[str, int, int, str] | None = None  # char, length, indent, language
        self._code: list[str] = []

    def feed(self, text: str) -> None:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines:
            self._line(line)

    def finish(self) -> list[Block]:
        """End of the text: an unclosed fence runs to the end (as CommonMark says)."""
        if self._partial:
            self._line(self._partial)
            self._partial = ""
        if self._fence is not None:
            self._close_code()
        else:
            self._close_chunk()
        return self.blocks

    @property
    def in_code(self) -> bool:
        return self._fence is not None

    def open_prose(self) -> tuple[str, str]:
        """The open prose chunk: (its whole paragraphs as Markdown, the paragraph being written)."""
        return "\n".join(self._chunk), "\n".join(self._para + ([self._partial] if self._partial else []))

    def open_code(self) -> tuple[str, str]:
        """The open code block: (its code so far, its language)."""
        assert self._fence is not None
        char, _length, indent, lang = self._fence
        # A partial line that may become the closing fence is not shown as code.
        closing = re.match(rf"^ {{0,3}}{re.escape(char)}+[ \t]*$", self._partial)
        code = self._code + ([_dedent(self._partial, indent)] if self._partial and not closing else [])
        return "\n".join(code), lang

    # --- lines ------------------------------------------------------------------------------

    def _line(self, line: str) -> None:
        if self._fence is not None:
            char, length, indent, _ = self._fence
            if re.match(rf"^ {{0,3}}{re.escape(char)}{{{length},}}[ \t]*$", line):
                self._close_code()
            else:
                self._code.append(_dedent(line, indent))
            return
        m = _FENCE.match(line)
        if m:
            self._close_chunk()
            self._fence = (m.group(2)[0], len(m.group(2)), len(m.group(1)), m.group(3))
        elif line.strip():
            self._para.append(line)
        elif self._para:
            self._end_paragraph()

    def _end_paragraph(self) -> None:
        if self._chunk:
            self._chunk.append("")
        self._chunk += self._para
        self._chunk_chars += sum(len(ln) + 1 for ln in self._para)
        self._para = []
        if self._chunk_chars >= CHUNK_CHARS:
            self._close_chunk()

    def _close_chunk(self) -> None:
        if self._para:
            self._end_paragraph()
        text = "\n".join(self._chunk).strip("\n")
        if text.strip():
            self.blocks.append(Block("text", text))
        self._chunk, self._chunk_chars = [], 0

    def _close_code(self) -> None:
        assert self._fence is not None
        self.blocks.append(Block("code", "\n".join(self._code), self._fence[3]))
        self._fence, self._code = None, []


def split_blocks(markdown: str) -> list[Block]:
    """Prose chunks and fenced code, in order."""
    reader = BlockReader()
    reader.feed(markdown)
    return reader.finish()


def closed(markdown: str) -> str:
    """`markdown` with a code fence left open (a reply cut at its max tokens) closed, so what
    follows it in a longer document is not read as code."""
    reader = BlockReader()
    reader.feed(markdown + "\n")
    if reader._fence is None:
        return markdown
    char, length, indent, _ = reader._fence
    return f"{markdown.rstrip()}\n{' ' * indent}{char * length}"


def keep_line_breaks(markdown: str) -> str:
    """Single newlines inside a paragraph stay line breaks, as in chat apps (a poem keeps its
    lines); CommonMark would join them into one line. Structure (lists, tables, headings) stays."""
    lines = markdown.split("\n")
    out = [lines[0]] if lines else []
    for prev, line in zip(lines, lines[1:]):
        if _soft_break(prev, line):
            out[-1] += LINE_SEPARATOR + line.lstrip()
        else:
            out.append(line)
    return "\n".join(out)


def _soft_break(prev: str, line: str) -> bool:
    if not prev.strip() or not line.strip() or "|" in prev or "|" in line:
        return False
    if prev.rstrip().endswith("\\") or prev.endswith("  "):
        return False  # already a hard break
    if _BLOCK_START.match(line) or _RULE_OR_UNDERLINE.match(line):
        return False
    return not re.match(r"^ {0,3}(?:#|`{3}|~{3})", prev)


def render(doc: QTextDocument, markdown: str) -> None:
    """Put rendered Markdown into `doc`. Raw HTML in model output is shown as text, never run."""
    doc.setMarkdown(keep_line_breaks(markdown), MARKDOWN)


def _dedent(line: str, indent: int) -> str:
    # Content lines lose as many leading spaces as the opening fence had (CommonMark).
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(indent, stripped):]
