"""A reply's text: token ids in, the text a caller may show out, stop strings found as they form.

Text is held back while it could still become a stop string (up to the longest stop string less one
character) and while a token ends inside a UTF-8 character (the detokenizer's part). Each new piece
is searched only where a stop string could end in it, so a token costs the same at any length.
"""
from __future__ import annotations

from typing import Protocol


class Detokenizer(Protocol):
    """`Tokenizer.stream()`: ids in, text deltas out, the rest at the end."""

    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class TextStream:
    def __init__(self, detok: Detokenizer, stop: list[str]):
        self._detok = detok
        self._stops = [s for s in stop if s]
        self._hold = max((len(s) - 1 for s in self._stops), default=0)
        self.text = ""  # the reply so far, cut before a stop string once one appears
        self.stopped = False  # a stop string appeared: the reply is complete
        self._shown = 0  # characters of `text` already handed out

    def push(self, token_id: int) -> str:
        """Feed one generated token; the text that may be shown now (often empty)."""
        before = len(self.text)
        self.text += self._detok.push(token_id)
        start = max(0, before - self._hold)  # earlier starts were searched when their tail arrived
        found = [i for i in (self.text.find(s, start) for s in self._stops) if i >= 0]
        if found:
            self.text, self.stopped = self.text[:min(found)], True
        upto = max(self._shown, len(self.text) - (0 if self.stopped else self._hold))
        out, self._shown = self.text[self._shown:upto], upto
        return out

    def finish(self) -> str:
        """The reply ends: the text still held back (a stop-string prefix, a partial character)."""
        if not self.stopped:
            self.text += self._detok.flush()
        out, self._shown = self.text[self._shown:], len(self.text)
        return out
