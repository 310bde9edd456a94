"""The trash: a deleted conversation's file and its KV snapshots, kept so that Undo can put them back.

Each deletion is a folder `<data dir>/trash/<UTC time>-<id>/` holding `<id>.json` and the
`<id>.<fingerprint>.kv` snapshots, moved there by rename (the same disk: no copy, however big the
snapshots are). At start `empty` removes every entry older than KEEP_DAYS and the snapshots of
the others: Undo lives in the session's notice, and after it only the conversation is worth
keeping by hand (a snapshot is recomputed, and can take gigabytes).
"""
from __future__ import annotations

import re
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

KEEP_DAYS = 7
_STAMP = "%Y%m%dT%H%M%SZ"
_ENTRY = re.compile(r"(\d{8}T\d{6}Z)-([A-Za-z0-9_.-]+?)(?:~\d+)?")


class Trash:
    def __init__(self, root: Path) -> None:
        self.root = root

    def put(self, cid: str, files: list[Path], now: datetime | None = None) -> Path:
        """Move `files` (those that exist) into a new entry for conversation `cid`; its path."""
        base = f"{(now or datetime.now(timezone.utc)).strftime(_STAMP)}-{cid}"
        entry, n = self.root / base, 1
        while entry.exists():
            entry, n = self.root / f"{base}~{n}", n + 1
        entry.mkdir(parents=True)
        for f in files:
            if f.is_file():
                shutil.move(f, entry / f.name)
        return entry

    def take(self, entry: Path, conversations: Path, snapshots: Path) -> str:
        """Move an entry's files back (the conversation into `conversations`, its snapshots into
        `snapshots`) and remove the entry; returns the conversation's id."""
        cid = conversation_id(entry)
        if cid is None or not entry.is_dir():
            raise FileNotFoundError(f"{entry} is not in the trash any more")
        snapshots.mkdir(parents=True, exist_ok=True)
        for f in sorted(entry.iterdir()):
            shutil.move(f, (conversations if f.suffix == ".json" else snapshots) / f.name)
        entry.rmdir()
        return cid

    def entries(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and conversation_id(p) is not None)

    def empty(self, now: datetime | None = None, keep_days: float = KEEP_DAYS) -> int:
        """The rule at start: entries deleted more than `keep_days` ago go, and every other
        entry's snapshots; returns how many entries went. Folders of other names stay."""
        cutoff = (now or datetime.now(timezone.utc)) - timedelta(days=keep_days)
        gone = 0
        for entry in self.entries():
            m = _ENTRY.fullmatch(entry.name)
            deleted = datetime.strptime(m[1], _STAMP).replace(tzinfo=timezone.utc)
            if deleted < cutoff:
                shutil.rmtree(entry, ignore_errors=True)
                gone += 1
            else:
                for snap in entry.glob("*.kv"):
                    snap.unlink(missing_ok=True)
        return gone


def conversation_id(entry: Path) -> str | None:
    m = _ENTRY.fullmatch(entry.name)
    return m[2] if m else None
