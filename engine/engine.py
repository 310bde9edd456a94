"""Engine: one thread owns the model, the KV store and every GPU call; requests come in by a queue.

`Runner` is the same machinery without the thread (CLI, gates, bench): load once, build schedulers.
"""
from __future__ import annotations

import functools
import itertools
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from .continuation import continuation
from .errors import ContextLengthError, DeviceLostError, LanechatError, RequestError, StartCancelledError
from .events import Event, Failed, Finished
from .fingerprint import fingerprint
from .kv import snapshots
from .models import build
from .ops.base import Backend
from .plan import Plan, make_plan
from .scheduler import Scheduler, Sequence, Snapshot
from .settings import EngineSettings, SamplingParams
from .textstream import TextStream
from .thinking import Splitter, opens_inside, template_default
from .weights import Model

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class EngineInfo:
    model_name: str
    backend: str
    device: str
    plan_line: str
    pages_total: int
    context: int
    parallel: int
    plan: Plan | None = None  # the plan the engine runs (plan_line is its line)
    # The chat template's own enable_thinking: True or False, None for a model without the toggle.
    thinking: bool | None = None
    unified: bool = False  # the model's memory is the desktop's (a GB10, or the CPU backend's host RAM)
    timings: tuple[tuple[str, float], ...] = ()  # seconds per start stage (Runner.timings + kv, graphs), in order
    fingerprint: str = ""  # what this engine's KV snapshot files carry (engine.fingerprint)


@dataclass(frozen=True)
class Usage:
    pages_used: int
    pages_total: int
    active: int
    waiting: int


class Runner:
    """A loaded model on a backend; makes schedulers for any KV settings (same weights), each with a
    cache of its own.

    `progress(what, fraction)` runs on the loading thread between tensors and layers; when `cancel`
    is set, the next one raises StartCancelledError instead. `timings` has the seconds of each stage.
    """

    def __init__(self, settings: EngineSettings, progress: Progress | None = None, log=print,
                 cancel: threading.Event | None = None):
        from .ops import get_backend
        settings.validate()

        def say(what: str, fraction: float) -> None:
            if cancel is not None and cancel.is_set():
                raise StartCancelledError("loading the model was cancelled")
            if progress:
                progress(what, fraction)
        self.timings: dict[str, float] = {}
        t = time.perf_counter()
        backend = get_backend(settings.backend, log=log)
        t = self.timed("backend", t)
        say("reading the model", 0.02)
        if settings.model and settings.model.startswith("synthetic:"):
            from .synthetic import synthetic
            loaded = synthetic(settings.model.split(":", 1)[1])
        else:
            from .loader import load_model
            loaded = load_model(settings.model, lambda what, f: say(what, 0.02 + 0.58 * f))
        t = self.timed("weights", t)
        where = f"preparing weights on {backend.device}"
        say(where, 0.6)
        self._prepare(loaded, backend, lambda f: say(where, 0.6 + 0.38 * f))
        self.timed("prepare", t)
        say("weights ready", 0.98)

    def timed(self, stage: str, since: float) -> float:
        now = time.perf_counter()
        self.timings[stage] = now - since
        return now

    @classmethod
    def from_model(cls, loaded: Model, backend: Backend) -> "Runner":
        """A Runner for a model already in memory (the bench's synthetic weights built on the GPU)."""
        runner = cls.__new__(cls)
        runner.timings = {}
        runner._prepare(loaded, backend)
        return runner

    def _prepare(self, loaded: Model, backend: Backend, progress: Callable[[float], None] | None = None) -> None:
        self.backend, self.loaded, self.tokenizer = backend, loaded, loaded.tokenizer
        self.model = build(loaded, backend, progress)
        self._drafters: dict[str, tuple[object | None, str | None]] = {}
        backend.synchronize()

    def drafter_weights(self, settings: EngineSettings) -> tuple[object | None, str | None]:
        """(the settings' DFlash2 checkpoint prepared on the backend, None) or (None, why it does
        not load for this model); read and checked once per path, shared by every scheduler."""
        if settings.drafter != "dflash2" or not settings.drafter_model:
            return None, None
        path = settings.drafter_model
        if path not in self._drafters:
            from .drafters.dflash2 import DFlash2Weights
            from .drafters.dflash2_weights import read
            try:
                self._drafters[path] = DFlash2Weights(*read(path, self.loaded.config), self.backend), None
            except LanechatError as e:  # a drafter that does not load leaves the engine plain, not stopped
                self._drafters[path] = None, str(e)
            self.backend.synchronize()
        return self._drafters[path]

    @functools.cached_property
    def fingerprint(self) -> str:
        """What a KV snapshot of this model on this backend carries (engine.fingerprint)."""
        return fingerprint(self.loaded, self.backend.name)

    def plan(self, settings: EngineSettings) -> Plan:
        # Weights are already in memory: the budget is a share of what is free now.
        cfg = self.loaded.config
        error = self.drafter_weights(settings)[1]
        return make_plan(cfg, settings, self.backend.free_memory(), 0, self.backend.unified_memory,
                         self.backend.graph_bytes(cfg, settings), drafter_error=error)

    def scheduler(self, settings: EngineSettings, kv_store: str | None = None) -> Scheduler:
        """A scheduler with a cache of its own; kv_store: tests' lossless `kv.cache.F32` K/V."""
        plan = self.plan(settings)
        weights = self.drafter_weights(settings)[0] if plan.drafter == "dflash2" else None
        return Scheduler(settings, plan, self.model, self.backend, self.tokenizer, kv_store, weights)

    def thinking_default(self) -> bool | None:
        """The chat template's enable_thinking default (engine.thinking.template_default)."""
        if not self.tokenizer.thinks:
            return None
        return template_default(lambda chat, **extra: self.tokenizer.render_chat(chat, **extra))

    def sequence(self, rid: int, settings: EngineSettings, messages: list[dict] | None, sampling: SamplingParams | None,
                 on_event: Callable[[Event], None], prompt_ids: list[int] | None = None,
                 resume: Snapshot | None = None, snapshot_at_end: bool = False,
                 thinking: bool | None = None, continue_final_message: bool = False,
                 known: Iterable = ()) -> Sequence:
        """Tokenize and check a request before any work; RequestError when it cannot run.
        `thinking` is the chat template's enable_thinking (None: the template's default); a chat of
        a thinking model gets its reply split into reasoning and content.

        With `resume` alone the stream goes on from the snapshot's tokens; with `resume` and a
        prompt, from the snapshot's state if it covers a prefix of the prompt (only the rest is
        computed), else from scratch.

        `continue_final_message`: the chat's last message is a reply to go on with (engine.continuation;
        `known`: token lists of earlier streams, a snapshot's first, that may have written it)."""
        params = (sampling or settings.sampling).validate()
        if thinking is not None and not isinstance(thinking, bool):
            raise RequestError("thinking must be true, false or left out")
        if resume is not None and resume.kv_dtype != settings.kv_dtype:
            raise RequestError(f"snapshot holds {resume.kv_dtype} KV, the engine runs {settings.kv_dtype}")
        think = None
        prompted = messages is not None or prompt_ids is not None
        extra = {} if thinking is None else {"enable_thinking": thinking}
        reply_start = None
        if resume is not None and not prompted:
            ids = list(resume.tokens)
            prompt_len = resume.prompt_len
        elif prompt_ids is not None:
            if not isinstance(prompt_ids, (list, tuple)) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids):
                raise RequestError("prompt ids must be a list of whole numbers")
            ids = list(prompt_ids)
            prompt_len = len(ids)
        elif continue_final_message:
            known = ([resume.tokens] if resume is not None else []) + list(known)
            cont = continuation(self.tokenizer, check_messages(messages), settings.context, extra, known)
            ids, reply_start, think = cont.ids, cont.reply_start, cont.think
            prompt_len = len(ids)
        else:
            text, ids = self.tokenizer.chat_prompt(check_messages(messages), limit=settings.context, **extra)
            prompt_len = len(ids)
            if self.tokenizer.thinks:
                think = Splitter(opens_inside(text))
        if not ids:
            raise RequestError("empty prompt")
        if len(ids) >= settings.context:
            raise ContextLengthError(f"prompt of {len(ids)} tokens does not fit the context of {settings.context} "
                                     "tokens; shorten the conversation or raise the context in settings")
        if max(ids) >= self.loaded.config.vocab or min(ids) < 0:
            raise RequestError(f"token id out of the model's vocabulary (0..{self.loaded.config.vocab - 1})")
        if resume is not None and prompted and not resume.continues(ids):
            resume = None  # an edit, a regenerate or another branch: recompute
        detok = self.tokenizer.stream()
        # a resumed stream's text so far, or the reply a continuation goes on with
        primed = "".join(detok.push(t) for t in ids[prompt_len if reply_start is None else reply_start:])
        if resume is not None and not prompted and self.tokenizer.thinks:
            # the prompt's end says whether the reply began inside a think block; its text so far says where it is
            think = Splitter(opens_inside(self.tokenizer.decode(ids[max(0, prompt_len - 64):prompt_len])))
            think.feed(primed)
        return Sequence(rid, ids, prompt_len, params, guarded(on_event), TextStream(detok, params.stop),
                        snapshot_at_end, resume, cold=resume is None, think=think)


def check_messages(messages: object) -> list[dict]:
    """A chat as the engine takes it: a list of {"role": str, "content": str} (other keys pass through
    to the chat template: an assistant's `reasoning_content` is its thinking block, which the template
    keeps or drops); RequestError names the first message that is not one."""
    if not isinstance(messages, list):
        raise RequestError(f"messages must be a list, not {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RequestError(f"message {i} must be an object with a string role and string content")
        if m.get("reasoning_content") is not None and not isinstance(m["reasoning_content"], str):
            raise RequestError(f"message {i}: reasoning_content must be a string")
    return messages


def guarded(on_event: Callable[[Event], None]) -> Callable[[Event], None]:
    """A caller's callback that raises must not take the engine thread (or other streams) down."""
    def call(event: Event) -> None:
        try:
            on_event(event)
        except Exception:
            traceback.print_exc()
    return call


class Engine:
    """The app's engine: start, submit/cancel from any thread, events back through callbacks."""

    def __init__(self, settings: EngineSettings, log: Callable[[str], None] = print):
        self.settings = settings.validate()
        self.log = log
        self._inbox: queue.Queue = queue.Queue()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._cancel = threading.Event()
        self._error: BaseException | None = None
        self._usage = Usage(0, 0, 0, 0)
        self.info: EngineInfo | None = None
        self.runner: Runner | None = None
        self.restarts = 0  # after device faults
        self._writer: queue.Queue | None = None  # snapshots for the writer thread
        # Called on the engine thread with every scheduler the engine builds (at start and after a
        # restart): where tests and tools attach a step observer or a fault hook.
        self.on_scheduler: Callable[[Scheduler], None] | None = None

    # --- lifecycle ------------------------------------------------------------------------
    def start(self, progress: Progress | None = None) -> None:
        """Load the model on the engine thread; blocks until ready, raises LanechatError on failure
        (StartCancelledError when `cancel_start` was called from another thread meanwhile)."""
        self._thread = threading.Thread(target=self._main, args=(progress,), name="lanechat-engine", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def cancel_start(self) -> None:
        """Any thread: stop a load in progress at its next tensor or layer (start raises StartCancelledError);
        nothing once the engine is running."""
        if not self._ready.is_set():
            self._cancel.set()

    def shutdown(self) -> None:
        """Stop the engine thread; snapshot files being written are finished first."""
        self.cancel_start()  # a load in progress stops early
        if self._thread and self._thread.is_alive():
            self._inbox.put(("stop",))
            self._thread.join()
        if self._writer is not None:
            self._writer.put(None)
            self._writer_thread.join()
            self._writer = None

    # --- requests (any thread) ------------------------------------------------------------
    def submit(self, messages: list[dict] | None, sampling: SamplingParams | None = None,
               on_event: Callable[[Event], None] = lambda e: None, prompt_ids: list[int] | None = None,
               resume: Snapshot | Path | None = None, snapshot_at_end: bool = False,
               thinking: bool | None = None, continue_final_message: bool = False) -> int:
        """Queue a request and return its id at once. The sampling settings are checked here (PlanError);
        the chat template, tokenizing and the prompt checks run on the engine thread, never the
        caller's, and a request they refuse ends with a Failed event saying why. `thinking`: the
        template's enable_thinking for this chat (None: the model's default, `info.thinking`).

        `resume`: a snapshot, or the path of a snapshot file, to go on from (see Runner.sequence);
        a file that does not fit this engine is logged, deleted and ignored (the prompt is then
        computed). `Started.reused` says how many positions came from it.

        `continue_final_message`: the last message is an assistant reply cut short; the request
        goes on with it (engine.continuation), from the snapshot's or the prompt cache's state of
        the stream that wrote it when there is one, and its events carry only what follows."""
        if self.runner is None or not self._thread.is_alive():
            raise RequestError("the engine is not running" + (f": {self._error}" if self._error else ""))
        (sampling or self.settings.sampling).validate()
        rid = next(self._ids)
        self._inbox.put(("add", rid, messages, sampling, on_event, prompt_ids, resume, snapshot_at_end, thinking,
                         continue_final_message))
        return rid

    def cancel(self, rid: int) -> None:
        self._inbox.put(("cancel", rid))

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no chat template), with the special tokens the model adds
        to a document; for raw-prompt requests (the server's /v1/completions)."""
        if self.runner is None:
            raise RequestError("the engine is not running")
        return self.runner.tokenizer.encode(text, add_special=True)

    def usage(self) -> Usage:
        return self._usage

    def snapshot_file(self, base: Path) -> Path:
        """`<base>.<model fingerprint>.kv`: a conversation's snapshot file for this model and
        backend (another model's file is never taken for this one's)."""
        return base.with_name(f"{base.name}.{self.info.fingerprint}.kv")

    def save_snapshot(self, rid: int, path: Path, budget_bytes: int,
                      done: Callable[[str | None], None] = lambda error: None) -> None:
        """Write the snapshot a finished `snapshot_at_end` request left to `path` (atomically, off
        the engine thread), then remove the oldest files of its folder past `budget_bytes`;
        `done` gets None or the error, on the writer's thread. No snapshot: done("no snapshot")."""
        self._inbox.put(("save", rid, Path(path), budget_bytes, done))

    def snapshot(self, rid: int) -> Snapshot | None:
        """The state a finished `snapshot_at_end` request left (taken once)."""
        if self._thread is None or not self._thread.is_alive():
            return None
        box: queue.Queue = queue.Queue()
        self._inbox.put(("snapshot", rid, box))
        return box.get()

    # --- the thread -----------------------------------------------------------------------
    def _main(self, progress: Progress | None) -> None:
        try:
            self.runner = Runner(self.settings, progress, self.log, self._cancel)
            t = time.perf_counter()
            sched = self.runner.scheduler(self.settings)
            self.runner.backend.synchronize()
            t = self.runner.timed("kv", t)
            if progress:
                progress("preparing decode steps", 0.99)
            self._warm(sched)
            self.runner.timed("graphs", t)
        except LanechatError as e:
            self._error = e
        except Exception as e:  # a loader bug must still reach the user as one line
            self._error = LanechatError(f"could not start the engine: {type(e).__name__}: {e}")
            traceback.print_exc()
        if self._error is not None:
            self._ready.set()
            return
        b, lm = self.runner.backend, self.runner.loaded
        self.info = EngineInfo(lm.name, b.name, b.device, sched.plan.line, sched.plan.pages_total,
                               self.settings.context, self.settings.parallel, sched.plan,
                               self._thinking_default(), bool(b.unified_memory) or b.name == "numpy",
                               tuple(self.runner.timings.items()), self.runner.fingerprint)
        self.log(sched.plan.line)
        if progress:
            progress("ready", 1.0)
        if self.on_scheduler is not None:
            self.on_scheduler(sched)
        self._ready.set()
        self._loop(sched)

    def _warm(self, sched: Scheduler) -> None:
        """The decode graphs of every batch size, captured now; they are an optimisation, so a
        failure other than a lost device leaves them to be captured at first use, as before."""
        try:
            sched.warm_decode()
            self.runner.backend.synchronize()
        except DeviceLostError:
            raise
        except Exception as e:
            self.log(f"engine: decode graphs not captured at start ({type(e).__name__}: {e}); "
                     "each is captured at its first step")

    def _thinking_default(self) -> bool | None:
        try:
            return self.runner.thinking_default()
        except LanechatError as e:  # a template that fails here fails every chat: the first one says so
            self.log(f"thinking: the chat template cannot be probed ({e})")
            return None

    def _restart(self, sched: Scheduler, fault: DeviceLostError) -> Scheduler | None:
        """After a device fault: every stream ends interrupted with one message, then a fresh
        backend, model and cache; None (the engine stops, saying why) when that fails too."""
        message = f"interrupted: {fault}; the engine restarted, send again to continue"
        self.log(f"engine: {fault}; restarting")
        for seq in list(sched.waiting) + list(sched.active):
            seq.on_event(Failed(seq.id, message))
        sched.waiting.clear()
        sched.active.clear()
        try:
            self.runner = Runner(self.settings, None, self.log)
            fresh = self.runner.scheduler(self.settings)
            self._warm(fresh)
        except Exception as e:  # a lost CUDA context usually stays lost for this process
            self._error = LanechatError(f"the engine could not restart after a device fault ({e}); "
                                        "restart Lanechat")
            self.log(f"engine: {self._error}")
            return None
        self.restarts += 1
        if self.on_scheduler is not None:
            self.on_scheduler(fresh)
        return fresh

    def _add(self, sched: Scheduler, rid: int, messages: list[dict] | None, sampling: SamplingParams | None,
             on_event: Callable[[Event], None], prompt_ids: list[int] | None, resume: Snapshot | None,
             snapshot_at_end: bool, thinking: bool | None, continue_final_message: bool) -> None:
        try:
            if isinstance(resume, Path):
                resume = self._read_snapshot(resume, sched)
            seq = self.runner.sequence(rid, self.settings, messages, sampling, on_event, prompt_ids, resume,
                                       snapshot_at_end, thinking, continue_final_message,
                                       sched.prompt_cache.ends() if sched.prompt_cache is not None else ())
            sched.add(seq)
        except LanechatError as e:
            guarded(on_event)(Failed(rid, str(e), e))
        except Exception as e:  # a bug must cost this request, not the engine thread
            traceback.print_exc()
            guarded(on_event)(Failed(rid, f"engine error: {type(e).__name__}: {e}"))

    def _read_snapshot(self, path: Path, sched: Scheduler) -> Snapshot | None:
        if not path.is_file():
            return None
        try:
            snap = snapshots.load(path, self.runner.fingerprint, self.settings.kv_dtype, self.runner.backend.landing())
            if (why := sched.cache.mismatch(snap.cache)) is not None:
                raise snapshots.SnapshotError(f"{path.name}: {why}")
            return snap
        except snapshots.SnapshotError as e:
            self.log(f"engine: snapshot ignored and deleted, the conversation is recomputed: {e}")
            path.unlink(missing_ok=True)
            return None

    def _save(self, sched: Scheduler, rid: int, path: Path, budget: int, done: Callable[[str | None], None]) -> None:
        snap = sched.snapshots.pop(rid, None)
        if snap is None:
            return guarded(done)("no snapshot")
        if self._writer is None:
            self._writer = queue.Queue()
            self._writer_thread = threading.Thread(target=write_snapshots, args=(self._writer, self.log),
                                                   name="lanechat-snapshots", daemon=True)
            self._writer_thread.start()
        self._writer.put((snap, path, budget, self.runner.fingerprint, self.settings.page_tokens, done))

    def _loop(self, sched: Scheduler) -> None:
        while True:
            try:
                cmd = self._inbox.get(block=not sched.busy)
            except queue.Empty:
                cmd = None
            while cmd is not None:
                if cmd[0] == "stop":
                    sched.cancel_all("shutdown")
                    return
                if cmd[0] == "add":
                    self._add(sched, *cmd[1:])
                elif cmd[0] == "cancel":
                    sched.cancel(cmd[1])
                elif cmd[0] == "snapshot":
                    cmd[2].put(sched.snapshots.pop(cmd[1], None))
                elif cmd[0] == "save":
                    self._save(sched, *cmd[1:])
                try:
                    cmd = self._inbox.get_nowait()
                except queue.Empty:
                    cmd = None
            if sched.busy:
                try:
                    sched.step()
                except DeviceLostError as fault:
                    sched = self._restart(sched, fault)
                    if sched is None:
                        return
            lanes = sched.lanes
            self._usage = Usage(lanes.pages_used(), lanes.total_pages, len(sched.active), len(sched.waiting))


def write_snapshots(jobs: queue.Queue, log: Callable[[str], None]) -> None:
    """The snapshot writer's thread: files are written here, never on the engine or GUI thread.
    A None job ends it (the engine shut down)."""
    while (job := jobs.get()) is not None:
        snap, path, budget, fp, page_tokens, done = job
        try:
            if budget <= 0:
                raise OSError("the snapshot budget is 0")
            snapshots.save(path, snap, fp, page_tokens)
            snapshots.prune(path.parent, budget, keep=path)
        except Exception as e:  # a full disk must cost this snapshot, not the engine
            log(f"engine: snapshot not written ({path.name}): {e}")
            guarded(done)(f"{type(e).__name__}: {e}")
            continue
        guarded(done)(None)


def run_to_end(sched: Scheduler, seqs: list[Sequence]) -> dict[int, Finished | Failed]:
    """Drive a scheduler on this thread until every sequence ended (CLI, gates, bench): by request
    id, its Finished event, or the Failed event of a stream that failed."""
    done: dict[int, Finished | Failed] = {}
    for seq in seqs:
        inner = seq.on_event

        def on_event(e, inner=inner):
            if isinstance(e, (Finished, Failed)):
                done[e.request_id] = e
            inner(e)
        seq.on_event = on_event
        sched.add(seq)
    while sched.busy:
        sched.step()
    return done
