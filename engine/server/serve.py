"""`python -m engine serve`: listen at once (503 while the model loads), then serve until a signal.

Two lines on stdout say where and when: "serving on URL" as soon as the port is bound (port 0
picks a free one) and "ready: MODEL" once requests can run; progress and the plan go to stderr.
"""
from __future__ import annotations

import signal
import sys
import threading

from ..engine import Engine
from ..settings import EngineSettings
from .app import OpenAIServer
from .host import ServerThread
from .slot import EngineSlot


def serve(settings: EngineSettings, host: str, port: int, api_key: str | None, max_body: int,
          max_waiting: int) -> int:
    slot = EngineSlot("the model is loading")
    thread = ServerThread(OpenAIServer(slot, api_key, max_body, max_waiting), host, port)
    thread.start()
    print(f"serving on {thread.url} (OpenAI API at {thread.url}/v1)", flush=True)
    stopping = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stopping.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    engine = Engine(settings, log=lambda m: print(m, file=sys.stderr, flush=True))
    try:
        engine.start(lambda what, frac: print(f"loading: {what} ({frac:.0%})", file=sys.stderr, flush=True))
    except BaseException:
        thread.stop()
        raise
    try:
        if not stopping.is_set():
            slot.set_engine(engine)
            print(f"ready: {engine.info.model_name} on {engine.info.device}", flush=True)
            while not stopping.wait(0.5):  # a timed wait lets the signal handlers run
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        slot.clear("the server is shutting down")
        thread.stop()
        engine.shutdown()
    return 0
