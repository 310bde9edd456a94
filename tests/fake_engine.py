"""A stand-in for the Engine's public surface, for the bridge and the status bar: each request
types `n` tokens from its own thread; `reading` holds requests after Started (a prompt being read),
`queue_first` makes every request after the first wait (Queued) until the one before it ends;
`think` tokens of each reply are its thinking block."""
import threading
import time

import pytest

from app.engine_bridge import EngineBridge
from engine import EngineInfo, Finished, ModelError, Queued, RequestError, StartCancelledError, Started, Token, Usage


class Sink:
    def __init__(self):
        self.calls = []
        self.text = ""
        self.text_times = []

    def on_queued(self, ahead, reason):
        self.calls.append(("queued", ahead, reason))

    def on_started(self, prompt_tokens, reused=0):
        self.calls.append(("started", prompt_tokens))
        self.reused = reused

    def on_text(self, text, tokens):
        self.calls.append(("text", text, tokens))
        self.text += text
        self.text_times.append(time.monotonic())

    def on_reasoning(self, text, tokens):
        self.calls.append(("reasoning", text, tokens))

    def on_finished(self, event):
        self.calls.append(("finished", event.reason))

    def on_failed(self, message, too_long=False):
        self.calls.append(("failed", message))

    @property
    def done(self):
        return bool(self.calls) and self.calls[-1][0] in ("finished", "failed")


class FakeEngine:
    """The Engine's public surface; each request types `n` tokens from its own thread."""

    def __init__(self, settings, n=300, gap=0.0005, fail_start=None, refuse=None, hold=False, reading=False,
                 queue_first=False, info="fake-info", think=0):
        self.settings, self.n, self.gap, self.fail_start, self.refuse = settings, n, gap, fail_start, refuse
        self.cancelled = set()
        self.next_id = 0
        self.threads = []
        self.callbacks = {}
        self.saved = []  # (request id, path) of every save_snapshot
        self.release = threading.Event()  # start() loads until this is set
        if not hold:
            self.release.set()
        self.read = threading.Event()  # with reading=True, prompts are read until this is set
        if not reading:
            self.read.set()
        self.queue_first = queue_first
        self.info = info
        self.think = think
        self.thinking = {}  # request id → the thinking flag it was submitted with
        self.requests = {}  # request id → its messages, sampling and continue_final flag
        self.start_cancelled = threading.Event()
        self.turn = threading.Condition()
        self.running = None  # with queue_first: the request generating now
        self.waiting = []  # with queue_first: the requests not yet generating, in the order they came

    def start(self, progress=None):
        while not self.release.wait(0.01):
            if self.start_cancelled.is_set():
                raise StartCancelledError("loading the model was cancelled")
        if progress:
            progress("loading", 0.5)
        if self.fail_start:
            raise ModelError(self.fail_start)

    def cancel_start(self):
        self.start_cancelled.set()

    def snapshot_file(self, base):
        return base.with_name(base.name + ".fake.kv")

    def save_snapshot(self, rid, path, budget_bytes, done=lambda error: None):
        self.saved.append((rid, path))
        done("no snapshot")  # a fake engine keeps no K/V

    def submit(self, messages, sampling=None, on_event=None, thinking=None, resume=None, snapshot_at_end=False,
               continue_final_message=False):
        if self.refuse:
            raise RequestError(self.refuse)
        self.next_id += 1
        rid = self.next_id
        self.requests[rid] = dict(messages=messages, sampling=sampling, continue_final=continue_final_message)
        if self.queue_first:
            with self.turn:
                self.waiting.append(rid)  # here, not on its thread: turns go in the order requests came
        self.thinking[rid] = thinking
        self.callbacks[rid] = on_event
        t = threading.Thread(target=self._run, args=(rid, on_event), daemon=True)
        self.threads.append(t)
        t.start()
        return rid

    def _run(self, rid, on_event):
        if self.queue_first:
            with self.turn:
                if self.running is not None or self.waiting[0] != rid:
                    on_event(Queued(rid, self.waiting.index(rid) - (self.running is None)))
                while (self.running is not None or self.waiting[0] != rid) and rid not in self.cancelled:
                    self.turn.wait(0.01)
                self.waiting.remove(rid)
                if rid in self.cancelled and (self.running is not None or self.waiting and self.waiting[0] < rid):
                    self.turn.notify_all()  # cancelled while it waited: it never had its turn
                    on_event(Finished(rid, "cancelled", "", 0, 5, 1.0, 1.0))
                    return
                self.running = rid
        on_event(Started(rid, 0, 5))
        while not self.read.wait(0.01):
            if rid in self.cancelled:
                break
        try:
            self._type(rid, on_event)
        finally:
            with self.turn:
                self.running = None
                self.turn.notify_all()

    def _type(self, rid, on_event):
        for i in range(self.n):
            if rid in self.cancelled:
                think = min(self.think, i)
                on_event(Finished(rid, "cancelled", "x" * (i - think), i, 5, 1.0, 1.0, reasoning="r" * think,
                                  reasoning_tokens=think))
                return
            on_event(Token(rid, 1, "", i + 1, "r", True) if i < self.think else Token(rid, 1, "x", i + 1))
            time.sleep(self.gap)
        think = min(self.think, self.n)
        on_event(Finished(rid, "length", "x" * (self.n - think), self.n, 5, 1.0, 100.0, reasoning="r" * think,
                          reasoning_tokens=think))

    def cancel(self, rid):
        self.cancelled.add(rid)

    def encode(self, text):
        return text.split()  # a word a token

    def usage(self):
        return Usage(1, 10, 1, 0)

    def shutdown(self):
        for rid in range(1, self.next_id + 1):
            self.cancelled.add(rid)
        for t in self.threads:
            t.join()


_LIVE: list = []  # every fake engine of the running test


@pytest.fixture(autouse=True)
def _stop_fake_engines():
    """No fake engine thread may outlive its test: it would emit into a deleted bridge."""
    yield
    while _LIVE:
        _LIVE.pop().shutdown()


def bridge_with(**kw):
    engines = []

    def factory(settings):
        engines.append(FakeEngine(settings, **kw))
        _LIVE.append(engines[-1])
        return engines[-1]
    return EngineBridge(factory), engines


FAKE_INFO = EngineInfo("fake-model", "numpy", "CPU", "plan: one window", 10, 512, 1)


def fake_window(qtbot, **kw):
    """The window of the saved session (LANECHAT_HOME: use app_home) over a fake engine, shown and
    not started; `kw` goes to the FakeEngine."""
    from app.main import create_window

    bridge, _ = bridge_with(info=kw.pop("info", FAKE_INFO), **kw)
    window = create_window(bridge)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window
