"""One engine request as the server's event loop sees it.

The engine calls `push` on its own thread for every event; the handler awaits batches on the
loop. At most one wake-up per stream is in flight, so a burst of tokens costs the loop one call.
"""
from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

from ..engine import Engine
from ..events import Event, Failed, Finished, Started
from .protocol import ApiError


@dataclass(frozen=True)
class Ended:
    """Not an engine event: the server ended the stream (its engine went away, the server stops)."""
    error: ApiError


class RequestStream:
    def __init__(self, loop: asyncio.AbstractEventLoop, engine: Engine) -> None:
        self.loop = loop
        self.engine = engine
        self.rid: int | None = None  # once submitted
        self.started = False
        self.finished = False  # the engine has said its last word (Finished or Failed) ...
        self.failed = False    # ... and it was Failed
        self._lock = threading.Lock()
        self._events: list[Event | Ended] = []
        self._scheduled = False
        self._ready = asyncio.Event()

    def push(self, event: Event | Ended) -> None:
        """Any thread."""
        with self._lock:
            self._events.append(event)
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the server's loop is closed: nobody is listening any more
            pass

    def _wake(self) -> None:
        with self._lock:
            self._scheduled = False
        self._ready.set()

    def end(self, error: ApiError) -> None:
        """Loop thread: stop waiting for the engine; the handler answers with `error`."""
        self.push(Ended(error))

    async def next_events(self) -> list[Event | Ended]:
        """The events since the last call (at least one), in order."""
        while True:
            with self._lock:
                batch, self._events = self._events, []
            if batch:
                for e in batch:
                    self.started = self.started or isinstance(e, Started)
                    self.finished = self.finished or isinstance(e, (Finished, Failed))
                    self.failed = self.failed or isinstance(e, Failed)
                return batch
            self._ready.clear()
            await self._ready.wait()

    @property
    def outcome(self) -> str:
        """finished | failed | cancelled (by the server: its client went away, or its engine)."""
        return "failed" if self.failed else "finished" if self.finished else "cancelled"

    @staticmethod
    def last(event: Event | Ended) -> bool:
        """Whether nothing follows this event for its request."""
        return isinstance(event, (Finished, Failed, Ended))
