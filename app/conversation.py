"""One conversation as data: messages, title, the settings it ran with; JSON and Markdown forms.

File format (format_version 3), one JSON object:
  format_version, id, title, created, updated (ISO 8601, UTC), model (name of the model of the
  last reply), settings (the EngineSettings dict of the last reply), engine (the id of the remote
  engine the tab uses, "" for this computer), system_prompt, draft (unsent composer text),
  draft_attachments (files attached to the draft), sampling (this conversation's own sampling
  values: any of temperature, top_p, top_k, seed, max_tokens; the rest follow the settings),
  messages: [{id, parent, role, text, time, tokens, tok_s, accepted, interrupted, error, ...}] (the branch shown),
  branches: [the same] (every other message of the tree), pinned, at_limit, snapshot.
A reply also keeps prompt_tokens, ttft (seconds to its first token), left_out (messages left
out of its prompt to fit the context) and finish_reason (the engine's: "eos", "stop", "length",
"cancelled", ...); a user message its attachments ([{name, text, tokens}], app/attachments.py).
Version 2 had no sampling, attachments or finish_reason: its files read with none.
The messages form a tree: each has an id (an int, unique in the file, newer ones larger) and its
parent's id (null for a first message); regenerating or editing adds a sibling and keeps the old
one in `branches` (see app/branches.py). Version 1 had no ids and no branches: its messages read
as one branch, numbered in order.
`snapshot` stays null: a conversation's KV snapshots are files of their own,
`<data dir>/snapshots/<id>.<model fingerprint>.kv` (ConversationStore.snapshot_files), and the
engine checks one against the conversation as it now is before it continues from it.
"""
from __future__ import annotations

import math
import re
import secrets
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from engine import SamplingParams

from .attachments import Attachment, with_files
from .markdown import closed

FORMAT_VERSION = 3
ROLES = ("user", "assistant")
OWN_SAMPLING = ("temperature", "top_p", "top_k", "seed", "max_tokens")  # what a conversation may set
# ... and the range of each, as the settings dialog offers them: the engine takes all of these
OWN_RANGES: dict[str, tuple[Any, Any]] = {"temperature": (0.0, 2.0), "top_p": (0.01, 1.0), "top_k": (0, 1000),
                                          "seed": (0, 2**31 - 1), "max_tokens": (1, 1 << 20)}
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
    reasoning: str = ""  # a thinking model's block, shown apart and sent back for the template to keep or drop
    reasoning_tokens: int | None = None
    tokens: int | None = None
    tok_s: float | None = None
    accepted: float | None = None  # mean tokens per verify window, with a drafter
    # True when generation was cut: stopped, crashed or quit mid-answer; the text is what arrived.
    interrupted: bool = False
    error: str | None = None  # why the engine could not write this reply
    id: int = 0  # its place in the conversation's tree; 0 until Conversation.add numbers it
    prompt_tokens: int | None = None  # what the engine read to write this reply
    ttft: float | None = None  # seconds from sending to the first token
    left_out: int = 0  # earlier messages left out of the prompt to fit the context
    parent: int | None = None
    attachments: list[Attachment] = field(default_factory=list)  # files sent with a user message
    finish_reason: str | None = None  # why the engine ended the reply ("length": at max tokens)

    @classmethod
    def from_dict(cls, raw: Any) -> "Message":
        """A message from its JSON form. Role and text are the message: without them FormatError;
        any other field of the wrong type or out of range is dropped (left at its default)."""
        if not isinstance(raw, dict) or raw.get("role") not in ROLES or not isinstance(raw.get("text"), str):
            raise FormatError(f"bad message: {str(raw)[:80]}")
        tok_s, rtokens = raw.get("tok_s"), raw.get("reasoning_tokens")
        return cls(role=raw["role"], text=raw["text"], time=timestamp(raw.get("time")),
                   reasoning=_text(raw, "reasoning") if raw["role"] == "assistant" else "",
                   reasoning_tokens=_count(rtokens),
                   tokens=_count(raw.get("tokens")),
                   tok_s=float(tok_s) if _is_number(tok_s) and 0 <= tok_s < 1e9 else None,
                   accepted=float(raw["accepted"]) if _is_number(raw.get("accepted")) and 1 <= raw["accepted"] <= 17
                   else None,
                   interrupted=raw.get("interrupted") is True,
                   error=raw.get("error") if isinstance(raw.get("error"), str) else None,
                   id=raw["id"] if _is_int(raw.get("id")) and 0 < raw["id"] < 1 << 53 else 0,
                   prompt_tokens=_count(raw.get("prompt_tokens")), left_out=_count(raw.get("left_out")) or 0,
                   ttft=float(raw["ttft"]) if _is_number(raw.get("ttft")) and 0 <= raw["ttft"] < 1e6 else None,
                   parent=raw["parent"] if _is_int(raw.get("parent")) else None,
                   attachments=attachments(raw.get("attachments")) if raw["role"] == "user" else [],
                   finish_reason=raw["finish_reason"] if raw.get("finish_reason") in FINISH_REASONS else None)

    def content(self) -> str:
        """What the engine reads of it: a user message's files, then its words."""
        return with_files(self.text, self.attachments) if self.attachments else self.text


FINISH_REASONS = ("eos", "stop", "length", "cancelled", "shutdown")


def attachments(raw: Any) -> list[Attachment]:
    """The attachments of a JSON list; anything that is not one is dropped."""
    found = [Attachment.from_dict(a) for a in raw] if isinstance(raw, list) else []
    return [a for a in found if a is not None]


def check_sampling(raw: Any) -> dict[str, Any]:
    """Own sampling values as given (a preset's), or FormatError naming the first one that a
    conversation cannot set: an unknown name, or a value outside the range its panel offers."""
    if not isinstance(raw, dict):
        raise FormatError(f"sampling must be an object of values, got {str(raw)[:40]}")
    for name, value in raw.items():
        if name not in OWN_RANGES:
            raise FormatError(f"{str(name)[:40]!r} is no sampling value a conversation sets "
                              f"(those are {', '.join(OWN_SAMPLING)})")
        low, high = OWN_RANGES[name]
        whole = isinstance(low, int)
        if not (_is_int(value) if whole else _is_number(value)) or not low <= value <= high:
            raise FormatError(f"{name} must be {'a whole number' if whole else 'a number'} from {low:,} to "
                              f"{high:,}, got {str(value)[:40]}")
    return {name: raw[name] for name in OWN_SAMPLING if name in raw}


def own_sampling(raw: Any) -> dict[str, Any]:
    """A conversation's own sampling values from its file: those check_sampling takes, others dropped."""
    if not isinstance(raw, dict):
        return {}
    kept = {}
    for name, value in raw.items():
        try:
            kept.update(check_sampling({name: value}))
        except FormatError:
            continue
    return {name: kept[name] for name in OWN_SAMPLING if name in kept}


def timestamp(value: Any) -> str:
    """An ISO 8601 time that every view can show (it converts to local time), or "" for anything else."""
    if not isinstance(value, str) or len(value) > 64:
        return ""
    try:
        datetime.fromisoformat(value).astimezone().astimezone(timezone.utc)
    except (ValueError, OverflowError, OSError):
        return ""
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> int | None:
    return value if _is_int(value) and 0 <= value < 1 << 53 else None


def _is_number(value: Any) -> bool:
    return (isinstance(value, float) and math.isfinite(value)) or _is_int(value)


def _text(raw: dict, key: str) -> str:
    value = raw.get(key)
    return value if isinstance(value, str) else ""


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
    thinking: bool | None = None  # enable_thinking for this conversation; None: the model's own default
    messages: list[Message] = field(default_factory=list)
    snapshot: dict[str, Any] | None = None
    branches: list[Message] = field(default_factory=list)
    pinned: bool = False  # listed above the others
    at_limit: str = "refuse"  # at the context's limit: "refuse", or "drop" the oldest turns
    sampling: dict[str, Any] = field(default_factory=dict)  # own values of OWN_SAMPLING fields
    draft_attachments: list[Attachment] = field(default_factory=list)

    def add(self, message: Message) -> Message:
        """Append `message` to the branch shown, as the child of its last message."""
        message.id = max((m.id for m in self.messages + self.branches), default=0) + 1
        message.parent = self.messages[-1].id if self.messages else None
        self.messages.append(message)
        if not self.title and message.role == "user":
            self.title = title_from(message.text or " ".join(a.name for a in message.attachments))
        return message

    def sampling_for(self, defaults: SamplingParams) -> SamplingParams:
        """The settings' sampling with this conversation's own values over it."""
        return replace(defaults, **self.sampling)

    def touch(self) -> None:
        self.updated = now_iso()

    def engine_messages(self, left_out: int = 0) -> list[dict[str, str]]:
        """The history as the engine's chat messages, without its first `left_out` messages (to
        fit the context): resuming is sending all of it."""
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        # An assistant turn cut before its first token is nothing the model said. A reply's thinking
        # goes back too: the chat template keeps it (the current turn) or drops it (earlier ones).
        for m in self.messages[left_out:]:
            if m.role == "user" or m.text or m.reasoning:
                out.append({"role": m.role, "content": m.content(), **({"reasoning_content": m.reasoning}
                                                                   if m.reasoning else {})})
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {"format_version": FORMAT_VERSION, **d}

    @classmethod
    def from_dict(cls, raw: Any) -> "Conversation":
        """Validate a file's JSON into typed fields, once: FormatError when it is not a conversation
        (no id or messages, a message without role and text, a newer format); any other field of the
        wrong type or out of range is dropped (left at its default), so no view sees a wrong type."""
        if not isinstance(raw, dict):
            raise FormatError("not a JSON object")
        version = raw.get("format_version")
        if not _is_int(version):
            raise FormatError("no format_version")
        if version > FORMAT_VERSION:
            raise FormatError(f"format_version {version} is newer than this Lanechat reads ({FORMAT_VERSION})")
        if not isinstance(raw.get("id"), str) or not isinstance(raw.get("messages"), list):
            raise FormatError("missing id or messages")
        settings, snapshot, branches = raw.get("settings"), raw.get("snapshot"), raw.get("branches")
        path, others = linked([Message.from_dict(m) for m in raw["messages"]],
                              [Message.from_dict(m) for m in branches] if isinstance(branches, list) else [])
        return cls(id=raw["id"], title=_text(raw, "title"), created=timestamp(raw.get("created")),
                   updated=timestamp(raw.get("updated")), model=_text(raw, "model"),
                   settings=settings if isinstance(settings, dict) else {}, engine=_text(raw, "engine"),
                   system_prompt=_text(raw, "system_prompt"), draft=_text(raw, "draft"),
                   thinking=raw.get("thinking") if isinstance(raw.get("thinking"), bool) else None,
                   messages=path, branches=others, pinned=raw.get("pinned") is True,
                   at_limit="drop" if raw.get("at_limit") == "drop" else "refuse",
                   sampling=own_sampling(raw.get("sampling")),
                   draft_attachments=attachments(raw.get("draft_attachments")),
                   snapshot=snapshot if isinstance(snapshot, dict) else None)

    def to_markdown(self) -> str:
        """The conversation as one Markdown document. A user message reads as the engine read it
        (its files first, each a fenced block under its name); a code fence a message leaves open
        (a reply cut at its max tokens) is closed, so the next message is not read as code."""
        parts = [f"# {self.title or 'Untitled conversation'}", ""]
        meta = [self.created[:10]] + ([self.model] if self.model else [])
        parts += [f"*{' · '.join(meta)}*", ""]
        if self.system_prompt.strip():
            parts += ["**System prompt:**", "", _quote(self.system_prompt), ""]
        for m in self.messages:
            head = "## You" if m.role == "user" else "## Assistant"
            if m.interrupted:
                head += " (interrupted)"
            parts += [head, ""]
            if m.reasoning.strip():
                parts += ["<details><summary>Thinking</summary>", "", m.reasoning.strip(), "", "</details>", ""]
            parts += [closed(m.content().rstrip()), ""]
        return "\n".join(parts)


def linked(path: list[Message], others: list[Message]) -> tuple[list[Message], list[Message]]:
    """The tree a file holds, made consistent: a branch shown whose ids and parents do not chain
    (a version 1 file) is numbered 1, 2, ... in order and keeps no other branches (they could
    hang anywhere); of the others, those whose parent is not in the tree, or whose id repeats,
    are dropped."""
    chained = all(m.id > 0 and m.parent == (path[i - 1].id if i else None) for i, m in enumerate(path))
    if not chained or len({m.id for m in path}) < len(path):
        for i, m in enumerate(path):
            m.id, m.parent = i + 1, i or None
        return path, []
    children: dict[int | None, list[Message]] = {}
    for m in others:
        if m.id > 0:
            children.setdefault(m.parent, []).append(m)
    known = {m.id for m in path}
    kept: list[Message] = []
    # walked down from the roots and the branch shown: a parent may come after its child in the list
    parents: list[int | None] = [None, *known]
    while parents:
        for m in children.pop(parents.pop(), ()):
            if m.id not in known:
                known.add(m.id)
                kept.append(m)
                parents.append(m.id)
    kept.sort(key=lambda m: m.id)
    return path, kept


def _quote(text: str) -> str:
    return "\n".join("> " + ln if ln else ">" for ln in text.strip().splitlines())
