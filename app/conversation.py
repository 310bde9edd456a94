"""One conversation as data: messages, title, the settings it ran with; JSON and Markdown forms.

File format (format_version 1), one JSON object:
  format_version, id, title, created, updated (ISO 8601, UTC), model (name of the model of the
  last reply), settings (the EngineSettings dict of the last reply), engine (the id of the remote
  engine the tab uses, "" for this computer), system_prompt, draft (unsent composer text),
  messages: [{role, text, time, tokens, tok_s, interrupted, error}], snapshot.
`snapshot` is null until KV snapshots exist; then it names a sidecar next to the JSON file
(see ConversationStore.snapshot_path) and the token count and settings it was taken with, so a
resumed conversation can skip recomputing its prompt.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

FORMAT_VERSION = 1
ROLES = ("user", "assistant")
_TITLE_CHARS = 48


class FormatError(ValueError):
    """A conversation file that is not one we can read (corrupt, or written by a newer Lanechat)."""


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_id() -> str:
    # Sortable by creation time, unique without coordination between windows.
    return f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def title_from(text: str) -> str:
    """A tab title from a first message: its first line, cut at a word near 48 characters."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"\s+", " ", line).strip()
    if len(line) <= _TITLE_CHARS:
        return line
    cut = line[:_TITLE_CHARS].rsplit(" ", 1)[0] or line[:_TITLE_CHARS]
    return cut.rstrip(" ,.;:") + "…"


@dataclass
class Message:
    role: str
    text: str
    time: str = field(default_factory=now_iso)
    tokens: int | None = None
    tok_s: float | None = None
    # True when generation was cut: stopped, crashed or quit mid-answer; the text is what arrived.
    interrupted: bool = False
    error: str | None = None  # why the engine could not write this reply

    @classmethod
    def from_dict(cls, raw: Any) -> "Message":
        if not isinstance(raw, dict) or raw.get("role") not in ROLES or not isinstance(raw.get("text"), str):
            raise FormatError(f"bad message: {str(raw)[:80]}")
        return cls(role=raw["role"], text=raw["text"], time=str(raw.get("time", "")),
                   tokens=raw.get("tokens"), tok_s=raw.get("tok_s"),
                   interrupted=bool(raw.get("interrupted", False)), error=raw.get("error"))


@dataclass
class Conversation:
    id: str = field(default_factory=new_id)
    title: str = ""
    created: str = field(default_factory=now_iso)
    updated: str = field(default_factory=now_iso)
    model: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    engine: str = ""
    system_prompt: str = ""
    draft: str = ""
    messages: list[Message] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None

    def add(self, message: Message) -> Message:
        self.messages.append(message)
        if not self.title and message.role == "user":
            self.title = title_from(message.text)
        return message

    def touch(self) -> None:
        self.updated = now_iso()

    def engine_messages(self) -> list[dict[str, str]]:
        """The whole history as the engine's chat messages: resuming is sending all of it."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        # An assistant turn cut before its first token is nothing the model said.
        out += [{"role": m.role, "content": m.text} for m in self.messages
                if m.role == "user" or m.text]
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {"format_version": FORMAT_VERSION, **d}

    @classmethod
    def from_dict(cls, raw: Any) -> "Conversation":
        if not isinstance(raw, dict):
            raise FormatError("not a JSON object")
        version = raw.get("format_version")
        if not isinstance(version, int):
            raise FormatError("no format_version")
        if version > FORMAT_VERSION:
            raise FormatError(f"format_version {version} is newer than this Lanechat reads ({FORMAT_VERSION})")
        if not isinstance(raw.get("id"), str) or not isinstance(raw.get("messages"), list):
            raise FormatError("missing id or messages")
        settings = raw.get("settings") or {}
        if not isinstance(settings, dict):
            raise FormatError("settings is not an object")
        return cls(id=raw["id"], title=str(raw.get("title", "")), created=str(raw.get("created", "")),
                   updated=str(raw.get("updated", "")), model=str(raw.get("model", "")),
                   settings=settings, engine=str(raw.get("engine") or ""),
                   system_prompt=str(raw.get("system_prompt", "")), draft=str(raw.get("draft", "")),
                   messages=[Message.from_dict(m) for m in raw["messages"]],
                   snapshot=raw.get("snapshot"))

    def to_markdown(self) -> str:
        parts = [f"# {self.title or 'Untitled conversation'}", ""]
        meta = [self.created[:10]] + ([self.model] if self.model else [])
        parts += [f"*{' · '.join(meta)}*", ""]
        if self.system_prompt.strip():
            parts += ["**System prompt:**", "", _quote(self.system_prompt), ""]
        for m in self.messages:
            head = "## You" if m.role == "user" else "## Assistant"
            if m.interrupted:
                head += " (interrupted)"
            parts += [head, "", m.text.rstrip(), ""]
        return "\n".join(parts)


def _quote(text: str) -> str:
    return "\n".join("> " + ln if ln else ">" for ln in text.strip().splitlines())
