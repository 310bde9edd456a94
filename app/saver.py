"""File writes off the GUI thread: an atomic write ends in fsync, which can take tens of
milliseconds, and a reply that streams is saved every couple of seconds.

Each file (a key) has at most one write waiting, the newest: a slow disk coalesces writes
instead of queueing them. `now()` writes on the caller's thread and an older write still queued or
running never lands after it, so the newest content always wins. The worker never touches a Qt
object: the write functions it runs are plain Python over plain data.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)

Write = Callable[[], None]


class Saver:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()  # one write at a time, in the order they are taken
        self._pending: dict[str, tuple[int, Write]] = {}
        self._written: dict[str, int] = {}  # key -> version of its newest write on disk
        self._version = 0
        self._busy = 0
        self._errors: list[str] = []
        self._thread: threading.Thread | None = None

    def later(self, key: str, write: Write) -> None:
        """Run `write` on the worker thread, unless a newer write for `key` comes first."""
        with self._cond:
            self._version += 1
            self._pending.pop(key, None)  # the newest goes to the back of the queue
            self._pending[key] = (self._version, write)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="lanechat-saver", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def now(self, key: str, write: Write) -> None:
        """Run `write` here and now (raising what it raises); drops an older queued write for `key`."""
        with self._cond:
            self._version += 1
            version = self._version
            self._pending.pop(key, None)
        with self._write_lock:
            write()
            self._written[key] = version

    def flush(self) -> None:
        """Wait until every queued write has run."""
        with self._cond:
            while self._pending or self._busy:
                self._cond.wait()

    def errors(self) -> list[str]:
        """Why background writes failed since the last call (each one also went to the log)."""
        with self._cond:
            errors, self._errors = self._errors, []
        return errors

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                key = next(iter(self._pending))
                version, write = self._pending.pop(key)
                self._busy += 1
            try:
                with self._write_lock:
                    if version > self._written.get(key, 0):
                        write()
                        self._written[key] = version
            except Exception as e:  # noqa: BLE001 - reported to the GUI, the worker carries on
                log.exception("saving %s failed", key)
                with self._cond:
                    self._errors.append(f"{key}: {e}")
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()
