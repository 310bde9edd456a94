"""Files as context: a UTF-8 text or code file attached to a message, checked before it is taken
(a file, not binary, UTF-8, small enough for what the context has left), and how it reads in the
message the engine gets: a fenced block under its name, before the user's words.

The file's text is kept in the message (and so in the conversation file): the conversation reads
the same later, whatever became of the file on disk.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MAX_BYTES = 8 << 20  # more than any context takes: refused before it is read
MAX_NAME = 255
CHARS_PER_TOKEN = 3  # an estimate on the safe side, where no tokenizer can count (a remote engine)
MOST_CHARS_PER_TOKEN = 32  # text this much longer than the room cannot fit: refused before counting


class AttachmentError(ValueError):
    """A file that cannot go into the message; the text says which and why."""


@dataclass
class Attachment:
    name: str
    text: str
    tokens: int | None = None  # as the engine's tokenizer counted them; None where none could

    @classmethod
    def from_dict(cls, raw: Any) -> "Attachment | None":
        """An attachment from its JSON form; None for anything that is not one (it is dropped)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("text"), str):
            return None
        tokens = raw.get("tokens")
        ok = isinstance(tokens, int) and not isinstance(tokens, bool) and 0 <= tokens < 1 << 53
        return cls(raw["name"][:MAX_NAME], raw["text"], tokens if ok else None)

    @property
    def size(self) -> str:
        """How big it is, for its chip: lines and tokens (or characters)."""
        lines = self.text.count("\n") + (not self.text.endswith("\n"))
        amount = f"{self.tokens:,} tokens" if self.tokens is not None else f"{len(self.text):,} characters"
        return f"{lines:,} line{'s' if lines != 1 else ''} · {amount}"


def read(path: Path, room: int | None, count: Callable[[str], int | None]) -> Attachment:
    """The file as an attachment, or AttachmentError saying why not. `room`: the tokens the
    conversation can still take (None: not known); `count`: the engine's token count of a text
    (None where it has no tokenizer: then the text is estimated, on the safe side)."""
    name = path.name
    try:
        if not path.is_file():
            raise AttachmentError(f"{name} is not a file")
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise AttachmentError(f"{name} is {size / (1 << 20):.1f} MiB, more than any context takes")
        data = path.read_bytes()
    except OSError as e:
        raise AttachmentError(f"{name} cannot be read ({e.strerror or e})") from None
    if b"\0" in data:
        raise AttachmentError(f"{name} is not a text file (it holds binary data)")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise AttachmentError(f"{name} is not UTF-8 text (byte {e.start} is not UTF-8)") from None
    if room is not None and len(text) > max(room, 0) * MOST_CHARS_PER_TOKEN:
        raise AttachmentError(f"{name} is too long for this conversation: {_room(room)}")
    tokens = count(text)
    needs = tokens if tokens is not None else -(-len(text) // CHARS_PER_TOKEN)
    if room is not None and needs > room:
        about = "" if tokens is not None else "about "
        raise AttachmentError(f"{name} is {about}{needs:,} tokens, too long for this conversation: {_room(room)}")
    return Attachment(name[:MAX_NAME], text, tokens)


def _room(room: int) -> str:
    if room <= 0:
        return "its context is full (start a new chat, or raise the context in Settings)"
    return f"it has room for {room:,} more tokens, leaving space for the reply (raise the context in Settings)"


def with_files(text: str, files: list[Attachment]) -> str:
    """The message as the engine reads it: each file in a fenced block under its name (a fence
    longer than any backtick run inside), then the user's words."""
    parts = []
    for a in files:
        fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", a.text)), default=0))
        body = a.text if a.text.endswith("\n") or not a.text else a.text + "\n"
        parts.append(f"File: {a.name}\n{fence}{Path(a.name).suffix[1:]}\n{body}{fence}")
    return "\n\n".join(parts + ([text] if text.strip() else []))
