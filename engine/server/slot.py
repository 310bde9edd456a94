"""EngineSlot: the engine a server answers with, or why there is none; changed from any thread.

The CLI fills it once the model is loaded; the app points it at whatever engine its settings run,
and empties it while they restart it. Listeners hear when an engine goes away, so the streams on
it end at once with an error instead of waiting on an engine that will not answer again.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..engine import Engine

Gone = Callable[[Engine, str], None]  # (the engine that went away, why)


class EngineSlot:
    def __init__(self, reason: str = "the model is loading") -> None:
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._reason = reason
        self._listeners: list[Gone] = []

    def get(self) -> tuple[Engine | None, str]:
        """The engine, or None and why there is none."""
        with self._lock:
            return self._engine, self._reason

    def set_engine(self, engine: Engine) -> None:
        self._swap(engine, "", "the engine restarted with other settings")

    def clear(self, reason: str) -> None:
        """No engine until set_engine: requests get 503 with `reason`, open streams end with it."""
        self._swap(None, reason, reason)

    def on_gone(self, listener: Gone) -> None:
        with self._lock:
            self._listeners.append(listener)

    def _swap(self, engine: Engine | None, reason: str, why_gone: str) -> None:
        with self._lock:
            old, self._engine, self._reason = self._engine, engine, reason
            listeners = list(self._listeners)
        if old is not None and old is not engine:
            for listener in listeners:
                listener(old, why_gone)
