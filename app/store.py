"""Conversation files: one JSON each under <data dir>/conversations/, written atomically.

A file that cannot be read (corrupt, or from a newer Lanechat) is moved into `set-aside/` with a
notice, so one bad file never blocks the others and is never overwritten.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from .atomic import write_atomic, write_json_atomic
from .conversation import Conversation, FormatError

_ID = re.compile(r"[A-Za-z0-9_.-]+")


class ConversationStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.aside = root / "set-aside"
        root.mkdir(parents=True, exist_ok=True)

    def path(self, cid: str) -> Path:
        # Ids come back from session files too: never let one name a path outside the store.
        if not _ID.fullmatch(cid) or cid.startswith("."):
            raise FormatError(f"bad conversation id {cid!r}")
        return self.root / f"{cid}.json"

    def snapshot_path(self, cid: str) -> Path:
        """Where a conversation's KV snapshot lives (a sidecar; removed with the conversation)."""
        return self.path(cid).with_suffix(".kv")

    def save(self, conv: Conversation) -> None:
        write_json_atomic(self.path(conv.id), conv.to_dict())

    def exists(self, cid: str) -> bool:
        return self.path(cid).is_file()

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

    def delete(self, cid: str) -> None:
        self.path(cid).unlink(missing_ok=True)
        snap = self.snapshot_path(cid)
        if snap.is_dir():
            shutil.rmtree(snap)
        else:
            snap.unlink(missing_ok=True)

    def export_markdown(self, conv: Conversation, dest: Path) -> None:
        write_atomic(dest, conv.to_markdown().encode("utf-8"))

    def _read(self, path: Path) -> Conversation:
        if not path.is_file():
            raise FormatError(f"Conversation {path.stem} no longer exists")
        try:
            conv = Conversation.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, FormatError, TypeError, ValueError) as e:
            moved = self._set_aside(path)
            raise FormatError(f"Conversation file {path.name} could not be read ({_reason(e)}); "
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


def _reason(e: Exception) -> str:
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON at line {e.lineno}"
    return str(e) or type(e).__name__
