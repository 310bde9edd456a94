"""The engine thread ↔ Qt: start/stop off the GUI thread, events delivered on it, coalesced.

The engine calls `on_event` on its own thread for every token. Events go into a locked buffer
that a GUI-thread timer drains ~30 times a second, merging each request's consecutive tokens into
one text update; each request reports to a RequestSink (one chat tab) on the GUI thread.

No Qt signal is ever emitted off the GUI thread (PySide6 crashed on that under Python 3.11, and
polling costs nothing): blocking engine calls run on plain threads that the GUI thread polls.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from PySide6.QtCore import QObject, QTimer, Signal

from engine import (
    ContextLengthError,
    Engine,
    EngineInfo,
    EngineSettings,
    Failed,
    Finished,
    LanechatError,
    ModelError,
    Queued,
    SamplingParams,
    StartCancelledError,
    Started,
    Token,
    default_model_path,
    installed,
)

log = logging.getLogger(__name__)
engine_log = logging.getLogger("engine")

DRAIN_PERIOD_MS = 33
POLL_S = 0.02  # how often the GUI thread looks at a blocking call running on its thread
USAGE_PERIOD_MS = 500
DEFAULT_MISSING = "the default model is not downloaded yet"

# What a request is doing, as the bridge last heard: sent (no word from the engine yet), waiting
# (for a stream, for pool pages, for the model to load), reading (its prompt), generating.
SENT, WAITING, READING, GENERATING = "sent", "waiting", "reading", "generating"


class RequestSink(Protocol):
    """Where one request's progress goes; every method is called on the GUI thread."""

    def on_queued(self, ahead: int, reason: str) -> None: ...
    def on_started(self, prompt_tokens: int, reused: int = 0) -> None: ...  # reused: restored, not computed
    def on_text(self, text: str, tokens: int) -> None: ...  # new text since the last call, tokens so far
    def on_reasoning(self, text: str, tokens: int) -> None: ...  # the same for a thinking model's block
    def on_finished(self, event: Finished) -> None: ...
    # too_long: the engine refused the prompt as longer than the context (ContextLengthError).
    def on_failed(self, message: str, too_long: bool = False) -> None: ...


@dataclass(eq=False)
class Ticket:
    """One submitted request, before and after the engine has given it an id."""
    messages: list[dict[str, str]]
    sampling: SamplingParams | None
    sink: RequestSink
    thinking: bool | None = None  # the chat template's enable_thinking (None: the model's default)
    continue_final: bool = False  # the last message is a reply cut short, to go on with
    key: tuple[int, int] | None = None  # (engine generation, engine request id) once submitted
    tokens: int = 0  # the engine's count, as of the last Token event
    reasoning_tokens: int = 0  # of them, in the reply's thinking block
    done: bool = False
    phase: str = SENT
    reason: str = ""  # why it waits
    ahead: int = 0  # requests ahead of it, as last told to its sink
    snapshot_base: Path | None = None  # the conversation's KV snapshot path, without its ending
    snapshot: Path | None = None  # ... and with it, once the engine that runs it is known


class EngineBridge(QObject):
    """Owns the Engine; every public method is for the GUI thread."""

    state_changed = Signal()        # state, info or error changed
    progress = Signal(str, float)   # model loading: what, fraction
    usage_changed = Signal(object)  # engine.Usage, polled while an engine runs
    activity_changed = Signal()     # a request started, ended, or changed phase

    def __init__(self, engine_factory: Callable[[EngineSettings], Engine] | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._factory = engine_factory or _local_engine
        self._engine: Engine | None = None
        self._generation = 0
        self.state = "stopped"  # stopped | starting | ready | failed | unloaded (idle: reloads on the next message)
        self.error: str | None = None
        self.ready_seconds: float | None = None  # from start() to a ready engine, the last time
        self.last_active = time.monotonic()  # when a request last ran (the idle unloader reads it)
        self._starting: Engine | None = None
        self.settings: EngineSettings | None = None
        self._pending: list[Ticket] = []  # sent while the model loads
        self._tickets: dict[tuple[int, int], Ticket] = {}
        self._lock = threading.Lock()
        self._events: list[tuple[int, object]] = []
        self._drain_timer = QTimer(self, interval=DRAIN_PERIOD_MS, timeout=self._drain)
        self._usage_timer = QTimer(self, interval=USAGE_PERIOD_MS, timeout=self._poll_usage)

    @property
    def info(self) -> EngineInfo | None:
        return self._engine.info if self._engine is not None and self.state == "ready" else None

    @property
    def engine(self) -> Engine | None:
        """The running engine, for the local server (HTTP requests are more streams of it)."""
        return self._engine if self.state == "ready" else None

    @property
    def busy(self) -> int:
        """Requests submitted and not yet finished, loading ones included."""
        return len(self._pending) + len(self._tickets)

    @property
    def missing_default(self) -> bool:
        """The settings ask for the embedded default model and it has not been downloaded."""
        return self.settings is not None and self.settings.model is None and not default_model_path().is_file()

    def activity(self) -> dict[str, int]:
        """How many requests are waiting, reading their prompt and generating, as of now."""
        counts = {WAITING: len(self._pending), READING: 0, GENERATING: 0}
        for ticket in self._tickets.values():
            counts[READING if ticket.phase == SENT else ticket.phase] += 1
        return counts

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self, settings: EngineSettings) -> None:
        """(Re)start the engine with `settings`; raises LanechatError with the loader's message.

        Requests in flight on the old engine end as cancelled (their tabs keep the text so far).
        """
        await self.stop()
        self._generation += 1
        generation = self._generation
        self.settings, self.error, self.state = settings, None, "starting"
        self.state_changed.emit()
        report, poll = newest_only(self._loading)
        t0 = time.monotonic()
        try:
            engine = self._starting = self._factory(settings)
            await in_thread(engine.start, report, poll=poll)
        except Exception as e:  # noqa: BLE001 - any load failure must leave the app usable
            if generation != self._generation:  # abandoned by stop(): nobody waits for this load
                return
            self._starting = None
            self.state = "failed"
            cancelled = isinstance(e, StartCancelledError)
            self.error = "loading was cancelled" if cancelled else (
                str(e) if isinstance(e, LanechatError) else f"{type(e).__name__}: {e}")
            pending, self._pending = self._pending, []
            for ticket in pending:
                deliver(ticket.sink.on_failed, f"No model is loaded: {self.error}")
            self.state_changed.emit()
            self.activity_changed.emit()
            if isinstance(e, LanechatError):
                raise
            raise LanechatError(self.error) from e
        self._starting = None
        if generation != self._generation:  # stop() or another start() overtook this one
            await in_thread(engine.shutdown)
            return
        self.ready_seconds = time.monotonic() - t0
        self.last_active = time.monotonic()
        self._engine, self.state = engine, "ready"
        self._remember(settings.model)
        self._usage_timer.start()
        self._drain_timer.start()
        pending, self._pending = self._pending, []
        for ticket in pending:
            self._submit(ticket)
        self.state_changed.emit()
        self.activity_changed.emit()
        self._poll_usage()

    @staticmethod
    def _remember(model: str | None) -> None:
        """The model was used now (the models page and File → Recent models show it)."""
        if model and model.startswith("synthetic:"):
            return
        try:
            installed.mark_used(model or default_model_path())
        except OSError as e:
            log.warning("could not note the model as used: %s", e)

    def _loading(self, what: str, fraction: float) -> None:
        """Load progress: the signal, and the replies that wait for it say how far it is."""
        self.progress.emit(what, fraction)
        for ticket in self._pending:
            deliver(ticket.sink.on_queued, 0, f"{ticket.reason}: {what}, {fraction:.0%}")

    def cancel_start(self) -> None:
        """Stop a load in progress (start() then fails with "loading was cancelled")."""
        if self._starting is not None:
            self._starting.cancel_start()

    async def unload(self) -> None:
        """Free the model's memory; the next message loads it again (state "unloaded")."""
        if self.state != "ready" or self.busy:
            return
        await self.stop()
        self.state = "unloaded"
        self.state_changed.emit()

    async def stop(self) -> None:
        """Shut the engine down off the GUI thread (a step in progress finishes first)."""
        engine = self._detach()
        if engine is not None:
            await in_thread(engine.shutdown)
            self._drain()

    def shutdown_now(self) -> None:
        """Blocking shutdown for quitting: the event loop may already be going away."""
        engine = self._detach()
        if engine is not None:
            engine.shutdown()
            self._drain()

    def _detach(self) -> Engine | None:
        if self._starting is not None:
            self._starting.cancel_start()  # a load being abandoned stops at its next tensor
        engine, self._engine = self._engine, None
        self._usage_timer.stop()
        self._drain_timer.stop()
        if self.state in ("ready", "starting"):
            self.state = "stopped"
            self._generation += 1  # a load still running is abandoned when it returns
            self.state_changed.emit()
        return engine

    # --- requests --------------------------------------------------------------------------

    def submit(self, messages: list[dict[str, str]], sampling: SamplingParams | None,
               sink: RequestSink, thinking: bool | None = None, snapshot: Path | None = None,
               continue_final_message: bool = False) -> Ticket:
        """Send a chat; raises LanechatError (RequestError...) if the engine refuses it outright.
        An unloaded model is loaded again first (the reply says so, with the progress).

        `snapshot`: the conversation's snapshot path without its ending; the engine goes on from
        `<snapshot>.<model fingerprint>.kv` when it continues this chat, and writes it again after
        the reply (off the GUI thread) while the settings' snapshot budget is above 0.
        `continue_final_message`: the last message is a reply to go on with (Engine.submit)."""
        ticket = Ticket(messages, sampling, sink, thinking, continue_final_message, snapshot_base=snapshot)
        self.last_active = time.monotonic()
        if self.state == "unloaded" and self.settings is not None:
            ticket.phase, ticket.reason = WAITING, "loading the model again (it was unloaded while idle)"
            self._pending.append(ticket)
            deliver(sink.on_queued, 0, ticket.reason)
            asyncio.ensure_future(self._reload())
        elif self.state == "starting":
            ticket.phase, ticket.reason = WAITING, "waiting for the model to load"
            self._pending.append(ticket)
            deliver(sink.on_queued, 0, ticket.reason)
        elif self.state == "ready":
            self._submit(ticket, deliver_errors=False)
        else:
            raise LanechatError(f"No model is loaded: {self.error}" if self.error else "The engine is not running")
        self.activity_changed.emit()
        return ticket

    async def _reload(self) -> None:
        try:
            await self.start(self.settings)
        except LanechatError:
            pass  # the waiting replies were told why

    def _submit(self, ticket: Ticket, deliver_errors: bool = True) -> None:
        assert self._engine is not None
        on_event = functools.partial(self._on_event, self._generation)
        keep = self.settings is not None and self.settings.snapshot_disk_gib > 0
        if ticket.snapshot_base is not None and keep:
            ticket.snapshot = self._engine.snapshot_file(ticket.snapshot_base)
        try:
            rid = self._engine.submit(ticket.messages, ticket.sampling, on_event=on_event, thinking=ticket.thinking,
                                      resume=ticket.snapshot if keep else None,
                                      snapshot_at_end=keep and ticket.snapshot is not None,
                                      continue_final_message=ticket.continue_final)
        except LanechatError as e:
            ticket.done = True
            if not deliver_errors:
                raise
            deliver(ticket.sink.on_failed, str(e))
            return
        # Safe although the engine may already be running it: its events are only read by
        # _drain, which runs on this thread after we return.
        ticket.key, ticket.phase = (self._generation, rid), SENT
        self._tickets[ticket.key] = ticket

    def count_tokens(self, text: str) -> int | None:
        """Tokens of a text as the loaded model reads it; None while no model is loaded."""
        engine = self.engine
        return len(engine.encode(text)) if engine is not None else None

    def cancel(self, ticket: Ticket) -> None:
        """Stop a request; its sink then gets on_finished(reason="cancelled") with the text so far."""
        if ticket in self._pending:
            self._pending.remove(ticket)
            ticket.done = True
            deliver(ticket.sink.on_finished, Finished(request_id=-1, reason="cancelled", text="", tokens=0,
                                                     prompt_tokens=0, prompt_tps=0.0, decode_tps=0.0))
            self.activity_changed.emit()
        else:
            self._cancel_in_engine(ticket)

    def abandon(self, ticket: Ticket) -> None:
        """Stop a request and deliver nothing more: its tab is closing, or the app is quitting."""
        if ticket in self._pending:
            self._pending.remove(ticket)
        self._cancel_in_engine(ticket)
        ticket.done = True
        self._tickets.pop(ticket.key, None)
        self.activity_changed.emit()

    def _cancel_in_engine(self, ticket: Ticket) -> None:
        if (ticket.key is not None and not ticket.done and self._engine is not None
                and ticket.key[0] == self._generation):
            self._engine.cancel(ticket.key[1])

    # --- engine thread → GUI thread ----------------------------------------------------------

    def _on_event(self, generation: int, event: object) -> None:
        """Engine thread: buffer only; the GUI thread's drain timer picks it up."""
        with self._lock:
            self._events.append((generation, event))

    def _drain(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        if not events:
            return
        text: dict[Ticket, list[str]] = {}  # per ticket: tokens not yet delivered
        reasoning: dict[Ticket, list[str]] = {}
        phases = [(t, t.phase) for t in self._tickets.values()]
        for generation, ev in events:
            ticket = self._tickets.get((generation, ev.request_id))
            if ticket is None or ticket.done:
                continue
            if isinstance(ev, Token):
                ticket.tokens = ev.tokens
                ticket.reasoning_tokens += ev.thinking
                ticket.phase = GENERATING
                if ev.reasoning:
                    reasoning.setdefault(ticket, []).append(ev.reasoning)
                if ev.text:
                    text.setdefault(ticket, []).append(ev.text)
                continue
            # what arrived before the event that follows it
            self._flush(ticket, reasoning.pop(ticket, None), text.pop(ticket, None))
            if isinstance(ev, Queued):
                ticket.phase, ticket.reason = WAITING, ev.reason
                ticket.ahead = min(ev.ahead, self._waiting_ahead_of(ticket))
                deliver(ticket.sink.on_queued, ticket.ahead, ev.reason)
            elif isinstance(ev, Started):
                ticket.phase = READING
                deliver(ticket.sink.on_started, ev.prompt_tokens, ev.reused)
            elif isinstance(ev, (Finished, Failed)):
                ticket.done = True
                del self._tickets[ticket.key]
                if isinstance(ev, Finished):
                    self._save_snapshot(ticket, ev)
                    deliver(ticket.sink.on_finished, ev)
                elif isinstance(ev.refusal, ContextLengthError):
                    deliver(ticket.sink.on_failed, ev.message, True)
                else:
                    deliver(ticket.sink.on_failed, ev.message)
        for ticket in {**reasoning, **text}:
            self._flush(ticket, reasoning.get(ticket), text.get(ticket))
        self._recount_waiting()
        if phases != [(t, t.phase) for t in self._tickets.values()]:
            self.activity_changed.emit()

    def _waiting_ahead_of(self, ticket: Ticket) -> int:
        """Requests sent before `ticket` that still wait: the engine's count can include ones it
        was about to start, so the app counts what it knows instead."""
        ahead = 0
        for other in self._tickets.values():
            if other is ticket:
                return ahead
            ahead += other.phase == WAITING
        return ahead

    def _recount_waiting(self) -> None:
        """Tell waiting requests when the number ahead of them went down."""
        for ticket in list(self._tickets.values()):
            if ticket.phase == WAITING and not ticket.done:
                ahead = min(ticket.ahead, self._waiting_ahead_of(ticket))
                if ahead != ticket.ahead:
                    ticket.ahead = ahead
                    deliver(ticket.sink.on_queued, ahead, ticket.reason)

    def _save_snapshot(self, ticket: Ticket, ev: Finished) -> None:
        """The finished reply's KV state to its file, on the engine's writer thread."""
        if (ticket.snapshot is None or self._engine is None or self.settings is None
                or ev.reason not in ("eos", "stop", "length", "cancelled")):
            return
        budget = int(self.settings.snapshot_disk_gib * (1 << 30))
        if budget > 0:
            name = ticket.snapshot.name
            self._engine.save_snapshot(ticket.key[1], ticket.snapshot, budget,
                                       lambda error: error and log.warning("snapshot %s not written: %s", name, error))

    @staticmethod
    def _flush(ticket: Ticket, reasoning: list[str] | None, parts: list[str] | None) -> None:
        if reasoning:
            deliver(ticket.sink.on_reasoning, "".join(reasoning), ticket.reasoning_tokens)
        if parts:
            deliver(ticket.sink.on_text, "".join(parts), ticket.tokens)

    def _poll_usage(self) -> None:
        if self._engine is not None and self.state == "ready":
            usage = self._engine.usage()
            if usage.active or usage.waiting or self._tickets:  # the local server's streams count too
                self.last_active = time.monotonic()
            self.usage_changed.emit(usage)


def _local_engine(settings: EngineSettings) -> Engine:
    if settings.model is None and not default_model_path().is_file():
        raise ModelError(DEFAULT_MISSING)  # the loader's message names a terminal command
    # The engine's own lines (the plan, backend fallbacks) go to the log, not to stdout.
    return Engine(settings, log=engine_log.info)


def deliver(method: Callable[..., None], *args: object) -> None:
    # One tab's broken handler must not stop the other tabs' streams.
    try:
        method(*args)
    except Exception:  # noqa: BLE001
        log.exception("request sink %s failed", method)


def newest_only(emit: Callable[..., None]) -> tuple[Callable[..., None], Callable[[], None]]:
    """A progress callback for a worker thread that keeps only its newest report, and the poll
    that hands that report to `emit` on the GUI thread (plain data crosses, never a signal)."""
    reports: list[tuple] = []

    def report(*args: object) -> None:
        reports.append(args)

    def poll() -> None:
        n = len(reports)  # what arrives while this runs waits for the next poll
        if n:
            emit(*reports[n - 1])
            del reports[:n]
    return report, poll


async def in_thread(fn: Callable[..., object], *args: object, poll: Callable[[], None] = lambda: None) -> object:
    """Run a blocking call on a plain thread; the GUI thread waits by polling (calling `poll`
    each time), so nothing but plain Python data crosses threads."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised on the GUI thread
            box["error"] = e
    thread = threading.Thread(target=run, name=f"lanechat-{getattr(fn, '__name__', 'call')}", daemon=True)
    thread.start()
    while thread.is_alive():
        await asyncio.sleep(POLL_S)
        poll()
    poll()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("result")

