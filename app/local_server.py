""""Serve on localhost": this computer's engine over the OpenAI API, for editors, agents, scripts.

An HTTP request is one more stream of the engine the tabs use. The server has a thread and event
loop of its own (engine.server.ServerThread); the GUI thread only points its slot at the
bridge's engine as that starts, restarts and stops — while it restarts, requests get 503 and
open HTTP streams end with an error event.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from engine.server import EngineSlot, OpenAIServer, ServerThread

from .connections import ServerConfig
from .engine_bridge import EngineBridge


class LocalServer(QObject):
    changed = Signal()  # started or stopped

    def __init__(self, bridge: EngineBridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.config = ServerConfig()
        self.slot: EngineSlot | None = None  # one per server run, so a stopped one leaves no listener
        self._thread: ServerThread | None = None
        bridge.state_changed.connect(self._follow)

    @property
    def url(self) -> str | None:
        """Where other programs reach it (…/v1), while it runs."""
        if self._thread is None:
            return None
        return f"http://127.0.0.1:{self._thread.port}/v1"

    def apply(self, config: ServerConfig) -> None:
        """Serve (or stop serving) as `config` says; LanechatError if the port cannot be had."""
        if config == self.config and (self._thread is not None) == config.enabled:
            return
        self.stop()
        self.config = config
        if config.enabled:
            slot = EngineSlot()
            thread = ServerThread(OpenAIServer(slot, api_key=config.api_key if config.lan else None),
                                  config.host, config.port)
            thread.start()
            self.slot, self._thread = slot, thread
            self._follow()
        self.changed.emit()

    def stop(self) -> None:
        thread, self._thread, self.slot = self._thread, None, None
        if thread is not None:
            thread.stop()
            self.changed.emit()

    def _follow(self) -> None:
        b, slot = self.bridge, self.slot
        if slot is None:
            return
        if b.engine is not None:
            slot.set_engine(b.engine)
        elif b.state == "starting":
            slot.clear("the engine is starting (loading the model or applying new settings)")
        elif b.state == "failed":
            slot.clear(f"no model is loaded: {b.error}")
        else:
            slot.clear("the engine stopped (new settings are being applied, or the app is closing)")
