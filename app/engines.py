"""The engines a tab may pick: this computer's (the EngineBridge) and each configured remote.

Tabs keep the id of their engine in their conversation ("" for this computer), so a reopened
conversation continues where it ran. A remote that is removed sends its tabs back to this
computer; one whose settings change keeps its tabs (same object, new config).
"""
from __future__ import annotations

import asyncio
from typing import Callable, Union

from PySide6.QtCore import QObject, Signal

from engine import SamplingParams

from .connections import RemoteConfig
from .engine_bridge import EngineBridge
from .remote_engine import RemoteEngine

LOCAL = ""  # the engine id of this computer
LOCAL_LABEL = "This computer"
TabEngine = Union[EngineBridge, RemoteEngine]


class EngineChoices(QObject):
    changed = Signal()  # remotes added, removed or renamed

    def __init__(self, local: EngineBridge, sampling: Callable[[], SamplingParams],
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.local = local
        self._sampling = sampling
        self.remotes: dict[str, RemoteEngine] = {}

    def choices(self) -> list[tuple[str, str]]:
        """(engine id, label) in menu order: this computer first."""
        return [(LOCAL, LOCAL_LABEL)] + [(rid, r.config.label) for rid, r in self.remotes.items()]

    def get(self, engine_id: str) -> TabEngine:
        """The engine of that id; this computer's for "" and for a remote that no longer exists."""
        return self.remotes.get(engine_id) or self.local

    def id_of(self, engine: TabEngine) -> str:
        return engine.config.id if isinstance(engine, RemoteEngine) else LOCAL

    def set_remotes(self, configs: list[RemoteConfig]) -> None:
        keep: dict[str, RemoteEngine] = {}
        for config in configs:
            remote = self.remotes.get(config.id)
            if remote is None:
                remote = RemoteEngine(config, self._sampling)
            remote.config = config
            keep[config.id] = remote
        gone = [r for rid, r in self.remotes.items() if rid not in keep]
        self.remotes = keep
        for remote in gone:
            asyncio.ensure_future(remote.aclose())
        self.changed.emit()
