"""The engine thread: start, submit from another thread, events, cancel, shutdown, errors."""
import threading

import pytest

from engine import (Engine, EngineSettings, Failed, Finished, LanechatError, PlanError, SamplingParams, Started,
                    Token)


def settings(**kw):
    return EngineSettings(**{**dict(model="synthetic:tiny-llama", backend="numpy", parallel=2, context=512,
                                    paging="all", page_tokens=16, memory_gib=1), **kw})


def test_two_streams_run_and_one_is_cancelled():
    eng = Engine(settings(), log=lambda m: None)
    progress = []
    eng.start(lambda msg, f: progress.append(f))
    assert progress[-1] == 1.0 and eng.info.plan_line.startswith("plan: the engine's own and 1 more")
    done = {1: threading.Event(), 2: threading.Event()}
    events = {1: [], 2: []}

    def on(e):
        events[e.request_id].append(e)
        if isinstance(e, Finished):
            done[e.request_id].set()
        if isinstance(e, Token) and e.request_id == 2 and len(events[2]) == 4:
            eng.cancel(2)

    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    eng.submit([{"role": "user", "content": "hello"}], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), on)
    eng.submit([{"role": "user", "content": "world"}], long, on)
    assert done[1].wait(30) and done[2].wait(30)
    assert events[1][-1].reason == "length" and events[1][-1].tokens == 20
    assert events[2][-1].reason == "cancelled" and events[2][-1].tokens < 400
    assert any(isinstance(e, Started) for e in events[1])
    eng.shutdown()
    assert eng.usage().pages_used == 0


def test_bad_requests_and_models_say_why():
    eng = Engine(settings(context=32), log=lambda m: None)
    eng.start()
    got = []
    done = threading.Event()
    eng.submit([{"role": "user", "content": "x" * 100}], on_event=lambda e: (got.append(e), done.set()))
    assert done.wait(30) and isinstance(got[0], Failed) and "does not fit" in got[0].message
    with pytest.raises(PlanError, match="temperature"):
        eng.submit([{"role": "user", "content": "x"}], SamplingParams(temperature=float("nan")))
    eng.shutdown()
    with pytest.raises(LanechatError, match="unknown synthetic model"):
        Engine(settings(model="synthetic:nope"), log=lambda m: None).start()


def test_shutdown_cancels_in_flight_requests():
    eng = Engine(settings(), log=lambda m: None)
    eng.start()
    got = []
    eng.submit([{"role": "user", "content": "go"}], SamplingParams(temperature=0, max_tokens=10**6, ignore_eos=True),
               got.append)
    eng.shutdown()
    assert isinstance(got[-1], Finished) and got[-1].reason == "shutdown"
