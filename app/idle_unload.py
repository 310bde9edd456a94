"""Unloading an idle model: after N minutes without a request, the engine stops and gives its memory
back; the next message loads it again (the reply shows the progress).

The setting (app.preferences, "idle_unload_minutes"): null for automatic (on where the model's
memory is the desktop's, engine.unload_when_idle), 0 for never, or a number of minutes. While this
computer's engine is served on localhost it is never unloaded: other programs count on it.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from engine import IDLE_UNLOAD_MINUTES, unload_when_idle

from . import preferences
from .engine_bridge import EngineBridge

CHECK_MS = 15_000
CHOICES = (None, 0, 5, 15, 30, 60)  # what the settings offer


def load_minutes() -> int | None:
    """The saved choice; anything unreadable is automatic."""
    value = preferences.load().get("idle_unload_minutes")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 24 * 60 else None


def save_minutes(minutes: int | None) -> None:
    preferences.save("idle_unload_minutes", minutes)


def effective_minutes(choice: int | None, unified: bool) -> int:
    """Minutes of idleness before unloading; 0: never."""
    if choice is None:
        return IDLE_UNLOAD_MINUTES if unload_when_idle(unified) else 0
    return choice


def describe(choice: int | None, unified: bool | None = None) -> str:
    if choice is None:
        auto = "" if unified is None else (f": after {IDLE_UNLOAD_MINUTES} minutes here" if unload_when_idle(unified)
                                           else ": never here")
        return f"Automatic (on for unified memory, off on a GPU{auto})"
    return "Never" if choice == 0 else f"After {choice} minutes"


class IdleUnloader(QObject):
    unloaded = Signal(int)  # the minutes it had been idle

    def __init__(self, bridge: EngineBridge, serving: Callable[[], bool], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge, self._serving = bridge, serving
        self.choice = load_minutes()
        self._timer = QTimer(self, interval=CHECK_MS, timeout=self.check)
        self._timer.start()

    def set_choice(self, choice: int | None) -> None:
        self.choice = choice
        save_minutes(choice)

    def minutes(self) -> int:
        info = self.bridge.info
        return effective_minutes(self.choice, bool(info.unified) if info is not None else False)

    def check(self) -> bool:
        """Unload now if the model has been idle long enough; True when it did."""
        minutes = self.minutes()
        b = self.bridge
        if not minutes or b.state != "ready" or b.busy or self._serving():
            return False
        if time.monotonic() - b.last_active < minutes * 60:
            return False
        asyncio.ensure_future(b.unload())
        self.unloaded.emit(minutes)
        return True
