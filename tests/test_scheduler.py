"""Scheduler: admission order, cancel, stop strings, pool exhaustion that never corrupts a stream."""
import pytest

from engine.engine import Runner, run_to_end
from engine.errors import DeviceLostError, RequestError
from engine.events import Failed, Finished, Queued, Started, Token
from engine.settings import EngineSettings, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def runner(**kw) -> tuple[Runner, EngineSettings]:
    s = EngineSettings(**{**dict(model="synthetic:tiny-llama", backend="numpy", parallel=2, context=256,
                                 paging="all", page_tokens=16, prefill_chunk=16, memory_gib=1), **kw})
    return Runner(s, log=lambda m: None), s


def prompts(n):
    return [[1] + [20 + (7 * i + j) % 200 for j in range(10 + 9 * i)] for i in range(n)]


def test_requests_beyond_parallel_wait_in_order():
    r, s = runner(parallel=2)
    sched = r.scheduler(s)
    events = []
    seqs = [r.sequence(i, s, None, GREEDY, events.append, p) for i, p in enumerate(prompts(4), 1)]
    run_to_end(sched, seqs)
    started = [e.request_id for e in events if isinstance(e, Started)]
    assert started == [1, 2, 3, 4]
    assert {e.request_id for e in events if isinstance(e, Queued)} == {3, 4}
    assert all(len(q.tokens) == len(p) + 24 for q, p in zip(seqs, prompts(4)))


def test_cancel_frees_the_lane_at_once():
    r, s = runner()
    sched = r.scheduler(s)
    events = []
    seq = r.sequence(1, s, None, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), events.append,
                     prompts(1)[0])
    sched.add(seq)
    for _ in range(5):
        sched.step()
    assert sched.lanes.pool.used > 0
    sched.cancel(1)
    assert sched.lanes.pool.used == 0 and not sched.busy
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled"


def test_prompt_longer_than_context_is_refused_before_work():
    r, s = runner(context=64)
    with pytest.raises(RequestError, match="does not fit the context"):
        r.sequence(1, s, None, GREEDY, lambda e: None, list(range(3, 80)))


def test_stop_string_trims_and_ends():
    r, s = runner()
    free = run_to_end(r.scheduler(s), [r.sequence(1, s, None, GREEDY, lambda e: None, prompts(1)[0])])[1]
    stop = free.text[5:8]
    assert len(stop) == 3
    events = []
    seq = r.sequence(2, s, None, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]),
                     events.append, prompts(1)[0])
    done = run_to_end(r.scheduler(s), [seq])[2]
    assert done.reason == "stop" and done.text == free.text[: free.text.find(stop)]
    assert "".join(e.text for e in events if isinstance(e, Token)) == done.text


def test_pool_exhaustion_never_corrupts_a_stream():
    """A pool of one context for three streams: they wait or are paused, and greedy tokens match solo."""
    r, s = runner(parallel=3)
    solo = {i: run_to_end(r.scheduler(s), [r.sequence(i, s, None, GREEDY, lambda e: None, p)])[i]
            for i, p in enumerate(prompts(3), 1)}
    tight = EngineSettings(**{**s.to_dict(), "sampling": s.sampling, "memory_gib": 16 * s.page_tokens * 256 / 2**30})
    sched = r.scheduler(tight)
    assert sched.plan.pool_pages == 16  # exactly lane 0's reserve
    events = []
    seqs = [r.sequence(i, tight, None, GREEDY, events.append, p) for i, p in enumerate(prompts(3), 1)]
    done = run_to_end(sched, seqs)
    assert any(isinstance(e, Queued) and "pool" in e.reason for e in events)
    for i in solo:
        assert done[i].text == solo[i].text and done[i].tokens == 24
    assert sched.lanes.pool.used == 0


def test_a_failing_prompt_fails_its_stream_alone():
    r, s = runner(parallel=2)
    sched = r.scheduler(s)

    def poison(rows):
        if rows.prompt and 13 in rows.tokens.tolist():
            raise RuntimeError("poisoned prompt")

    sched.after_forward = poison
    events = []
    good = r.sequence(1, s, None, GREEDY, events.append, prompts(1)[0])
    bad = r.sequence(2, s, None, GREEDY, events.append, [1, 13, 14, 15])
    done = run_to_end(sched, [good, bad])
    assert done[1].tokens == 24
    failed = [e for e in events if isinstance(e, Failed)]
    assert [e.request_id for e in failed] == [2] and "poisoned prompt" in failed[0].message
    assert sched.lanes.pool.used == 0


def failing_stream(bad, after: int, batches: list):
    """A fault hook: every decode forward holding `bad`'s row raises once it has `after` tokens;
    `batches` collects the decode forwards' row counts."""
    def fault(rows):
        if not rows.prompt:
            batches.append(len(rows))
        if not rows.prompt and bad.lane is not None and bad.lane.index in rows.lanes.tolist() \
                and bad.generated >= after:
            raise ValueError(f"row of stream {bad.id} went wrong")
    return fault


@pytest.mark.parametrize("model", ["synthetic:tiny-llama", "synthetic:tiny-qwen3.5"])
def test_an_error_in_a_batched_decode_fails_only_its_stream(model):
    """The step raises after every row's state moved on: the rows' recurrent state is put back,
    they run again one by one, and the stream that raises alone fails; the others equal solo."""
    r, s = runner(model=model, parallel=4)
    solo = {i: run_to_end(r.scheduler(s), [r.sequence(i, s, None, GREEDY, lambda e: None, p)])[i]
            for i, p in enumerate(prompts(4), 1)}
    sched = r.scheduler(s)
    events = []
    seqs = [r.sequence(i, s, None, GREEDY, events.append, p) for i, p in enumerate(prompts(4), 1)]
    bad = seqs[2]
    batches = []
    sched.after_forward = failing_stream(bad, 5, batches)
    done = run_to_end(sched, seqs)
    failed = [e for e in events if isinstance(e, Failed)]
    assert [e.request_id for e in failed] == [3] and "stream 3 went wrong" in failed[0].message
    assert bad.generated == 5
    for i in (1, 2, 4):
        assert done[i].text == solo[i].text and done[i].tokens == 24
    assert max(batches) == 4  # the fault struck batched steps
    assert sched.lanes.pool.used == 0
    # a lane's state is copied aside when its stream first joins a batch, not before every step
    assert sched.checkpoints.copies == (4 if sched.cache.stateful else 0)


def test_a_device_fault_leaves_the_step_for_the_engine():
    r, s = runner(parallel=2)
    sched = r.scheduler(s)

    def lost(rows):
        if not rows.prompt:
            raise DeviceLostError("the device fell off the bus")

    sched.after_forward = lost
    for i, p in enumerate(prompts(2), 1):
        sched.add(r.sequence(i, s, None, GREEDY, lambda e: None, p))
    with pytest.raises(DeviceLostError, match="fell off"):
        for _ in range(10):
            sched.step()


def test_the_step_observer_sees_every_decode_step():
    r, s = runner(parallel=2)
    sched = r.scheduler(s)
    steps = []
    sched.step_observer = steps.append
    seqs = [r.sequence(i, s, None, GREEDY, lambda e: None, p) for i, p in enumerate(prompts(2), 1)]
    run_to_end(sched, seqs)
    # the first token of each stream comes from its prompt; the other 23 from decode steps, one a position
    seen = sorted(p for st in steps for p in st.positions)
    assert seen == sorted(p for q in seqs for p in range(q.prompt_len, q.prompt_len + 23))
    assert all(st.seconds > 0 for st in steps) and max(len(st.positions) for st in steps) == 2
