"""The engine ↔ Qt bridge without a window: coalescing, ordering, loading, restarts, failures."""
import pytest
from fake_engine import Sink, _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here

from app.engine_bridge import EngineBridge
from engine import EngineSettings, Finished, LanechatError, ModelError, RequestError, SamplingParams
from engine.kv import snapshots


def test_tokens_are_coalesced_and_in_order(qtbot, run_async):
    bridge, _ = bridge_with(n=400)
    run_async(bridge.start(EngineSettings()))
    assert bridge.state == "ready" and bridge.info == "fake-info"
    sink = Sink()
    bridge.submit([{"role": "user", "content": "hi"}], None, sink)
    qtbot.waitUntil(lambda: sink.done, timeout=10000)
    texts = [c for c in sink.calls if c[0] == "text"]
    assert sink.text == "x" * 400
    assert texts[-1][2] == 400  # the running token count
    assert len(texts) < 100  # ~0.2 s of tokens at ~30 updates a second, not 400 signals
    assert sink.calls[0] == ("started", 5) and sink.calls[-1] == ("finished", "length")
    gaps = [b - a for a, b in zip(sink.text_times, sink.text_times[1:])]
    assert min(gaps) > 0.02  # never faster than ~30 Hz


def test_two_requests_stream_at_once(qtbot, run_async):
    bridge, _ = bridge_with(n=200, gap=0.002)
    run_async(bridge.start(EngineSettings()))
    a, b = Sink(), Sink()
    bridge.submit([], None, a)
    bridge.submit([], None, b)
    qtbot.waitUntil(lambda: a.done and b.done, timeout=10000)
    assert a.text_times[0] < b.text_times[-1] and b.text_times[0] < a.text_times[-1]


def test_cancel_and_usage(qtbot, run_async):
    bridge, _ = bridge_with(n=100000, gap=0.001)
    run_async(bridge.start(EngineSettings()))
    with qtbot.waitSignal(bridge.usage_changed, timeout=2000) as usage:
        pass
    assert usage.args[0].pages_total == 10
    sink = Sink()
    ticket = bridge.submit([], None, sink)
    qtbot.waitUntil(lambda: bool(sink.text), timeout=5000)
    bridge.cancel(ticket)
    qtbot.waitUntil(lambda: sink.done, timeout=5000)
    assert sink.calls[-1] == ("finished", "cancelled") and bridge.busy == 0


def test_requests_sent_while_loading_wait_then_run(qtbot, run_async, qasync_loop):
    import asyncio
    bridge, engines = bridge_with(n=3, hold=True)
    started = asyncio.ensure_future(bridge.start(EngineSettings()))
    qtbot.waitUntil(lambda: bridge.state == "starting", timeout=2000)
    sink = Sink()
    bridge.submit([], None, sink)
    assert sink.calls == [("queued", 0, "waiting for the model to load")]
    engines[0].release.set()
    qtbot.waitUntil(lambda: sink.done, timeout=5000)
    assert started.done() and sink.text == "xxx"


def test_failed_load_reports_the_loader_message_and_refuses_requests(qtbot, run_async, qasync_loop):
    import asyncio
    bridge, engines = bridge_with(fail_start="model.gguf: not a GGUF file", hold=True)
    sink = Sink()
    future = asyncio.ensure_future(bridge.start(EngineSettings()))
    qtbot.waitUntil(lambda: bridge.state == "starting", timeout=2000)
    bridge.submit([], None, sink)  # sent while loading: fails with the load
    engines[0].release.set()
    qtbot.waitUntil(future.done, timeout=5000)
    assert isinstance(future.exception(), ModelError)
    assert bridge.state == "failed" and bridge.error == "model.gguf: not a GGUF file"
    assert sink.calls[-1] == ("failed", "No model is loaded: model.gguf: not a GGUF file")
    with pytest.raises(LanechatError, match="not a GGUF"):
        bridge.submit([], None, Sink())


def test_request_error_is_raised_to_the_caller(qtbot, run_async):
    bridge, _ = bridge_with(refuse="prompt of 9000 tokens does not fit")
    run_async(bridge.start(EngineSettings()))
    with pytest.raises(RequestError):
        bridge.submit([], None, Sink())
    assert bridge.busy == 0


def test_restart_ends_old_requests_and_ignores_their_late_events(qtbot, run_async):
    bridge, engines = bridge_with(n=100000, gap=0.001)
    run_async(bridge.start(EngineSettings()))
    old = Sink()
    bridge.submit([], None, old)
    qtbot.waitUntil(lambda: bool(old.text), timeout=5000)
    run_async(bridge.start(EngineSettings(parallel=2)))
    assert old.calls[-1] == ("finished", "cancelled")
    assert len(engines) == 2 and bridge.settings.parallel == 2
    new = Sink()
    bridge.submit([], None, new)  # gets request id 1 again, from the new engine
    qtbot.waitUntil(lambda: bool(new.text), timeout=5000)
    engines[0].callbacks[1](Finished(1, "eos", "stale", 1, 5, 1.0, 1.0))  # late, from the old engine
    qtbot.wait(100)
    assert not new.done and "stale" not in new.text



def test_abandon_delivers_nothing_more(qtbot, run_async):
    bridge, _ = bridge_with(n=100000, gap=0.001)
    run_async(bridge.start(EngineSettings()))
    sink = Sink()
    ticket = bridge.submit([], None, sink)
    qtbot.waitUntil(lambda: bool(sink.text), timeout=5000)
    bridge.abandon(ticket)
    n = len(sink.calls)
    qtbot.wait(200)
    assert len(sink.calls) == n and bridge.busy == 0


def test_a_broken_sink_does_not_stop_others(qtbot, run_async):
    bridge, _ = bridge_with(n=50)

    class Broken(Sink):
        def on_text(self, text, tokens):
            raise RuntimeError("tab bug")
    run_async(bridge.start(EngineSettings()))
    broken, fine = Broken(), Sink()
    bridge.submit([], None, broken)
    bridge.submit([], None, fine)
    qtbot.waitUntil(lambda: fine.done and broken.done, timeout=5000)
    assert fine.text == "x" * 50


@pytest.mark.slow
def test_real_engine_streams_on_numpy(qtbot, run_async, app_home, app_model):
    bridge = EngineBridge()
    s = EngineSettings(model=app_model, backend="numpy", parallel=2, context=512,
                       sampling=SamplingParams(max_tokens=16, temperature=0))
    run_async(bridge.start(s), timeout=120)
    assert bridge.info.backend == "numpy"
    sink = Sink()
    bridge.submit([{"role": "user", "content": "Hello"}], None, sink)
    qtbot.waitUntil(lambda: sink.done, timeout=60000)
    assert sink.calls[-1][0] == "finished" and sink.text
    run_async(bridge.stop())
    assert bridge.state == "stopped"


def test_activity_tells_reading_from_generating(qtbot, run_async):
    bridge, engines = bridge_with(n=100000, gap=0.001, reading=True)
    run_async(bridge.start(EngineSettings()))
    changes = []
    bridge.activity_changed.connect(lambda: changes.append(bridge.activity()))
    sink = Sink()
    bridge.submit([], None, sink)
    qtbot.waitUntil(lambda: ("started", 5) in sink.calls, timeout=5000)
    qtbot.waitUntil(lambda: bridge.activity() == {"waiting": 0, "reading": 1, "generating": 0}, timeout=2000)
    engines[0].read.set()  # the prompt is read: tokens follow
    qtbot.waitUntil(lambda: bridge.activity() == {"waiting": 0, "reading": 0, "generating": 1}, timeout=5000)
    assert changes and changes[-1]["generating"] == 1


def test_the_number_ahead_counts_only_requests_still_waiting(qtbot, run_async):
    bridge, engines = bridge_with(n=100000, gap=0.001, queue_first=True)
    run_async(bridge.start(EngineSettings()))
    sinks = [Sink() for _ in range(3)]
    tickets = [bridge.submit([], None, s) for s in sinks]
    qtbot.waitUntil(lambda: bool(sinks[0].text) and bridge.activity()["waiting"] == 2, timeout=5000)
    assert ("queued", 0, "waiting for a free stream") in sinks[1].calls
    assert sinks[2].calls[-1] == ("queued", 1, "waiting for a free stream")
    bridge.cancel(tickets[0])  # the first ends: the third now has nobody waiting ahead of it
    qtbot.waitUntil(lambda: bool(sinks[1].text), timeout=5000)
    assert ("queued", 0, "waiting for a free stream") in sinks[2].calls
    for t in tickets[1:]:
        bridge.cancel(t)
    qtbot.waitUntil(lambda: all(s.done for s in sinks), timeout=5000)


# --- thinking, cancelling a load, unloading while idle --------------------------------------------

def test_a_thinking_block_arrives_apart_with_its_own_count(qtbot, run_async):
    bridge, engines = bridge_with(n=50, think=20)
    run_async(bridge.start(EngineSettings()))
    sink = Sink()
    bridge.submit([{"role": "user", "content": "hi"}], None, sink, thinking=True)
    qtbot.waitUntil(lambda: sink.done, timeout=10000)
    reasoning = [c for c in sink.calls if c[0] == "reasoning"]
    assert "".join(c[1] for c in reasoning) == "r" * 20 and reasoning[-1][2] == 20
    assert sink.text == "x" * 30 and engines[0].thinking == {1: True}
    first_text = next(i for i, c in enumerate(sink.calls) if c[0] == "text")
    assert all(i < first_text for i, c in enumerate(sink.calls) if c[0] == "reasoning")


def test_cancel_start_stops_a_load(qtbot, run_async, qasync_loop):
    import asyncio
    bridge, engines = bridge_with(hold=True)
    future = asyncio.ensure_future(bridge.start(EngineSettings()))
    qtbot.waitUntil(lambda: bridge.state == "starting", timeout=2000)
    sink = Sink()
    bridge.submit([], None, sink)
    bridge.cancel_start()
    qtbot.waitUntil(future.done, timeout=5000)
    assert bridge.state == "failed" and bridge.error == "loading was cancelled"
    assert sink.calls[-1] == ("failed", "No model is loaded: loading was cancelled")


def test_an_unloaded_model_loads_again_for_the_next_message(qtbot, run_async):
    bridge, engines = bridge_with(n=3)
    run_async(bridge.start(EngineSettings()))
    assert bridge.ready_seconds is not None and bridge.ready_seconds >= 0
    run_async(bridge.unload())
    assert bridge.state == "unloaded" and bridge.info is None and len(engines) == 1
    sink = Sink()
    bridge.submit([], None, sink)
    qtbot.waitUntil(lambda: sink.done, timeout=5000)
    assert len(engines) == 2 and bridge.state == "ready" and sink.text == "xxx"
    queued = [c[2] for c in sink.calls if c[0] == "queued"]
    assert queued[0].startswith("loading the model again") and queued[-1].endswith("loading, 50%")


def test_unload_waits_for_requests_in_flight(qtbot, run_async):
    bridge, _ = bridge_with(n=100000, gap=0.001)
    run_async(bridge.start(EngineSettings()))
    sink = Sink()
    ticket = bridge.submit([], None, sink)
    run_async(bridge.unload())
    assert bridge.state == "ready"  # a reply is being written: nothing is unloaded
    bridge.cancel(ticket)
    qtbot.waitUntil(lambda: sink.done, timeout=5000)


@pytest.mark.slow
def test_a_conversation_resumes_from_its_snapshot_across_a_restart(qtbot, run_async, app_home, app_model, tmp_path):
    """The reply's KV state goes to `<base>.<fingerprint>.kv`; after an engine restart the next turn
    restores it and computes only the positions past it (the new turn)."""
    base = tmp_path / "snapshots" / "conv1"
    s = EngineSettings(model=app_model, backend="numpy", parallel=2, context=512, paging="all", page_tokens=16,
                       sampling=SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    chat = [{"role": "user", "content": "Hello there"}]
    bridge = EngineBridge()
    run_async(bridge.start(s), timeout=120)
    first = Sink()
    bridge.submit(chat, None, first, snapshot=base)
    qtbot.waitUntil(lambda: first.done, timeout=60000)
    path = base.with_name(f"conv1.{bridge.info.fingerprint}.kv")
    qtbot.waitUntil(path.is_file, timeout=30000)
    assert first.reused == 0
    run_async(bridge.stop())

    bridge = EngineBridge()
    run_async(bridge.start(s), timeout=120)
    engine = bridge.engine
    snap = snapshots.load(path, engine.runner.fingerprint, "bf16")
    later = chat + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
    ids = engine.runner.tokenizer.encode_chat(later)
    assert snap.continues(ids), "the template renders the reply as it was generated"
    second = Sink()
    bridge.submit(later, None, second, snapshot=base)
    qtbot.waitUntil(lambda: second.done, timeout=60000)
    started = next(c for c in second.calls if c[0] == "started")
    assert second.reused == snap.cache.n and started[1] == len(ids)  # computed: only len(ids) - n
    assert second.calls[-1][0] == "finished"
    run_async(bridge.stop())
