"""Conversation files: one JSON each under <data dir>/conversations/, written atomically.

A file that cannot be read (corrupt, too large or deep, or from a newer Lanechat) is moved into
`set-aside/` with a notice, so one bad file never blocks the others and is never overwritten.
Deleting moves a conversation and its KV snapshots into the trash (app/trash.py), for Undo.
`recover` runs at start: a write that a kill cut short leaves its temp file, which may hold the
newest turn.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from engine import jsonfile

from .atomic import leftovers, write_json_atomic
from .conversation import Conversation, FormatError, Message
from .trash import Trash, conversation_id

_ID = re.compile(r"[A-Za-z0-9_.-]+")
_TEMP = re.compile(r"\.(.+)\.json\.[^.]+\.tmp")  # write_atomic's temp name for <id>.json
MAX_FILE_BYTES = 256 << 20
MAX_DEPTH = 16  # a conversation nests 4 deep; settings and snapshot a few more


class ConversationStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.aside = root / "set-aside"
        self.trash = Trash(root.parent / "trash")
        root.mkdir(parents=True, exist_ok=True)

    def path(self, cid: str) -> Path:
        # Ids come back from session files too: never let one name a path outside the store.
        if not _ID.fullmatch(cid) or cid.startswith("."):
            raise FormatError(f"bad conversation id {cid!r}")
        return self.root / f"{cid}.json"

    @property
    def snapshot_dir(self) -> Path:
        """KV snapshots, beside the conversations: `<conversation id>.<model fingerprint>.kv`."""
        return self.root.parent / "snapshots"

    def snapshot_base(self, cid: str) -> Path:
        """A conversation's snapshot path without its `.<fingerprint>.kv` ending."""
        self.path(cid)  # the id check
        return self.snapshot_dir / cid

    def snapshot_files(self, cid: str) -> list[Path]:
        return sorted(self.snapshot_dir.glob(f"{self.snapshot_base(cid).name}.*.kv"))

    def clear_snapshots(self) -> int:
        """Remove every KV snapshot file; returns how many there were."""
        files = list(self.snapshot_dir.glob("*.kv")) if self.snapshot_dir.is_dir() else []
        for f in files:
            f.unlink(missing_ok=True)
        return len(files)

    def save(self, conv: Conversation) -> None:
        write_json_atomic(self.path(conv.id), conv.to_dict())

    def exists(self, cid: str) -> bool:
        return self.path(cid).is_file()

    def taken(self, cid: str) -> bool:
        """Whether a new conversation must not take this id: a file has it, or a deleted one in
        the trash (Undo brings it back), or no file can be named after it."""
        try:
            return self.exists(cid) or any(conversation_id(e) == cid for e in self.trash.entries())
        except FormatError:
            return True

    def load(self, cid: str) -> Conversation:
        """Read one conversation; raises FormatError (after setting the file aside) if unreadable."""
        return self._read(self.path(cid))

    def load_all(self) -> tuple[list[Conversation], list[str]]:
        """Every readable conversation, most recently updated first, and a notice per bad file."""
        convs, notices = [], []
        for path in sorted(self.root.glob("*.json")):
            try:
                convs.append(self._read(path))
            except FormatError as e:
                notices.append(str(e))
        convs.sort(key=lambda c: c.updated, reverse=True)
        return convs, notices

    def delete(self, cid: str) -> Path:
        """Move the conversation's file and snapshots into the trash; returns the trash entry
        that `undelete` takes."""
        return self.trash.put(cid, [self.path(cid), *self.snapshot_files(cid)])

    def undelete(self, entry: Path) -> Conversation:
        """Put a deleted conversation and its snapshots back; FormatError when it cannot be (the
        entry stays in the trash then)."""
        cid = conversation_id(entry)
        if cid is not None and self.exists(cid):
            raise FormatError(f"A conversation with the id {cid} exists again; the deleted one stays in {entry}")
        try:
            cid = self.trash.take(entry, self.root, self.snapshot_dir)
        except OSError as e:
            raise FormatError(f"The conversation could not be restored ({e})") from e
        return self.load(cid)

    def recover(self, min_age_s: float = 2.0) -> list[str]:
        """Settle the temp files that killed writes left (see app.atomic). One that reads as a
        conversation whose messages extend the saved file's (the saved ones are its first messages,
        the last of them perhaps an assistant reply that was still growing) becomes the file: it
        holds what the user wrote last. Every other one is removed. Returns a notice for each saved
        file that turned out unreadable (and was set aside)."""
        found: dict[str, list[tuple[Conversation, Path]]] = {}
        for tmp in leftovers(self.root, min_age_s):
            m = _TEMP.fullmatch(tmp.name)
            conv = self._parse(tmp) if m and _ID.fullmatch(m[1]) and not m[1].startswith(".") else None
            if conv is None:
                tmp.unlink(missing_ok=True)
            else:
                found.setdefault(m[1], []).append((conv, tmp))
        notices = []
        for cid, candidates in found.items():
            saved: list[Message] = []
            if self.exists(cid):
                try:
                    saved = self._read(self.path(cid)).messages
                except FormatError as e:
                    notices.append(str(e))
            newer = [(c, t) for c, t in candidates if extends(c.messages, saved)]
            best = max(newer, key=lambda ct: (len(ct[0].messages), len(ct[0].messages[-1].text)), default=None)
            for conv, tmp in candidates:
                if best is not None and tmp == best[1]:
                    os.replace(tmp, self.path(cid))
                else:
                    tmp.unlink(missing_ok=True)
        return notices

    def _parse(self, path: Path) -> Conversation | None:
        try:
            return Conversation.from_dict(jsonfile.read(path, MAX_DEPTH, MAX_FILE_BYTES))
        except (OSError, ValueError):
            return None

    def _read(self, path: Path) -> Conversation:
        if not path.is_file():
            raise FormatError(f"Conversation {path.stem} no longer exists")
        try:
            conv = Conversation.from_dict(jsonfile.read(path, MAX_DEPTH, MAX_FILE_BYTES))
        except (OSError, ValueError) as e:
            moved = self._set_aside(path)
            raise FormatError(f"Conversation file {path.name} could not be read ({reason(e)}); "
                              f"it was moved to {moved}") from e
        conv.id = path.stem  # the file name is the id that tabs and the session refer to
        return conv

    def _set_aside(self, path: Path) -> Path:
        self.aside.mkdir(exist_ok=True)
        dest = self.aside / path.name
        n = 1
        while dest.exists():
            dest = self.aside / f"{path.stem}.{n}{path.suffix}"
            n += 1
        path.replace(dest)
        return dest


def extends(new: list[Message], old: list[Message]) -> bool:
    """Whether `new` is `old` and more: old's messages come first in it, equal, except that old's
    last may be an assistant reply that grew; and something was added."""
    if len(new) < len(old) or not new or new[:max(len(old) - 1, 0)] != old[:-1]:
        return False
    if not old:
        return True
    was, now = old[-1], new[len(old) - 1]
    grew = was.role == now.role == "assistant" and now.text.startswith(was.text) and len(now.text) > len(was.text)
    return (now == was and len(new) > len(old)) or grew


def reason(e: Exception) -> str:
    """Why a file could not be read, in a few words."""
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON at line {e.lineno}"
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text at byte {e.start}"
    return str(e) or type(e).__name__
