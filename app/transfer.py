"""Conversations out of and into Lanechat: what an export writes and what an import reads.

Export: one conversation or several, as Markdown (to read, attached files included; several are
separated by rules) or as JSON (to import again: one conversation's file as the store writes it,
several as a list of them).
Import reads our JSON of any format version the store reads, a list of those (an export of all),
and a plain list of {role, content} messages (the OpenAI chat form, bare or as {"messages": [...]}):
system messages become the system prompt. A file that is none of these is refused whole with the
reason; nothing is read from it and the file itself is never changed.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import platformdirs

from engine import jsonfile

from .atomic import json_bytes, write_atomic
from .conversation import Conversation, FormatError, Message
from .store import MAX_DEPTH, MAX_FILE_BYTES, reason

MARKDOWN, JSON = "markdown", "json"
SUFFIXES = {MARKDOWN: ".md", JSON: ".json"}
FILTERS = {MARKDOWN: "Markdown (*.md)", JSON: "JSON, to import again (*.json)"}
_UNSAFE_IN_NAMES = re.compile(r'[\x00-\x1f<>:"/\\|?*]+')
_PLAIN_ROLES = ("system", "user", "assistant")


def documents() -> Path:
    folder = Path(platformdirs.user_documents_dir())
    return folder if folder.is_dir() else Path.home()


def export_path(conv: Conversation | None, folder: Path | None = None, kind: str = MARKDOWN) -> Path:
    """Where an export goes unless the user picks another place: the documents folder, named
    after the conversation's title as written (without what file names cannot hold); None: all."""
    folder = documents() if folder is None else folder
    if conv is None:
        return folder / f"Lanechat conversations{SUFFIXES[kind]}"
    name = " ".join(_UNSAFE_IN_NAMES.sub(" ", conv.title).split())[:80].strip(" .") or "Conversation"
    return folder / f"{name}{SUFFIXES[kind]}"


def kind_of(path: Path, chosen: str = MARKDOWN) -> str:
    """The format a path's ending names; `chosen` (the dialog's filter) where it names none."""
    return next((k for k, suffix in SUFFIXES.items() if path.suffix.lower() == suffix), chosen)


def export_bytes(convs: list[Conversation], kind: str, several: bool) -> bytes:
    """`several`: the form of an export of all (a list in JSON), even when it holds one."""
    if kind == JSON:
        return json_bytes([c.to_dict() for c in convs] if several else convs[0].to_dict())
    return "\n---\n\n".join(c.to_markdown() for c in convs).encode("utf-8")


def write_export(convs: list[Conversation], dest: Path, several: bool = False) -> None:
    write_atomic(dest, export_bytes(convs, kind_of(dest), several))


def read_import(path: Path) -> list[Conversation]:
    """Every conversation in an import file; FormatError saying why the file cannot be imported."""
    try:
        raw = jsonfile.read(path, MAX_DEPTH, MAX_FILE_BYTES)
    except (OSError, ValueError) as e:
        raise FormatError(reason(e)) from e
    return parse_import(raw)


def parse_import(raw: Any) -> list[Conversation]:
    if isinstance(raw, dict) and "format_version" in raw:
        return [Conversation.from_dict(raw)]
    if isinstance(raw, dict) and isinstance(raw.get("messages"), list):
        return [from_plain(raw["messages"])]
    if not isinstance(raw, list) or not raw:
        raise FormatError("not a Lanechat conversation, a list of them, or a list of {role, content} messages")
    if all(isinstance(item, dict) and "format_version" in item for item in raw):
        out = []
        for i, item in enumerate(raw, 1):
            try:
                out.append(Conversation.from_dict(item))
            except FormatError as e:
                raise FormatError(f"conversation {i}: {e}") from e
        return out
    return [from_plain(raw)]


def from_plain(messages: list[Any]) -> Conversation:
    """A conversation from chat messages [{role, content}], content a string or a list of text parts."""
    conv, system = Conversation(), []
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or "role" not in m:
            raise FormatError(f"item {i} is neither a Lanechat conversation nor a {{role, content}} message")
        if m["role"] not in _PLAIN_ROLES:
            raise FormatError(f"message {i}: role {str(m['role'])[:40]!r} is not system, user or assistant")
        text = _content(m.get("content"))
        if text is None:
            raise FormatError(f"message {i}: content is not text")
        if m["role"] == "system":
            system.append(text)
        else:
            reasoning = m.get("reasoning_content") if m["role"] == "assistant" else None
            conv.add(Message(m["role"], text, reasoning=reasoning if isinstance(reasoning, str) else ""))
    if not conv.messages:
        raise FormatError("no user or assistant messages")
    conv.system_prompt = "\n\n".join(system)
    return conv


def _content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    return None
