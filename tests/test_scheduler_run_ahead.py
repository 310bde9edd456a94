"""Run-ahead decode (Scheduler.run_ahead): the step after a steady decode step is queued on the tokens
the device chose before the host reads them. On the CPU the order of work is the same, so these tests
switch it on to check what it must keep: every token, event and finish as without it. The hybrid
model's cases run on the GPU too (marked `gpu`), where the end token's row is voided by the feed kernel."""
import numpy as np
import pytest
from test_scheduler import runner as scheduler_runner

from engine.engine import Runner, run_to_end
from engine.events import Failed, Finished, Token
from engine.ops import cuda_available
from engine.scheduler import Scheduler
from engine.settings import EngineSettings, SamplingParams

OK, WHY = cuda_available()
BACKENDS = ["numpy", pytest.param("cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(not OK, reason=WHY or "no GPU")])]


def runner(**kw) -> tuple[Runner, EngineSettings]:
    return scheduler_runner(**{"parallel": 4, **kw})


def prompts(n):
    return [[1] + [20 + (11 * i + j) % 200 for j in range(12 + 5 * i)] for i in range(n)]


def run(r: Runner, s: EngineSettings, params: list[SamplingParams], ahead: bool, fault=None, snapshots=False):
    """Every stream's tokens, events and finish, with run-ahead on or off; the forwards fed on the
    device's tokens. `fault(rows, fed)`: raise from a forward (after it ran)."""
    sched = Scheduler(s, r.plan(s), r.model, r.backend, r.tokenizer)
    sched.run_ahead = ahead
    fed = []

    def observe(rows):
        fed.append(rows.fed is not None)
        if fault is not None:
            fault(rows, fed)
    sched.after_forward = observe
    events = {i: [] for i in range(1, len(params) + 1)}
    seqs = [r.sequence(i, s, None, p, events[i].append, q, snapshot_at_end=snapshots)
            for (i, p), q in zip(enumerate(params, 1), prompts(len(params)))]
    done = run_to_end(sched, seqs)
    return {i: (q.tokens, events[i], done[i]) for i, q in zip(events, seqs)}, sum(fed), sched


def _stop_after(r, s, n: int) -> str:
    """A stop string that a greedy reply of the first prompt meets after about n tokens."""
    free = run_to_end(r.scheduler(s), [r.sequence(1, s, None, SamplingParams(temperature=0, max_tokens=40,
                                                                                ignore_eos=True), lambda e: None,
                                                   prompts(1)[0])])[1]
    return free.text[n:n + 3]


def same(ahead: dict, plain: dict) -> None:
    """The same tokens, token events and finish for every stream."""
    for i in plain:
        assert ahead[i][0] == plain[i][0]
        assert [(e.token_id, e.text, e.tokens) for e in ahead[i][1] if isinstance(e, Token)] == \
               [(e.token_id, e.text, e.tokens) for e in plain[i][1] if isinstance(e, Token)]
        a, p = ahead[i][2], plain[i][2]
        assert (a.reason, a.text, a.tokens) == (p.reason, p.text, p.tokens)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3.5"])
def test_run_ahead_keeps_every_token_event_and_finish(model):
    r, s = runner(model=f"synthetic:{model}")
    stop = _stop_after(r, s, 12)
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop]),  # stops mid-run
              SamplingParams(temperature=0, max_tokens=17, ignore_eos=True),  # a length limit between steps
              SamplingParams(temperature=1.0, top_k=40, seed=7, max_tokens=25, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)]
    plain, fed_plain, _ = run(r, s, params, ahead=False)
    ahead, fed, sched = run(r, s, params, ahead=True)
    assert fed_plain == 0 and fed > 20  # it did run ahead, most steps
    assert plain[1][2].reason == "stop"
    same(ahead, plain)
    assert not sched.busy


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hybrid_stream_ending_on_eos_keeps_the_state_it_ends_with(backend):
    """A step queued ahead feeds the EOS that ends a stream; its recurrent state must not take that row
    (the row is voided): the snapshot at the end and the prompt cache's stream end hold what the
    stream without run-ahead holds, bit for bit."""
    r, s = runner(model="synthetic:tiny-qwen3.5", backend=backend)
    free, _, _ = run(r, s, [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)], ahead=False)
    reply = free[1][0][len(prompts(1)[0]):]
    r.tokenizer.eos_ids = {next((t for i, t in enumerate(reply) if i >= 6 and t not in reply[:i]), reply[0])}
    params = [SamplingParams(temperature=0, max_tokens=30),  # ends on that token, the other stream decoding on
              SamplingParams(temperature=1.0, top_k=40, seed=9, max_tokens=30, ignore_eos=True)]
    plain, _, ps = run(r, s, params, ahead=False, snapshots=True)
    ahead, fed, sched = run(r, s, params, ahead=True, snapshots=True)
    assert plain[1][2].reason == "eos" and fed > 10
    same(ahead, plain)
    for i in plain:
        a, p = sched.snapshots[i].cache, ps.snapshots[i].cache
        assert a.n == p.n
        for ga, gp in zip(a.kv + a.state, p.kv + p.state):
            for x, y in zip(ga, gp):
                assert np.array_equal(x, y)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("streams", [1, 3])
def test_a_hybrid_step_queued_ahead_that_raises_puts_the_states_back(streams, backend):
    """The launch of a step queued ahead raises once, after the forward ran (states moved on): the
    streams' states come back from their checkpoints and every stream goes on as without it."""
    r, s = runner(model="synthetic:tiny-qwen3.5", backend=backend)
    params = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)] * streams
    plain, _, _ = run(r, s, params, ahead=False)
    raised = []

    def fault(rows, fed):
        if rows.fed is not None and sum(fed) == 6 and not raised:
            raised.append(1)
            raise ValueError("a step queued ahead went wrong")
    ahead, fed, sched = run(r, s, params, ahead=True, fault=fault)
    assert raised and fed > 10
    assert not any(isinstance(e, Failed) for i in ahead for e in ahead[i][1])
    same(ahead, plain)


def test_cancel_while_a_step_is_queued_ahead_frees_the_lane_and_keeps_a_prefix():
    r, s = runner()
    long = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    plain, _, _ = run(r, s, [long], ahead=False)
    sched = Scheduler(s, r.plan(s), r.model, r.backend, r.tokenizer)
    sched.run_ahead = True
    fed = []
    sched.after_forward = lambda rows: fed.append(rows.fed is not None)
    events = []
    seq = r.sequence(1, s, None, long, events.append, prompts(1)[0])
    sched.add(seq)
    for _ in range(12):
        sched.step()
    assert fed[-1]  # the last forward is a step queued ahead, its tokens not read
    sched.cancel(1)
    assert sched.lanes.pool.used == 0 and not sched.busy
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled"
    assert seq.tokens == plain[1][0][:len(seq.tokens)] and seq.generated > 5
